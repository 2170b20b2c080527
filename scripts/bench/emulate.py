"""Each rank's compute in BOOST's multi-GPU layouts (Fig. 5), on ONE GPU, through the fake backend.

Every row is torchtitan's own loop (``torchtitan_ext.emulate``: one process plays one rank of an
``--gpus`` layout; its kernels are real and run at the rank's real shapes, every collective returns
at once). What a row measures is therefore the rank's *compute* per step and its peak memory:
**emulated**, not a multi-GPU run. Communication is not in these times (see the communication model).

Rows: the layout of each flavor on an 8-GPU node as BOOST runs it (3B tp 2, 7B tp 4, data parallel
over the rest through FSDP2) for btp / vanilla / fullrank, plus a tp 1 row of the same flavor and
local batch (FSDP only) as the reference for how well a rank's work splits: ``split_eff`` is the
share of the tp 1 per-GPU rate that the rank keeps (1.0 = a perfect tp-way split of the tp 1 step).

    python scripts/bench/emulate.py --rows 7B --batch 4 --out docs/results/emulate_7b
    python scripts/bench/emulate.py --rows 7B:btp --batch 4 --profile --out docs/results/emulate_7b_btp_profile
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from common import bucket_rows, env_info, print_table, trace_buckets, write_results
from e2e import ROOT, run_train

CONFIG = "train_configs/cola_1b_h200.toml"  # bf16, synthetic tokens, V = 32000
LAYOUTS = {"3B": {"tp": 2, "pp": 1}, "7B": {"tp": 4, "pp": 1},  # BOOST Fig. 5 (13B tp 4 × pp 2: not yet)
           "tiny": {"tp": 2, "pp": 1}}  # CPU smoke test
STRATEGIES = ("btp", "vanilla", "fullrank")


def row_specs(rows: str, gpus: int) -> list[dict]:
    """``7B`` (all strategies + the tp 1 reference) or ``7B:btp,vanilla`` → run specs."""
    specs = []
    for item in rows.split(";"):
        flavor, _, names = item.partition(":")
        layout = LAYOUTS[flavor]
        for strategy in (names.split(",") if names else ["tp1", *STRATEGIES]):
            tp, pp = (1, 1) if strategy == "tp1" else (layout["tp"], layout["pp"])
            if gpus % (tp * pp):
                raise ValueError(f"--gpus {gpus} is not divisible by tp·pp = {tp * pp}")
            specs.append({"flavor": flavor, "strategy": strategy, "tp": tp, "pp": pp, "dp": gpus // (tp * pp)})
    return specs


def overrides(spec: dict, batch: int, steps: int, seq_len: int) -> list[str]:
    fullrank = spec["strategy"] == "fullrank"
    strategy = "btp" if spec["strategy"] == "tp1" else spec["strategy"]
    return ["--model.flavor", spec["flavor"] + ("_fullrank" if fullrank else ""), "--boost.tp_strategy", strategy,
            "--parallelism.tensor_parallel_degree", str(spec["tp"]),
            "--parallelism.pipeline_parallel_degree", str(spec["pp"]),
            "--parallelism.data_parallel_shard_degree", str(spec["dp"]),
            "--training.local_batch_size", str(batch), "--training.seq_len", str(seq_len),
            "--training.steps", str(steps), "--metrics.log_freq", "1", "--compile.enable"]


def summarize(spec: dict, run: dict, skip: int, batch: int) -> dict:
    timed = [r for r in run["steps"] if r["step"] > skip]
    if not run["ok"] or not timed:
        return {**spec, "batch": batch, "ok": False, "command": run["command"]}
    tps = statistics.median(r["tps"] for r in timed)  # tokens/s per device (torchtitan divides by tp·pp)
    return {**spec, "batch": batch, "ok": True, "kind": "emulated",
            "step_s": run["tokens_per_step"] / (tps * spec["tp"] * spec["pp"]),
            "tokens_per_s_gpu": tps, "tflops": statistics.median(r["tflops"] for r in timed),
            "mfu_pct": statistics.median(r["mfu"] for r in timed),
            "peak_mem_gib": max(r["mem_gib"] for r in run["steps"]), "command": run["command"]}


def add_split_efficiency(rows: list[dict]) -> None:
    """``perfect_s``: the tp 1 step time / tp; ``split_eff``: perfect_s / the rank's step time (= the rank's
    TFLOP/s over the tp 1 GPU's, since both count the same model FLOPs)."""
    for r in rows:
        ref = next((x for x in rows if x["flavor"] == r["flavor"] and x["strategy"] == "tp1"
                    and x["batch"] == r["batch"] and x.get("ok")), None)
        if ref is None or not r.get("ok") or r["strategy"] in ("tp1", "fullrank"):
            continue
        r["perfect_s"] = ref["step_s"] / r["tp"]
        r["split_eff"] = r["perfect_s"] / r["step_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="3B;7B", help='";"-separated flavors, each optionally ":strategy,..."')
    p.add_argument("--batch", default="4", help="local batch sizes, comma-separated")
    p.add_argument("--gpus", type=int, default=8, help="the emulated node's GPU count")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps (compilation) left out of the medians")
    p.add_argument("--profile", action="store_true", help="trace the last step and bucket its GPU time")
    p.add_argument("--extra", default="", help='more overrides for every run, e.g. --extra="--a.b c"')
    p.add_argument("--out", default="docs/results/emulate")
    a = p.parse_args()
    log_dir = Path(a.out + "_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    rows, profiles = [], []
    for batch in map(int, a.batch.split(",")):
        for spec in row_specs(a.rows, a.gpus):
            name = f"{spec['flavor']}_{spec['strategy']}_b{batch}"
            dump = ROOT / "outputs" / "emulate" / name
            profiling = ["--job.dump_folder", str(dump), "--profiling.enable_profiling", "--profiling.profile_freq",
                         str(a.steps), "--profiling.profiler_warmup", "1", "--profiling.profiler_active", "1",
                         "--profiling.save_traces_folder", "traces"] if a.profile else []
            shutil.rmtree(dump / "traces", ignore_errors=True)
            run = run_train(CONFIG, overrides(spec, batch, a.steps, a.seq_len) + profiling + a.extra.split(),
                            a.gpus, log_dir / f"{name}.log", emulate_rank=0)
            if a.profile:
                run["steps"] = [r for r in run["steps"] if r["step"] <= a.steps - 2]  # traced steps left out
                trace = dump / "traces" / f"iteration_{a.steps}" / "rank0_trace.json"
                if trace.is_file():
                    profiles += bucket_rows(name, trace_buckets(trace))
            rows.append(summarize(spec, run, a.skip, batch))
            print_table([rows[-1]], ["flavor", "strategy", "tp", "dp", "batch", "step_s", "tflops", "peak_mem_gib"])
    add_split_efficiency(rows)
    cols = ["flavor", "strategy", "tp", "pp", "dp", "batch", "kind", "step_s", "perfect_s", "split_eff",
            "tokens_per_s_gpu", "tflops", "mfu_pct", "peak_mem_gib"]
    sections = [("GPU time of the traced step by kernel kind (ms)", profiles, None)] if profiles else []
    write_results(a.out, rows, env_info(), f"Per-rank compute of {a.gpus}-GPU layouts, emulated on one GPU "
                  "(torchtitan fake backend: collectives cost nothing)", columns=cols, sections=sections,
                  notes="EMULATED: one process plays rank 0 of the layout with real kernels at its real shapes; "
                        "no collective runs, so step_s is the rank's compute only. compiled, bf16, seq "
                        f"{a.seq_len}, synthetic tokens. perfect_s = tp 1 step / tp (same flavor and local batch, FSDP "
                        "over the node); split_eff = perfect_s / step_s (1.0: a perfect split).")
    if profiles:
        print_table(profiles)
    print_table(rows, cols)


if __name__ == "__main__":
    main()
