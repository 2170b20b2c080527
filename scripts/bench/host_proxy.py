"""A rank's host time per training step, measured on the CPU: where it goes, without a GPU.

At small micro-batches a low-rank model's step on an H200 is set by the host (Python, FSDP2's hooks,
AOTAutograd's wrappers, autograd, the optimizer), and most of that cost is per block and per parameter,
not per FLOP. This script runs torchtitan's loop as rank 0 of an ``--ngpu`` layout on the fake backend
(``torchtitan_ext.runtime.emulate``, as ``e2e --emulate`` does) with a stand-in of ``--flavor``: the same blocks,
heads, parameters per block and parallel layout, but ``--dim`` wide, so that the CPU's kernels cost
little and the step's time is mostly the host's. The last step is traced and its host time broken
down by kind (``traces.trace_host``, the table ``e2e --profile`` prints for GPU runs).

What it is for: trying a host-side change (wrapping, hooks, optimizer, clipping) in minutes on a laptop
before spending GPU time. Its kinds track a GPU run's (7B tp 4 × FSDP 2 one unit, b 1: FSDP2 18.6 ms
here, ``c489d66:docs/results/host_proxy_7b_tp4_dp2_cpu.md``, vs 24–34 ms traced on an H100 host; compiled-region
wrappers 14.0 vs 17–31; AccumulateGrad 5.6 vs 6–13, ``c489d66:docs/results/7b_tp4_host_floor_repeats_emulated.md``),
except where the CPU does real work:
"compiled graphs" holds the CPU kernels' compute (on a GPU: launches or graph replays), and foreach
ops run per tensor. CUDA graphs cannot be tried here.

    python -m scripts.bench.host_proxy --flavor 7B --ngpu 8 --variants cola_1b_compile \
        --extra="--parallelism.tensor_parallel_degree 4 --parallelism.data_parallel_shard_degree 2 \
                 --boost.fsdp_blocks_per_unit 32" --out docs/results/host_proxy_7b_tp4_dp2_cpu
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

from scripts.bench.e2e import ANSI, ROOT, emulate_env, variant
from scripts.bench.results import env_info, print_table, write_results
from scripts.bench.traces import trace_host, trace_step_overrides

STAND_IN = "host_proxy"  # the stand-in flavor's name, registered in the child process only
STEP_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d) .* step: +(\d+) ")


def stand_in(flavor: str, dim: int, blocks: int | None = None):
    """``flavor``'s args at width ``dim`` (ffn 2·dim, ranks dim/4 where low-rank), its block and head
    counts unless ``blocks`` is given."""
    from boost_titan.models import FLAVORS

    args = FLAVORS[flavor]
    low_rank = args.attn_rank > 0
    if dim % args.n_heads:
        raise SystemExit(f"--dim {dim} must be divisible by {flavor}'s {args.n_heads} heads")
    return args.replace(dim=dim, ffn_dim=2 * dim, n_layers=blocks or args.n_layers,
                        attn_rank=dim // 4 if low_rank else 0, mlp_rank=dim // 4 if low_rank else 0)


def step_seconds(log: str) -> dict[int, float]:
    """Each logged step's wall time from the log lines' millisecond timestamps (step → seconds since the
    step before it); the CPU's tokens/s are too coarse for this."""
    stamps = {int(m[4]): int(m[0]) * 3600 + int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1000 for m in STEP_TIME.findall(log)}
    return {s: (stamps[s] - stamps[s - 1]) % 86400 for s in stamps if s - 1 in stamps}


