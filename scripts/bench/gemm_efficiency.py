"""Per-rank GEMM efficiency of one decoder layer under three TP strategies (BOOST Fig. 6 on one GPU).

Strategies (docs/design.md; m = b·s, per-rank shard shapes, no communication), as the model runs them
(the shapes are recorded from the real layer under each plan, ``boost_titan.planner.trace``):
  fullrank  Megatron: QKV colwise [m,d]x[d,3d/t], O rowwise [m,d/t]x[d/t,d];
            MLP [m,d]x[d,2f/t], [m,f/t]x[f/t,d].
  vanilla   CoLA with A colwise / B rowwise on r: A_qkv [m,d]x[d,3r/t], B_qkv one bmm 3x[m,r/t]x[r/t,d],
            A_o [m,d]x[d,r/t], B_o [m,r/t]x[r/t,d]; A_gu [m,d]x[d,2r/t], B_gu one bmm 2x[m,r/t]x[r/t,f],
            A_dn [m,f]x[f,r/t], B_dn [m,r/t]x[r/t,d].
  btp       bottleneck-aware: A_qkv rowwise [m,d/t]x[d/t,3r], B_qkv one bmm 3x[m,r]x[r,d/t],
            A_o [m,d/t]x[d/t,r], B_o [m,r]x[r,d/t]; A_gu [m,d/t]x[d/t,2r], B_gu one bmm 2x[m,r]x[r,f/t],
            A_dn [m,f/t]x[f/t,r], B_dn [m,r]x[r,d/t].
Operands are laid out as in a model: activations [m,k] row-major, weights [out,in] (y = x @ W.T),
batched B weights [c,out,r] with inputs [c,m,r]. Forward y = x W^T, backward dX = dY W, dW = dY^T X.

GPU:  python -m scripts.bench.gemm_efficiency            (full sweep, bf16, CUDA events + graphs)
CPU:  python -m scripts.bench.gemm_efficiency --device cpu --sizes tiny --tp 2 --batch 1
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch

from boost_titan.models import TransformerArgs
from scripts.bench.layer_gemms import layer_gemms as trace_layer_gemms
from scripts.bench.results import env_info, print_table, pyplot, write_results
from scripts.bench.timing import H200_DATASHEET_BF16_TFLOPS, PeakGemm, interleaved_time_ms

SIZES = {"tiny": (256, 512), "1B": (2048, 5472), "3B": (3072, 8192), "7B": (4096, 11008), "13B": (5120, 13824)}  # d, f
STRATEGIES = ("fullrank", "vanilla", "btp")
SHORT = {"fullrank": "FR", "vanilla": "Van", "btp": "BTP"}
PARTS = ("attn", "mlp")


@dataclass
class Gemm:
    """One linear's GEMMs: y[c,m,n] = x[c,m,k] @ w[c,n,k]^T (c = 1 is a plain 2-D mm)."""

    name: str
    c: int
    k: int  # in features
    n: int  # out features

    def flops(self, m: int) -> int:  # forward; backward (dX + dW) is twice this
        return 2 * self.c * m * self.k * self.n

    def alloc(self, m: int, device, dtype) -> None:
        lead = (self.c,) if self.c > 1 else ()
        mk = lambda *s: torch.randn(*lead, *s, device=device, dtype=dtype)  # noqa: E731
        self.x, self.w, self.dy = mk(m, self.k), mk(self.n, self.k), mk(m, self.n)
        self.y, self.dx, self.dw = mk(m, self.n), mk(m, self.k), mk(self.n, self.k)
        self.mm = torch.bmm if self.c > 1 else torch.mm

    def fwd(self) -> None:
        self.mm(self.x, self.w.transpose(-1, -2), out=self.y)

    def bwd(self) -> None:
        self.mm(self.dy, self.w, out=self.dx)  # dX = dY W
        self.mm(self.dy.transpose(-1, -2), self.x, out=self.dw)  # dW = dY^T X


