"""Each rank's compute in BOOST's multi-GPU layouts (Fig. 5), on ONE GPU, through the fake backend.

Every row is torchtitan's own loop (``torchtitan_ext.runtime.emulate``: one process plays rank 0 of the
layout; its kernels are real and run at the rank's real shapes, every collective returns at once).
What a row measures is therefore the rank's *compute* per step and its peak memory: **emulated**,
not a multi-GPU run. Communication is added by the α–β model (:mod:`boost_titan.planner.comm_model`),
which makes the ``pred_*`` columns **predicted**.

Rows: BOOST's layouts (3B tp 2 on 2 GPUs, 7B tp 4 on 4, 13B tp 4 × pp 2 on 8; no data parallelism)
for btp / vanilla / fullrank, plus a tp 1 row of the same flavor and local batch (FSDP over 2 GPUs)
as the reference for how well a rank's work splits: ``split_eff`` is the share of the tp 1
per-GPU rate that the rank keeps (1.0 = a perfect tp-way split of the tp 1 step).

A pipeline layout's row is emulated without its pipeline: the rank's compute of the whole model at
its tp and one microbatch (``--microbatch`` samples, default 1, torchtitan's default), which the model
splits into pp equal stages and schedules as 1F1B over the batch's microbatches. ``--stages`` also plays each
stage's first rank inside the real pipeline
schedule (torchtitan_ext.runtime.emulate answers the later stages' shape exchange; torch 2.11): the stage's
compute for all its microbatches, with no wait on its neighbours — how unequal the stages are (the
last one holds the lm_head and the loss). Those rows form a section of their own. BOOST's Fig. 5
numbers (A100, micro-batch 4) stand beside the predicted rows computed at that micro-batch: local
batch 4 without a pipeline, ``--microbatch 4`` with one.

    python -m scripts.bench.emulate --rows "3B;7B" --batch 4 --out docs/results/emulate_fig5
    python -m scripts.bench.emulate --rows 7B:btp --profile --out docs/results/emulate_7b_btp_profile
    python -m scripts.bench.emulate --rows 13B:btp --stages --out docs/results/emulate_13b_stages
    python -m scripts.bench.emulate --rows 13B --batch 16 --microbatch 4 --stages --out docs/results/emulate_13b_mb4
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
from pathlib import Path

from boost_titan.models import FLAVORS
from boost_titan.parallel import STRATEGIES as PLANS
from boost_titan.parallel import stream_shape
from boost_titan.planner import comm_model
from boost_titan.planner.collectives import model_collectives
from scripts.bench.e2e import ROOT, run_train
from scripts.bench.results import BOOST_FIG5_A100, env_info, print_table, write_results
from scripts.bench.traces import bucket_rows, step_trace, trace_buckets, trace_gaps, trace_step_overrides, trace_top_kernels

CONFIG = "train_configs/cola_1b_h200.toml"  # bf16, synthetic tokens, V = 32000
LAYOUTS = {"3B": {"tp": 2, "pp": 1}, "7B": {"tp": 4, "pp": 1}, "13B": {"tp": 4, "pp": 2},  # BOOST Fig. 5
           "tiny": {"tp": 2, "pp": 1}, "tiny_pp": {"tp": 2, "pp": 2, "flavor": "tiny"}}  # CPU smoke tests
STRATEGIES = tuple(PLANS)  # btp, vanilla, fullrank: the registry's names


def row_specs(rows: str, microbatch: int = 1) -> list[dict]:
    """``7B`` (all strategies + the tp 1 reference) or ``7B:btp,vanilla`` → run specs; a pipeline layout's
    ranks compute microbatches of ``microbatch`` samples."""
    specs = []
    for item in rows.split(";"):
        row, _, names = item.partition(":")
        layout = LAYOUTS[row]
        flavor = layout.get("flavor", row)
        for strategy in (names.split(",") if names else ["tp1", *STRATEGIES]):
            if strategy == "tp1":
                specs.append({"flavor": flavor, "strategy": "tp1", "tp": 1, "pp": 1, "dp": 2})
            else:
                specs.append({"flavor": flavor, "strategy": strategy, "tp": layout["tp"], "pp": layout["pp"],
                              "dp": 1, **({"microbatch": microbatch} if layout["pp"] > 1 else {})})
    return specs


def run_name(spec: dict, batch: int) -> str:
    mb = spec.get("microbatch", 1)
    return f"{spec['flavor']}_{spec['strategy']}_b{batch}" + (f"_mb{mb}" if mb > 1 else "")


def emulated_batch(spec: dict, batch: int) -> int:
    return spec.get("microbatch", 1) if spec["pp"] > 1 else batch  # a pipeline rank computes microbatches


def microbatches(spec: dict, batch: int) -> int:
    mb = emulated_batch(spec, batch)
    if batch % mb:
        raise ValueError(f"--microbatch {mb} must divide the local batch {batch}")
    return batch // mb


def overrides(spec: dict, batch: int, steps: int, seq_len: int, real: bool = False) -> list[str]:
    """``real``: the layout itself over NCCL (its pipeline too, microbatches of ``spec['microbatch']``);
    otherwise the emulated rank (a pipeline layout without its pipeline, at one microbatch)."""
    fullrank = spec["strategy"] == "fullrank"
    strategy = "btp" if spec["strategy"] == "tp1" else spec["strategy"]
    pipeline = ["--parallelism.pipeline_parallel_degree", str(spec["pp"]),
                "--parallelism.pipeline_parallel_microbatch_size", str(emulated_batch(spec, batch))] if real else []
    return ["--model.flavor", spec["flavor"] + ("_fullrank" if fullrank else ""), "--boost.tp_strategy", strategy,
            "--parallelism.tensor_parallel_degree", str(spec["tp"]), *pipeline,
            "--parallelism.data_parallel_shard_degree", str(spec["dp"]),
            "--training.local_batch_size", str(batch if real else emulated_batch(spec, batch)),
            "--training.seq_len", str(seq_len), "--training.steps", str(steps), "--metrics.log_freq", "1",
            "--compile.enable"]


def summarize(spec: dict, run: dict, skip: int, batch: int, real: bool = False) -> dict:
    timed = [r for r in run["steps"] if r["step"] > skip]
    if not run["ok"] or not timed:
        return {**spec, "batch": batch, "ok": False, "command": run["command"]}
    tps = statistics.median(r["tps"] for r in timed)  # tokens/s per device (torchtitan divides by tp·pp)
    ranks = spec["tp"] * (spec["pp"] if real else 1)
    return {**spec, "batch": batch, "ok": True, "kind": "measured" if real else "emulated",
            "step_s": run["tokens_per_step"] / (tps * ranks),  # a real step, or the emulated (pipeline-free) rank's
            "tokens_per_s_gpu": tps, "tflops": statistics.median(r["tflops"] for r in timed),
            "mfu_pct": statistics.median(r["mfu"] for r in timed),
            "peak_mem_gib": max(r["mem_gib"] for r in run["steps"]), "command": run["command"]}


STAGES_HEADING = ("EMULATED pipeline stages: each stage's first rank inside the real schedule (its compute for all "
                  "microbatches; neighbours cost nothing)")
STAGE_COLUMNS = ["flavor", "strategy", "tp", "pp", "batch", "stage", "emulated_rank", "ok", "step_s", "vs_mean_stage",
                 "peak_mem_gib"]


def emulate_stages(spec: dict, batch: int, a, log_prefix: Path) -> list[dict]:
    """Each stage of a pp layout: its first rank (``stage · tp · dp``) played inside the real 1F1B schedule
    over the batch's microbatches; ``step_s`` is that rank's compute per step."""
    out = []
    for stage in range(spec["pp"]):
        rank = stage * spec["tp"] * spec["dp"]
        run = run_train(CONFIG, overrides(spec, batch, a.steps, a.seq_len, real=True) + a.extra.split(),
                        spec["tp"] * spec["dp"] * spec["pp"], Path(f"{log_prefix}_stage{stage}.log"), emulate_rank=rank)
        row = summarize(spec, run, a.skip, batch, real=True)
        out.append({**row, "kind": "emulated", "stage": stage, "emulated_rank": rank})
        print_table([out[-1]], STAGE_COLUMNS[:-2])
    times = [r["step_s"] for r in out if r.get("ok")]
    for r in out:
        if r.get("ok") and len(times) == len(out):
            r["vs_mean_stage"] = r["step_s"] / statistics.mean(times)
    return out


def add_split_efficiency(rows: list[dict]) -> None:
    """``perfect_s``: the tp 1 step time / tp; ``split_eff``: perfect_s / the rank's step time (= the rank's
    TFLOP/s over the tp 1 GPU's, since both count the same model FLOPs)."""
    for r in rows:
        ref = next((x for x in rows if x["flavor"] == r["flavor"] and x["strategy"] == "tp1"
                    and x["batch"] == r["batch"] and x.get("ok")), None)
        if ref is None or not r.get("ok") or r["strategy"] in ("tp1", "fullrank") or r["pp"] > 1:
            continue
        r["perfect_s"] = ref["step_s"] / r["tp"]
        r["split_eff"] = r["perfect_s"] / r["step_s"]