def run(name: str, flavor: str, dim: int, blocks: int | None, ngpu: int, steps: int, skip: int, extra: list[str],
        out_dir: Path, seq: int = 64, batch: int = 1) -> tuple[dict, list[dict]]:
    """One variant: (its row: median step time of the untraced steps after ``skip``, the traced step's host
    time; its host table)."""
    config, overrides = variant(name)
    if name.startswith("fullrank") and not flavor.endswith("_fullrank"):
        flavor += "_fullrank"  # the dense twin's variants run the flavor's twin
    dump = out_dir / name.replace("+", ".")
    cmd = [sys.executable, "-m", "scripts.bench.host_proxy", "--child", flavor, str(dim), str(blocks or 0), "--",
           "--job.config_file", config, *overrides, "--model.flavor", STAND_IN, "--comm.mode", "fake_backend",
           "--training.steps", str(steps), "--metrics.log_freq", "1", "--training.seq_len", str(seq),
           "--training.local_batch_size", str(batch), "--job.dump_folder", str(dump),
           *trace_step_overrides(steps), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=emulate_env(ngpu), capture_output=True, text=True)
    log = ANSI.sub("", proc.stdout + proc.stderr)
    (out_dir / f"{dump.name}.log").write_text(log)
    times = step_seconds(log)
    timed = [t for s, t in times.items() if skip < s <= steps - 2]  # the last two: profiler warm-up and trace
    traces = sorted(dump.glob("traces/**/*.json"))
    if proc.returncode or not timed or not traces:
        raise SystemExit(f"[{name}] failed (rc={proc.returncode}); log tail:\n{log[-3000:]}")
    host = trace_host(traces[-1])
    for r in host:
        r["variant"] = name
    row = {"variant": name, "step_ms": 1000 * statistics.median(timed), "steps_timed": len(timed),
           "traced_host_ms": host[-1]["host_ms"], **{_short(r["kind"]): r["host_ms"] for r in host[:-1]},
           "command": " ".join(cmd[3:])}
    return row, host


def _short(kind: str) -> str:
    return kind.split(" (")[0]


def child(flavor: str, dim: str, blocks: str, argv: list[str]) -> None:
    """Register the stand-in flavor, then run torchtitan's loop (the emulating trainer) on ``argv``."""
    sys.argv = [sys.argv[0], *argv]  # before torchtitan is imported: its parser's default is read at import
    from boost_titan.models import FLAVORS

    FLAVORS[STAND_IN] = stand_in(flavor, int(dim), int(blocks) or None)
    from torchtitan_ext.runtime.emulate import EmulatedTrainer
    from torchtitan_ext.runtime.train import main_then_exit

    main_then_exit(EmulatedTrainer)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        flavor, dim, blocks, sep, *argv = sys.argv[2:]
        child(flavor, dim, blocks, argv)
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="7B", help="whose blocks, heads and parameters per block to keep")
    p.add_argument("--dim", type=int, default=128, help="the stand-in's width (divisible by the heads)")
    p.add_argument("--blocks", type=int, default=None, help="fewer blocks than the flavor's (tests)")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence (the host's work does not grow with it)")
    p.add_argument("--batch", type=int, default=1, help="local batch")
    p.add_argument("--variants", default="cola_1b_compile", help="e2e's variant names (config + suffixes)")
    p.add_argument("--ngpu", type=int, default=8, help="the layout's ranks (this process plays rank 0)")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--skip", type=int, default=4, help="warm-up steps (compilation) left out of the median")
    p.add_argument("--extra", default="", help='torchtitan overrides for every run: --extra="--a.b c"')
    p.add_argument("--out", default="docs/results/host_proxy_cpu")
    a = p.parse_args()
    if a.steps < a.skip + 3:
        raise SystemExit(f"--steps {a.steps} leaves no timed step after --skip {a.skip} and the two traced ones")
    out_dir = Path(a.out + "_logs")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, hosts = [], []
    for name in a.variants.split(","):
        row, host = run(name, a.flavor, a.dim, a.blocks, a.ngpu, a.steps, a.skip, a.extra.split(), out_dir,
                       a.seq, a.batch)
        rows.append(row)
        hosts += host
    cols = ["variant", "step_ms", "traced_host_ms",
            *[k for k in rows[0] if k not in ("variant", "step_ms", "steps_timed", "traced_host_ms", "command")]]
    host_cols = ["variant", "kind", "host_ms", "events", "share_pct"]
    write_results(a.out, rows, env_info("cpu"), f"Host time per step on the CPU ({a.flavor} stand-in, dim {a.dim})",
                  columns=cols, sections=[("Host time of the traced step by kind", hosts, host_cols)],
                  notes=f"EMULATED on the CPU: rank 0 of {a.ngpu} ranks on the fake backend, {a.flavor}'s blocks and "
                        f"heads at width {a.dim}, local batch {a.batch} × seq {a.seq}. step_ms: median of steps "
                        f"{a.skip + 1}..{a.steps - 2} (log timestamps); the other columns: the traced last step's host "
                        "time by kind (ms), kernels' CPU compute included under compiled graphs.")
    print_table(hosts)
    print_table(rows, cols)


if __name__ == "__main__":
    main()
