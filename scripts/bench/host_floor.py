"""The host's time per block, per layout kind and tp: the planner's ``host_per_block_s`` (EMULATED).

At a small local batch a low-rank model's step is set by the host (Python, FSDP2's hooks, dispatch,
launches), whose work grows with the blocks a rank runs and the passes over them, not with the
tokens. This script measures that floor where it is the whole step: rank 0 of each layout on one GPU
through torchtitan's fake backend (``torchtitan_ext.runtime.emulate``: real kernels at the rank's
shapes, collectives free), at a short sequence so the GPU's work is a small share of the step. A row
is trustworthy when ``host_bound_pct`` is high (the GPU idles most of the step); the last step is
traced for ``gpu_busy_s``.

Kinds (the planner's ``host_seconds``):
- ``one_rank``: dp 1, the 1-rank mixed-precision wrapper;
- ``fsdp``: FSDP over 2 ranks, one unit per block (torchtitan's default);
- ``fsdp_one_unit``: FSDP over 2 ranks, the whole model one unit (``[boost] fsdp_blocks_per_unit``);
- ``pipeline``: pp 2, dp 1, 1F1B over m = 2 and m = 4 microbatches of one sequence: rank 0 plays the
  first stage inside the real schedule; the host time per block and pass is the slope between the two
  (the step's fixed part, the optimizer, drops out);
- ``step_graph``: ``[boost] step_cudagraph`` with FSDP over 2 ranks: its host time is per step
  (``step_s - gpu_busy_s``), not per block.

``host_per_block_s`` = step_s / (the rank's blocks × passes): the step's fixed part (optimizer,
clipping, embedding, loss) is spread over the blocks, as the planner charges it.

    python -m scripts.bench.host_floor --out docs/results/host_floor_emulated
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from boost_titan.models import FLAVORS
from scripts.bench.e2e import ROOT, run_train
from scripts.bench.results import env_info, print_table, write_results
from scripts.bench.traces import step_trace, trace_buckets, trace_host, trace_step_overrides

CONFIG = "train_configs/cola_1b_h200.toml"  # bf16, synthetic tokens, V = 32000
KINDS = {  # kind: (dp, pp, microbatches, extra overrides); measured in this order
    "fsdp": (2, 1, (1,), []),
    "one_rank": (1, 1, (1,), []),
    "pipeline": (1, 2, (2, 4), ["--parallelism.pipeline_parallel_microbatch_size", "1"]),
    "fsdp_one_unit": (2, 1, (1,), ["--boost.fsdp_blocks_per_unit", "{blocks}"]),
    "step_graph": (2, 1, (1,), ["--boost.step_cudagraph"]),
}
COLUMNS = ["flavor", "kind", "tp", "dp", "pp", "passes", "blocks", "step_s", "gpu_busy_s", "host_bound_pct",
           "host_per_block_s", "host_s", "peak_mem_gib"]


def specs(flavor: str, tps: list[int], kinds: list[str]) -> list[dict]:
    return [{"flavor": flavor, "kind": kind, "tp": tp, "dp": KINDS[kind][0], "pp": KINDS[kind][1], "passes": m}
            for kind in kinds for tp in tps for m in KINDS[kind][2]]


def run_name(spec: dict) -> str:
    return f"{spec['flavor']}_{spec['kind']}_tp{spec['tp']}_m{spec['passes']}"


def measure(spec: dict, a, log_dir: Path) -> dict:
    """One emulated run of ``spec``: median step of steps ``skip+1 .. steps-2`` (the last two are the
    profiler's warm-up and traced step) and the traced step's GPU-busy time."""
    args = FLAVORS[spec["flavor"]]
    blocks = args.n_layers // spec["pp"]
    name = run_name(spec)
    dump = ROOT / "outputs" / "host_floor" / name
    shutil.rmtree(dump / "traces", ignore_errors=True)  # never read an earlier run's trace
    extra = [x.format(blocks=args.n_layers) for x in KINDS[spec["kind"]][3]]
    overrides = ["--model.flavor", spec["flavor"], "--parallelism.tensor_parallel_degree", str(spec["tp"]),
                 "--parallelism.data_parallel_shard_degree", str(spec["dp"]),
                 "--parallelism.pipeline_parallel_degree", str(spec["pp"]),
                 "--training.local_batch_size", str(spec["passes"]), "--training.seq_len", str(a.seq_len),
                 "--training.steps", str(a.steps), "--metrics.log_freq", "1", "--compile.enable", *extra,
                 "--job.dump_folder", str(dump), *trace_step_overrides(a.steps), *a.extra.split()]
    ngpu = spec["tp"] * spec["dp"] * spec["pp"]
    run = run_train(CONFIG, overrides, ngpu, log_dir / f"{name}.log", emulate_rank=0)
    timed = [r for r in run["steps"] if a.skip < r["step"] <= a.steps - 2]
    row = {**spec, "blocks": blocks, "ok": run["ok"] and bool(timed), "command": run["command"]}
    if not row["ok"]:
        return {**row, "error": run["error"]}
    row["step_s"] = run["tokens_per_step"] / statistics.median(r["tps"] for r in timed)
    row["peak_mem_gib"] = max(r["mem_gib"] for r in run["steps"])
    trace = step_trace(dump, a.steps)
    if trace.is_file():
        row["gpu_busy_s"] = sum(trace_buckets(trace).values()) / 1e3
        row["host_bound_pct"] = max(0.0, 100 * (1 - row["gpu_busy_s"] / row["step_s"]))
        row["host_kinds"] = trace_host(trace)  # where the traced step's host time went
    if spec["kind"] == "step_graph":
        row["host_s"] = row["step_s"] - row.get("gpu_busy_s", float("nan"))
    else:
        row["host_per_block_s"] = row["step_s"] / (blocks * spec["passes"])
    return row


def pipeline_slopes(rows: list[dict]) -> list[dict]:
    """Per tp: the host time per block and pass between the pipeline runs at m = 2 and m = 4."""
    out = []
    for tp in sorted({r["tp"] for r in rows if r["kind"] == "pipeline"}):
        runs = {r["passes"]: r for r in rows if r["kind"] == "pipeline" and r["tp"] == tp and r.get("ok")}
        if {2, 4} <= runs.keys():
            blocks = runs[4]["blocks"]
            out.append({"tp": tp, "host_per_block_pass_s": (runs[4]["step_s"] - runs[2]["step_s"]) / (2 * blocks),
                        "fixed_s": 2 * runs[2]["step_s"] - runs[4]["step_s"]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="7B")
    p.add_argument("--tp", default="1,2,4")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--seq-len", type=int, default=512, help="short, so the GPU's work is a small share of the step")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--skip", type=int, default=6, help="warm-up steps (compilation) left out of the median")
    p.add_argument("--extra", default="", help='more CLI overrides for every run; write --extra="--a.b c"')
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: start no run after this long; the rows done are written, the next call resumes")
    p.add_argument("--out", default="docs/results/host_floor_emulated")
    a = p.parse_args()
    unknown = set(a.kinds.split(",")) - KINDS.keys()
    if unknown:
        p.error(f"unknown kind(s) {sorted(unknown)}; kinds: {', '.join(KINDS)}")
    log_dir = Path(a.out + "_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.monotonic()
    for spec in specs(a.flavor, [int(t) for t in a.tp.split(",")], a.kinds.split(",")):
        done = log_dir / f"{run_name(spec)}.json"  # a row measured by an earlier call is kept, not re-run
        if done.is_file():
            row = json.loads(done.read_text())
        elif a.time_budget is not None and time.monotonic() - start > a.time_budget:
            print(f"[{run_name(spec)}] not run: --time-budget {a.time_budget:.0f} s spent", flush=True)
            continue
        else:
            row = measure(spec, a, log_dir)
        if row["ok"]:
            done.write_text(json.dumps(row))
        rows.append(row)
        print_table([row], COLUMNS[1:11])
    slopes = pipeline_slopes(rows)
    kinds = [{"run": run_name(r), **k} for r in rows for k in r.get("host_kinds", [])]
    write_results(a.out, rows, env_info(), "The host's time per block by layout kind and tp (EMULATED)",
                  columns=COLUMNS, sections=[("Pipeline: host time per block and pass (slope m = 2 → 4)", slopes, None),
                                             ("Host time of each traced step by kind (traces.trace_host)", kinds, None)],
                  notes=f"EMULATED: rank 0 of each layout on one GPU through torchtitan's fake backend, {a.flavor}, "
                        f"compiled, bf16, seq {a.seq_len}, local batch = passes (pipeline: microbatches of one "
                        f"sequence), synthetic tokens; median of steps {a.skip + 1}-{a.steps - 2}, the project's "
                        "sync-free train step. gpu_busy_s: kernel time of the traced last step; host_bound_pct = "
                        "1 - busy / step. The host's time is the step's where host_bound_pct is high.")
    print_table(slopes)


if __name__ == "__main__":
    main()
