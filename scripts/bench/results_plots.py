"""The results page's figures, drawn from the result files themselves (no GPU; matplotlib).

    python -m scripts.bench.results_plots        # → docs/results/*.png and docs/btp_layouts.png

* ``1b_pair_and_batches_h200.png``: tokens/s of CoLA-1B and its dense twin at local batch 4, 8, 16, 20
  (``1b_pair_h200.json``, ``1b_batch_sweep_h200.json``, ``1b_largest_batch_h200.json``; measured);
* ``fig5_speedups_h200.png``: BTP's step-time ratio over full rank and vanilla TP for BOOST's Fig. 5
  rows, next to the paper's A100 ratios (``fig5_*_emulated_h200.json``; emulated + predicted);
* ``docs/btp_layouts.png``: what each tensor-parallel strategy keeps on a rank and which collective
  a CoLA projection issues (a schematic, from ``docs/design.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

from scripts.bench.results import pyplot

RESULTS = Path("docs/results")


def _rows(name: str) -> list[dict]:
    return json.loads((RESULTS / f"{name}.json").read_text())["rows"]


def pair_and_batches(plt) -> Path:
    by = {}  # (family, batch) -> tokens/s, the later files (larger batches, memory_budget) where they exist
    for name in ("1b_pair_h200", "1b_batch_sweep_h200", "1b_largest_batch_h200"):
        for r in _rows(name):
            v = r["variant"]
            family = "CoLA" if v.startswith("cola") else "dense twin"
            last = v.rsplit("+", 1)[-1]
            batch = int(last[1:]) if last[:1] == "b" and last[1:].isdigit() else 4
            budget = "+mb90" in v
            if batch == 4 and budget:
                continue  # the b 4 rows without recomputation are the headline
            by[family, batch] = r["tokens_per_s"] / 1e3
    batches = sorted({b for _, b in by})
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    width = 0.38
    for i, family in enumerate(("CoLA", "dense twin")):
        xs = [j + (i - 0.5) * width for j, b in enumerate(batches) if (family, b) in by]
        ys = [by[family, b] for b in batches if (family, b) in by]
        bars = ax.bar(xs, ys, width, label=family, color=("#2a7ab9", "#b0b0b0")[i])
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(batches)), [f"b {b}" + (" (mem. budget 0.9)" if b > 8 else "") for b in batches],
                  fontsize=8)
    ax.set_ylabel("thousand tokens/s (one H200)")
    ax.set_title("1B, tp 1, compiled bf16, seq 4096 (measured)", fontsize=10)
    ax.set_ylim(0, 120)
    ax.legend(frameon=False, loc="upper left", ncols=2)
    out = RESULTS / "1b_pair_and_batches_h200.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def fig5_speedups(plt) -> Path:
    labels, ours, boost = [], [], []
    for name in ("fig5_7b_3b_emulated_h200", "fig5_13b_pp2_emulated_h200"):
        sections = json.loads((RESULTS / f"{name}.json").read_text())["sections"]
        for rows in sections.values():
            for r in rows:
                if "btp_vs_fullrank" not in r:
                    continue
                paper = [float(x.strip().rstrip("x×")) for x in r["boost_vs_fr_va"].split("/")]
                labels.append(f"{r['flavor']} {r['layout'].replace(' x pp 1', '')}")
                ours.append((r["btp_vs_fullrank"], r["btp_vs_vanilla"]))
                boost.append(paper)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), sharey=True)
    for k, (ax, against) in enumerate(zip(axes, ("full rank (Megatron + SP)", "vanilla TP"))):
        xs = range(len(labels))
        b1 = ax.bar([x - 0.2 for x in xs], [b[k] for b in boost], 0.4, label="BOOST paper (A100)", color="#b0b0b0")
        b2 = ax.bar([x + 0.2 for x in xs], [o[k] for o in ours], 0.4, label="boost_titan (H200)", color="#2a7ab9")
        ax.bar_label(b1, fmt="%.2f", fontsize=7)
        ax.bar_label(b2, fmt="%.2f", fontsize=7)
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_title(f"BTP speed-up over {against}", fontsize=9)
        ax.axhline(1, color="black", lw=0.5)
    axes[0].set_ylabel("step-time ratio")
    axes[0].legend(frameon=False, fontsize=7, loc="upper left")
    fig.suptitle("BOOST Fig. 5 rows: emulated compute + predicted communication", fontsize=10)
    out = RESULTS / "fig5_speedups_h200.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def btp_layouts(plt) -> Path:
    """One CoLA projection y = B σ(A x) on rank i of t, per strategy: the shard each operand keeps and
    the collective that makes the result correct."""
    rows = [
        ("full rank, Megatron + SP\n(dense: qkv → o, gate|up → down)", "x: [b, s/t, d]", "all-gather x",
         "W_col: [d, f/t]", "—", "W_row: [f/t, d]", "reduce-scatter y → [b, s/t, d]",
         "all-gather + reduce-scatter of\n[b, s, d] per column/row pair"),
        ("vanilla TP\n(Megatron on A and B)", "x: [b, s, d] (whole)", "—", "A: [d, r/t]", "—",
         "B: [r/t, d]", "all-reduce y: [b, s, d]", "1 all-reduce of [b, s, d]\nper projection"),
        ("BTP\n(bottleneck-aware)", "x: [b, s, d/t]", "—", "A: [d/t, r]", "all-reduce A x: [b, s, r]\n(+ norm statistic)",
         "B: [r, d/t]", "— (y stays\n[b, s, d/t])", "1 all-reduce of [b, s, r]\nper projection, r ≈ d/4"),
    ]
    fig, ax = plt.subplots(figsize=(13, 3.6))
    ax.axis("off")
    cols = ["strategy", "input on a rank", "before A", "first factor", "bottleneck", "second factor", "after B",
            "communication"]
    widths = [max(len(line) for cell in col for line in cell.split("\n")) for col in zip(cols, *rows)]
    table = ax.table(cellText=[list(r) for r in rows], colLabels=cols, loc="center", cellLoc="center",
                     colWidths=[w / sum(widths) for w in widths])
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 3.0)
    for (row, _), cell in table.get_celld().items():
        if row == 0:
            cell.set_facecolor("#dde7f0")
        if row == 3:
            cell.set_facecolor("#e6f2e0")
    ax.set_title("One CoLA projection y = B σ(A x) on rank i of t (d model width, r rank, b·s tokens)", fontsize=10)
    out = Path("docs/btp_layouts.png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def main() -> None:
    plt = pyplot()
    if plt is None:
        raise SystemExit("matplotlib is needed: pip install matplotlib")
    for draw in (pair_and_batches, fig5_speedups, btp_layouts):
        print(draw(plt))


if __name__ == "__main__":
    main()