def predict(row: dict, batch: int, seq: int, buckets: dict | None, stages: list[dict] | None = None) -> dict:
    """PREDICTED step time of the layout: the emulated compute plus the α–β model's communication.

    Without a pipeline the compute is the emulated step's wall time. A pipeline row's 1F1B schedule
    runs ``m + pp − 1`` slots (m microbatches) of its slowest stage (forward + backward of one microbatch, plus
    that stage's TP communication, tp_s / pp), each also waiting for one activation and one gradient
    transfer. The slot comes from, in order of preference:

    - ``stages`` (``--stages``): each stage's rank played inside the real schedule; its step (all
      microbatches, its optimizer step, host time included) / m. Basis ``stage ranks``.
    - ``buckets`` (``--profile``) of the whole model at one microbatch: its traced GPU time, optimizer
      excluded, / pp, then the stage's optimizer step once (optimizer GPU time / pp). Basis
      ``GPU-bound``: the CPU time of a one-microbatch step (launches, hooks) is left out, and at tp 4 it
      can exceed the GPU time, so a real run may be slower than this estimate.
    """
    flavor = row["flavor"] + ("_fullrank" if row["strategy"] == "fullrank" else "")
    args, tp, pp = FLAVORS[flavor], row["tp"], row["pp"]
    calls, _ = model_collectives(row["strategy"], args, tp, emulated_batch(row, batch), seq)
    tp_s = comm_model.tp_seconds(calls, tp)
    no_overlap_s = comm_model.tp_seconds(calls, tp, overlap_rate=0.0)  # the bound if nothing overlaps
    if pp == 1:  # no data parallelism in these layouts: no FSDP traffic
        return {"pred_tp_comm_s": tp_s, "pred_step_s": comm_model.predict_step(row["step_s"], tp_s, 0.0).step_s,
                "pred_step_no_overlap_s": row["step_s"] + no_overlap_s}
    m = microbatches(row, batch)
    p2p = 2 * math.prod(stream_shape(row["strategy"], emulated_batch(row, batch), seq, args.dim, tp))  # bf16
    if stages and len(stages) == pp and all(s.get("ok") for s in stages):
        slot = max(s["step_s"] for s in stages) / m
        return {"pred_tp_comm_s": tp_s, "pred_basis": "stage ranks",
                "pred_step_s": comm_model.pipeline_step_seconds(slot + tp_s / pp, m, pp, p2p),
                "pred_step_no_overlap_s": comm_model.pipeline_step_seconds(slot + no_overlap_s / pp, m, pp, p2p)}
    if not buckets:
        return {"pred_tp_comm_s": tp_s}  # needs the --stages rows or the --profile buckets
    optimizer_s = buckets.get("optimizer", 0.0) / 1e3
    microbatch_s = sum(buckets.values()) / 1e3 - optimizer_s
    step = comm_model.pipeline_step_seconds((microbatch_s + tp_s) / pp, m, pp, p2p)
    bound = comm_model.pipeline_step_seconds((microbatch_s + no_overlap_s) / pp, m, pp, p2p)
    return {"pred_tp_comm_s": tp_s, "pred_basis": "GPU-bound", "pred_step_s": step + optimizer_s / pp,
            "pred_step_no_overlap_s": bound + optimizer_s / pp}