def layer_gemms(strategy: str, d: int, f: int, r: int, t: int) -> dict[str, list[Gemm]]:
    """Per-rank GEMMs of one MHA decoder layer, by part, as the model runs them under ``strategy``
    (recorded from the real layer on the meta device: ``boost_titan.planner.trace``)."""
    for name, v in (("d", d), ("f", f), ("r", r)):
        if v % t:
            raise ValueError(f"{name}={v} is not divisible by tp={t}")
    rank = 0 if strategy == "fullrank" else r
    args = TransformerArgs(dim=d, n_layers=1, n_heads=max(t, d // 64), ffn_dim=f, vocab_size=8 * t,
                           attn_rank=rank, mlp_rank=rank, swiglu=strategy == "fullrank")
    parts: dict[str, list[Gemm]] = {p: [] for p in PARTS}
    for g in trace_layer_gemms(strategy, args, t, tokens=t):  # shapes per token count: m is set by the caller
        parts[g.part].append(Gemm(g.name, g.c, g.k, g.n))
    return parts


def part_fns(gemms: list[Gemm], m: int, device, dtype) -> tuple[callable, callable, int]:
    """(forward, backward, FLOPs) of one part: its GEMMs' operands allocated, the calls not yet run."""
    for g in gemms:
        g.alloc(m, device, dtype)

    def fwd():
        for g in gemms:
            g.fwd()

    def bwd():
        for g in reversed(gemms):
            g.bwd()

    return fwd, bwd, 3 * sum(g.flops(m) for g in gemms)


def time_group(d: int, f: int, r: int, t: int, m: int, args, device, dtype) -> tuple[dict, float]:
    """{(strategy, part): {flops, fwd_ms, bwd_ms}} for one (size, t, b), and the peak (TFLOP/s)
    of the reference 8192³ GEMM timed in the same interleaved rounds (same clocks and temperature)."""
    fns, flops, gemms = {}, {}, []
    for strat in STRATEGIES:
        for part, gs in layer_gemms(strat, d, f, r, t).items():
            fwd, bwd, flops[(strat, part)] = part_fns(gs, m, device, dtype)
            fns[(strat, part, "fwd")], fns[(strat, part, "bwd")] = fwd, bwd
            gemms += gs
    fns["peak"] = peak = PeakGemm(device)
    ms = interleaved_time_ms(fns, warmup=args.warmup, repeats=args.repeats, rounds=args.rounds,
                             use_graph=args.graph, device=device)
    for g in gemms:  # free operands before the next configuration
        del g.x, g.w, g.dy, g.y, g.dx, g.dw
    return {key: {"flops": fl, "fwd_ms": ms[(*key, "fwd")], "bwd_ms": ms[(*key, "bwd")]}
            for key, fl in flops.items()}, peak.tflops(ms.pop("peak"))


def make_row(strategy, size, t, b, m, part, flops, fwd_ms, bwd_ms, peak, datasheet) -> dict:
    ms = fwd_ms + bwd_ms
    tflops = flops / (ms * 1e-3) / 1e12
    return {"strategy": strategy, "size": size, "t": t, "b": b, "m": m, "part": part,
            "gflop": flops / 1e9, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "time_ms": ms,
            "tflops": tflops, "peak_tflops": peak, "hfu_meas_pct": 100 * tflops / peak,
            "hfu_datasheet_pct": 100 * tflops / datasheet if datasheet else None}


def pivot(rows: list[dict], key: str) -> list[dict]:
    """One row per (size, t, b): `key` of each strategy x part, plus layer-time speedups of BTP."""
    out: dict[tuple, dict] = {}
    for r in rows:
        p = out.setdefault((r["size"], r["t"], r["b"]), {"size": r["size"], "t": r["t"], "b": r["b"]})
        p[f"{SHORT[r['strategy']]} {r['part']}"] = r[key]
        p[f"_{r['strategy']}_{r['part']}_ms"] = r["time_ms"]
    cols = [f"{SHORT[s]} {p}" for s in STRATEGIES for p in (*PARTS, "layer")]
    res = []
    for p in out.values():
        row = {k: p.get(k) for k in ("size", "t", "b", *cols)}
        btp = p.get("_btp_layer_ms")
        for other, label in (("vanilla", "Van/BTP time"), ("fullrank", "FR/BTP time")):
            o = p.get(f"_{other}_layer_ms")
            row[label] = o / btp if (o and btp) else None
        res.append(row)
    return res


def plot(rows: list[dict], sizes: list[str], path: str) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    parts = (*PARTS, "layer")
    fig, axes = plt.subplots(len(parts), len(sizes), figsize=(5.5 * len(sizes), 3.2 * len(parts)),
                             squeeze=False, sharey=True)
    for j, size in enumerate(sizes):
        for i, part in enumerate(parts):
            ax = axes[i][j]
            sel = [r for r in rows if r["size"] == size and r["part"] == part]
            cats = sorted({(r["t"], r["b"]) for r in sel})
            for k, strat in enumerate(STRATEGIES):
                hfu = {(r["t"], r["b"]): r["hfu_meas_pct"] for r in sel if r["strategy"] == strat}
                xs = [x + (k - 1) * 0.27 for x in range(len(cats))]
                ax.bar(xs, [hfu.get(c, 0) for c in cats], width=0.27, label=SHORT[strat])
            ax.set_xticks(range(len(cats)), [f"t{t}\nb{b}" for t, b in cats], fontsize=7)
            ax.set_title(f"{size} {part}", fontsize=9)
            ax.set_ylim(0, 105)
            if j == 0:
                ax.set_ylabel("% of measured bf16 peak", fontsize=8)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Per-rank GEMM HFU (fwd + dX + dW), one decoder layer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda f: lambda s: [f(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--sizes", type=csv(str), default=["3B", "7B", "13B"], help=f"of {list(SIZES)}")
    ap.add_argument("--tp", type=csv(int), default=[2, 4, 8])
    ap.add_argument("--batch", type=csv(int), default=[1, 2, 4, 8])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--rank-ratio", type=float, default=0.25, help="r = ratio * d")
    ap.add_argument("--repeats", type=int, default=10, help="timed replays per function per round")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds over all strategies' parts + the peak")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default="docs/results/gemm_efficiency")
    ap.add_argument("--quick", action="store_true", help="7B (tiny on CPU), tp 4, batch 1,4")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-graph", dest="graph", action="store_false",
                    help="time eager launches instead of CUDA-graph replay")
    ap.add_argument("--datasheet-tflops", type=float, default=H200_DATASHEET_BF16_TFLOPS)
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.quick:
        args.sizes, args.tp, args.batch = (["tiny"] if device.type == "cpu" else ["7B"]), [4], [1, 4]
    if device.type == "cpu":
        args.graph, dtype, datasheet = False, torch.float32, None
    else:
        dtype, datasheet = torch.bfloat16, args.datasheet_tflops
    for s in args.sizes:
        if s not in SIZES:
            ap.error(f"unknown size {s!r}; choose from {list(SIZES)}")
    torch.manual_seed(0)

    meta = env_info(device)
    rows: list[dict] = []
    peaks: list[float] = []  # one per (size, t, b) group, timed in that group's rounds
    for size in args.sizes:
        d, f = SIZES[size]
        r = int(d * args.rank_ratio)
        for t in args.tp:
            for b in args.batch:
                m = b * args.seq
                times, peak = time_group(d, f, r, t, m, args, device, dtype)
                peaks.append(peak)
                print(f"[{meta['device']}] {size} t{t} b{b}: matmul peak {peak:.4g} TFLOP/s ({dtype})", flush=True)
                for strat in STRATEGIES:
                    parts = {p: v for (s_, p), v in times.items() if s_ == strat}
                    parts["layer"] = {k: sum(p[k] for p in parts.values()) for k in parts["attn"]}
                    for p, v in parts.items():
                        rows.append(make_row(strat, size, t, b, m, p, v["flops"], v["fwd_ms"],
                                             v["bwd_ms"], peak, datasheet))
                    lay = rows[-1]
                    print(f"  {size:>4} t{t} b{b} {strat:>8}: layer {lay['time_ms']:8.3f} ms "
                          f"{lay['tflops']:6.1f} TF/s  {lay['hfu_meas_pct']:5.1f}%", flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    peak_med = statistics.median(peaks)

    meta.update({
        "dtype": str(dtype).replace("torch.", ""), "seq": args.seq, "rank_ratio": args.rank_ratio,
        "sizes": {s: {"d": SIZES[s][0], "f": SIZES[s][1], "r": int(SIZES[s][0] * args.rank_ratio)}
                  for s in args.sizes},
        "tp": args.tp, "batch": args.batch, "warmup": args.warmup, "repeats": args.repeats, "rounds": args.rounds,
        "timing": (("CUDA events, CUDA-graph replay" if args.graph else "CUDA events, eager")
                   if device.type == "cuda" else "time.perf_counter")
        + "; every strategy's parts and the peak GEMM of a (size, t, b) group in interleaved rounds, medians",
        "measured_peak_tflops": {"median": round(peak_med, 1), "min": round(min(peaks), 1),
                                 "max": round(max(peaks), 1), "per_group": [round(p, 1) for p in peaks]},
        "peak_gemm": ("8192^3 bf16" if device.type == "cuda" else "256^3 fp32")
        + " mm timed in each (size, t, b) group's rounds; rows use their group's peak",
        "datasheet_tflops": datasheet,
    })
    notes = ("Per-rank GEMMs only (no communication, no attention core, norms or activations). "
             "Each part is timed as fwd (all its forward GEMMs) + bwd (dX and dW of each GEMM), "
             "medians of `repeats` after `warmup`; `layer` = attn + mlp. FLOPs = 6·m·k·n per linear "
             "(×c for batched B). HFU = achieved TFLOP/s / measured peak (`hfu_meas_pct`, the peak "
             "`peak_tflops` timed in the row's (size, t, b) group) and / datasheet "
             "(`hfu_datasheet_pct`). All strategies of one (size, t, b) and the peak GEMM are timed in "
             "interleaved rounds, so clock drift falls on all alike. Pivot columns `Van/BTP time` and `FR/BTP time` are "
             "layer-time ratios (>1: BTP faster; FR does ~2.5× the FLOPs of CoLA at r = d/4).")
    summary = pivot(rows, "hfu_meas_pct")
    sections = [("HFU, % of measured peak", summary, None)]
    if datasheet:
        sections.append(("HFU, % of datasheet peak", pivot(rows, "hfu_datasheet_pct"), None))
    title = "Per-rank GEMM efficiency of one decoder layer: fullrank vs vanilla CoLA TP vs BTP"
    json_path, md_path = write_results(args.out, rows, meta, title, sections=sections, notes=notes)
    png = plot(rows, args.sizes, args.out + ".png")
    print(f"wrote {json_path}, {md_path}" + (f", {png}" if png else ""))
    print(f"\nHFU, % of the measured peak (median {peak_med:.4g}, range {min(peaks):.4g}-{max(peaks):.4g}"
          f" TFLOP/s), fwd+dX+dW, {meta['dtype']}, s={args.seq}:")
    short_cols = ["size", "t", "b", *(f"{SHORT[s]} {p}" for s in STRATEGIES for p in PARTS),
                  "Van/BTP time", "FR/BTP time"]
    print_table(summary, short_cols)


if __name__ == "__main__":
    main()