def add_predictions(rows: list[dict], seq: int, buckets: dict, stage_rows: list[dict] = ()) -> list[dict]:
    """Predicted step times per layout and batch, with speed-ups and BOOST's A100 numbers beside them."""
    table = []
    for r in rows:
        if r.get("ok") and r["strategy"] != "tp1":
            key = (r["flavor"], r["strategy"], r["batch"])
            stages = [s for s in stage_rows if (s["flavor"], s["strategy"], s["batch"]) == key]
            r.update(predict(r, r["batch"], seq, buckets.get(run_name(r, r["batch"])), stages))
    for (flavor, batch) in dict.fromkeys((r["flavor"], r["batch"]) for r in rows):
        by = {r["strategy"]: r for r in rows if (r["flavor"], r["batch"]) == (flavor, batch) and "pred_step_s" in r}
        if not by:
            continue
        layout = LAYOUTS[flavor]
        entry = {"flavor": flavor, "layout": f"tp {layout['tp']} x pp {layout['pp']}", "batch": batch,
                 **{f"{s}_s": by[s]["pred_step_s"] for s in STRATEGIES if s in by}}
        if layout["pp"] > 1:
            entry["basis"] = " / ".join(sorted({by[s].get("pred_basis", "?") for s in by}))
        for other in ("fullrank", "vanilla"):  # ideal overlap, and the bound where nothing overlaps
            if "btp" in by and other in by:
                entry[f"btp_vs_{other}"] = by[other]["pred_step_s"] / by["btp"]["pred_step_s"]
                if "pred_step_no_overlap_s" in by[other] and "pred_step_no_overlap_s" in by["btp"]:
                    entry[f"btp_vs_{other}_no_overlap"] = (by[other]["pred_step_no_overlap_s"]
                                                           / by["btp"]["pred_step_no_overlap_s"])
        if flavor in BOOST_FIG5_A100 and emulated_batch(next(iter(by.values())), batch) == 4:  # BOOST's mbz 4
            fr, va, bt = (BOOST_FIG5_A100[flavor][2][s] for s in ("fullrank", "vanilla", "btp"))
            entry |= {"boost_a100": f"{fr} / {va} / {bt} s", "boost_vs_fr_va": f"{fr / bt:.2f}x / {va / bt:.2f}x"}
        table.append(entry)
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="3B;7B", help='";"-separated flavors, each optionally ":strategy,..."')
    p.add_argument("--batch", default="4", help="local batch sizes, comma-separated")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--microbatch", type=int, default=1,
                   help="pipeline layouts: samples per microbatch (torchtitan's pipeline_parallel_microbatch_size)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps (compilation) left out of the medians")
    p.add_argument("--profile", action="store_true", help="trace the last step and bucket its GPU time")
    p.add_argument("--top", type=int, default=0, help="with --profile: write the N costliest kernels of each run")
    p.add_argument("--extra", default="", help='more overrides for every run, e.g. --extra="--a.b c"')
    p.add_argument("--real", action="store_true",
                   help="run the layouts for real (torchrun, NCCL, tp·pp·dp GPUs) instead of emulating rank 0")
    p.add_argument("--stages", action="store_true",
                   help="pp > 1 rows: also emulate each stage's first rank inside the real pipeline schedule")
    p.add_argument("--from-json", action="store_true",
                   help="no runs: recompute the derived columns and predictions from an earlier --out's JSON")
    p.add_argument("--out", default="docs/results/emulate")
    a = p.parse_args()
    log_dir = Path(a.out + "_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    rows, profiles, top, stage_rows, gaps = [], [], {}, [], []
    profile_file = Path(a.out + "_profile.json")  # kernel-time buckets per run (traces stay on the GPU box)
    buckets = json.loads(profile_file.read_text()) if a.from_json and profile_file.is_file() else {}
    previous = json.loads(Path(a.out + ".json").read_text()) if a.from_json else None
    if previous:
        rows = [r for r in previous["rows"] if "strategy" in r]
        stage_rows = previous.get("sections", {}).get(STAGES_HEADING, [])
        profiles = [row for name, b in buckets.items() for row in bucket_rows(name, b)]
    for batch in map(int, a.batch.split(",")) if previous is None else []:
        for spec in row_specs(a.rows, a.microbatch):
            microbatches(spec, batch)  # a microbatch that does not divide the batch fails before any run
            name = run_name(spec, batch)
            dump = ROOT / "outputs" / "emulate" / name
            profiling = ["--job.dump_folder", str(dump), *trace_step_overrides(a.steps)] if a.profile else []
            shutil.rmtree(dump / "traces", ignore_errors=True)
            gpus = spec["tp"] * spec["dp"] * (spec["pp"] if a.real else 1)
            run = run_train(CONFIG, overrides(spec, batch, a.steps, a.seq_len, a.real) + profiling + a.extra.split(),
                            gpus, log_dir / f"{name}.log", emulate_rank=None if a.real else 0)
            if a.profile:
                run["steps"] = [r for r in run["steps"] if r["step"] <= a.steps - 2]  # traced steps left out
                trace = step_trace(dump, a.steps)
                if trace.is_file():
                    buckets[name] = trace_buckets(trace)
                    gaps += [{"run": name, **r} for r in trace_gaps(trace)]
                    if a.top:
                        top[name] = trace_top_kernels(trace, a.top)
                        print_table(top[name])
                if name in buckets:
                    profiles += bucket_rows(name, buckets[name])
            rows.append(summarize(spec, run, a.skip, batch, a.real))
            print_table([rows[-1]], ["flavor", "strategy", "tp", "dp", "batch", "step_s", "tflops", "peak_mem_gib"])
            if a.stages and spec["pp"] > 1 and not a.real:
                stage_rows += emulate_stages(spec, batch, a, log_dir / name)
    if buckets:
        profile_file.write_text(json.dumps(buckets, indent=1))
    if top:
        Path(a.out + "_kernels.json").write_text(json.dumps(top, indent=1))
    add_split_efficiency(rows)
    fig5 = [] if a.real else add_predictions(rows, a.seq_len, buckets, stage_rows)
    cols = ["flavor", "strategy", "tp", "pp", "dp", "batch", "kind", "step_s", "perfect_s", "split_eff",
            "tokens_per_s_gpu", "tflops", "mfu_pct", "peak_mem_gib", "pred_tp_comm_s", "pred_step_s"]
    fig5_cols = ["flavor", "layout", "batch", "fullrank_s", "vanilla_s", "btp_s", "btp_vs_fullrank",
                 "btp_vs_fullrank_no_overlap", "btp_vs_vanilla", "btp_vs_vanilla_no_overlap", "boost_a100",
                 "boost_vs_fr_va", "basis"]
    link = comm_model.H200_NODE
    title = "PREDICTED step time per layout (s): emulated compute + modelled communication"
    sections = [(title, fig5, fig5_cols)] if fig5 else []
    if stage_rows:
        sections.append((STAGES_HEADING, stage_rows, STAGE_COLUMNS))
    if profiles:
        sections.append(("GPU time of the traced step by kernel kind (ms)", profiles, None))
    if gaps:
        sections.append(("GPU idle time of the traced step by host cause (see traces.trace_gaps)", gaps, None))
    meta = env_info()
    if previous:  # the machine and versions the measurements came from
        meta = {**previous["meta"], "derived_columns_recomputed": meta["date"]}
    if a.real:
        title, notes = ("BOOST's multi-GPU layouts, MEASURED over NCCL (torchrun, one node)",
                        f"MEASURED: each layout on tp·pp·dp GPUs, compiled, bf16, seq {a.seq_len}, synthetic tokens; "
                        "step_s = the step's wall time (communication included); pipelines run 1F1B with "
                        "microbatches of `--microbatch` samples.")
    else:
        title = ("Per-rank compute of BOOST's multi-GPU layouts, emulated on one GPU (torchtitan fake backend: "
                 "collectives cost nothing), and predicted step times")
        notes = ("EMULATED (step_s ... peak_mem_gib): one process plays rank 0 of the layout with real "
                 "kernels at its real shapes; no collective runs, so step_s is the rank's compute only. "
                 f"compiled, bf16, seq {a.seq_len}, synthetic tokens. perfect_s = tp 1 step / tp (same "
                 "flavor and local batch, FSDP over 2 GPUs); split_eff = perfect_s / step_s. A pp > 1 row "
                 "is the whole model at one microbatch without its pipeline. PREDICTED (pred_*): TP "
                 f"collectives counted from the model, each costing alpha {link.alpha_s * 1e6:.0f} us + "
                 f"bytes / the bus bandwidth at that size (up to {link.bus_bw / 1e9:.0f} GB/s; {link.name}; see "
                 "boost_titan/planner/comm_model.py for the curve and its sources), exposed except what the GEMMs "
                 "issued while a backward collective is in flight hide (counted from the code's order, at "
                 f"{comm_model.OVERLAP_GEMM_FLOPS / 1e12:.0f} TFLOP/s, ideal overlap; `*_no_overlap`: the bound "
                 "where nothing is hidden); pp: 1F1B over the "
                 "batch's microbatches of `--microbatch`, its slot from the stage ranks (--stages) where measured, "
                 "else GPU-bound "
                 "from the traced kernels (--profile); `basis` says which (see predict()).")
    write_results(a.out, rows, meta, title, columns=cols, sections=sections, notes=notes)
    if profiles:
        print_table(profiles)
    print_table(rows, cols)
    if fig5:
        print_table(fig5, fig5_cols)


if __name__ == "__main__":
    main()
