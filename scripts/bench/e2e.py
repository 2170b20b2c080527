"""End-to-end training throughput through torchtitan's loop (BOOST Fig. 5), one row per variant.

Each variant is a real ``scripts/run_train.sh`` run; the script parses torchtitan's per-step log
(tokens/s per device, TFLOP/s, MFU — with the model family's own low-rank FLOP count — and peak
memory), drops the first ``--skip`` steps (warm-up, compilation) and reports medians.

``--profile`` also has torchtitan's profiler trace the last step of each run (one warm-up step before
it; both left out of the medians) and buckets that step's GPU kernel time like ``profile_step.py``
does, but inside the real loop: compiled loss, gradient clipping, optimizer and all.

    python -m scripts.bench.e2e --variants cola_1b,cola_1b_compile,fullrank_1b,fullrank_1b_compile \
        --steps 20 --out docs/results/e2e_1gpu
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from scripts.bench.results import env_info, print_table, write_results
from scripts.bench.traces import (
    bucket_rows,
    removal_bounds,
    step_trace,
    trace_buckets,
    trace_gaps,
    trace_host,
    trace_step_overrides,
)

ROOT = Path(__file__).resolve().parents[2]
COMPILE = ["--compile.enable"]
# suffixes a variant name may carry, "+"-joined, to run it with these kernels (the same for both families)
KERNELS = {"flash": ["--boost.attention", "flash"], "fused": ["--boost.fused_cross_entropy"],
           "fp8": ["--boost.float8", "rowwise"], "fp8tw": ["--boost.float8", "tensorwise"],
           "cg": ["--boost.cudagraphs"], "sg": ["--boost.step_cudagraph"]}
BASES = {  # name: (config file, extra CLI overrides)
    "cola_1b": ("train_configs/cola_1b_h200.toml", []),
    "cola_1b_compile": ("train_configs/cola_1b_h200.toml", COMPILE),
    "cola_1b_vanilla": ("train_configs/cola_1b_h200.toml", ["--boost.tp_strategy", "vanilla"]),
    "cola_1b_vanilla_compile": ("train_configs/cola_1b_h200.toml", COMPILE + ["--boost.tp_strategy", "vanilla"]),
    "cola_1b_ungrouped_compile": ("train_configs/cola_1b_h200.toml", COMPILE + ["--boost.no-grouped"]),
    "cola_1b_lowrank_ckpt_compile": ("train_configs/cola_1b_h200.toml", COMPILE + ["--boost.lowrank_checkpoint"]),
    "fullrank_1b": ("train_configs/fullrank_1b_h200.toml", []),
    "fullrank_1b_compile": ("train_configs/fullrank_1b_h200.toml", COMPILE),
    # torchtitan's own llama3 at the dense twin's shape (torchtitan_ext.cola_llama.peers; give --model.flavor 1B/7B/13B)
    "llama3_peer_compile": ("train_configs/fullrank_1b_h200.toml", COMPILE + ["--model.name", "llama3_peer",
                                                                             "--model.flavor", "1B"]),
}


def variant(name: str) -> tuple[str, list[str]]:
    """``<base>[+<kernel>…][+b<N>][+mb<NN>]`` → (config file, CLI overrides); e.g. ``cola_1b_compile+flash+fp8+b8``:
    a base from BASES, kernels from KERNELS, ``bN`` a local batch of N, ``mbNN`` torchtitan's
    ``memory_budget`` activation checkpointing at NN % (inductor recomputes the cheapest ops)."""
    base, *suffixes = name.split("+")
    if base not in BASES:
        raise SystemExit(f"unknown variant base {base!r} in {name!r}; bases: {', '.join(BASES)}")
    config, extra = BASES[base]
    extra = list(extra)
    for suffix in suffixes:
        if re.fullmatch(r"b\d+", suffix):
            extra += ["--training.local_batch_size", suffix[1:]]
        elif re.fullmatch(r"mb\d+", suffix):  # inductor recomputes in backward to fit this % of the activations
            extra += ["--activation_checkpoint.mode", "memory_budget",
                      "--activation_checkpoint.memory_budget", str(int(suffix[2:]) / 100)]
        elif suffix in KERNELS:
            extra += KERNELS[suffix]
        else:
            raise SystemExit(f"unknown suffix {suffix!r} in {name!r}; kernels: {', '.join(KERNELS)}, bN (batch N) or mbNN "
                             "(activation memory budget NN %)")
    return config, extra


def dense_twin(name: str) -> str | None:
    """The dense twin's variant of a CoLA variant (same kernels and batch); None for a dense one."""
    return name.replace("cola_1b", "fullrank_1b", 1) if name.startswith("cola_1b") else None


STEP = re.compile(r"(\d\d:\d\d:\d\d),\d+ - root - INFO - step:\s*(\d+)\s+loss:\s*(-?[\d.]+|nan|inf).*?memory:\s*([\d.]+)GiB"
                  r".*?tps:\s*([\d,]+).*?tflops:\s*([\d.]+).*?mfu:\s*([\d.]+|n/a)")  # n/a: no known peak (CPU)
VALIDATION = re.compile(r"validate step:\s*(\d+)\s+loss:\s*([\d.]+)")
BATCH = re.compile(r"local batch size (\d+),.*?sequence length (\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ERROR = re.compile(r"^(?:\[rank\d+\]: )?(\w[\w.]*(?:Error|Exception)\b.*)$", re.M)  # "torch.OutOfMemoryError: …"


def _loss(text: str) -> float:
    """torchtitan logs -1 as the loss of a pipeline rank that does not compute it (not the last stage)."""
    return float("nan") if float(text) == -1.0 else float(text)


def _seconds(hms: str) -> int:
    h, m, s = map(int, hms.split(":"))
    return 3600 * h + 60 * m + s


def emulate_env(ngpu: int, rank: int = 0) -> dict[str, str]:
    """The environment of one process that plays ``rank`` of an ``ngpu``-rank layout on the fake backend
    (``torchtitan_ext.runtime.emulate``), with the repository importable."""
    return dict(os.environ, NGPU=str(ngpu), EMULATE_RANK=str(rank), LOCAL_RANK="0",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def run_train(config: str, overrides: list[str], ngpu: int, log_path: Path, emulate_rank: int | None = None,
              emulator: str = "torchtitan_ext.runtime.emulate") -> dict:
    """One ``scripts/run_train.sh`` run; returns its parsed per-step log (:func:`parse_log`).

    ``emulate_rank``: instead, one process plays that rank of an ``ngpu`` layout on the fake
    communication backend (the module ``emulator``): its real kernels, no collective (the losses
    are then meaningless, often nan).
    """
    if emulate_rank is None:
        cmd = ["./scripts/run_train.sh", *overrides]
        env = dict(os.environ, NGPU=str(ngpu), CONFIG_FILE=config)
    else:
        cmd = ["python3", "-m", emulator, "--job.config_file", config, *overrides,
               "--comm.mode", "fake_backend"]
        env = emulate_env(ngpu, emulate_rank)
    command = (f"NGPU={ngpu} CONFIG_FILE={config} " if emulate_rank is None else
               f"NGPU={ngpu} EMULATE_RANK={emulate_rank} LOCAL_RANK=0 ") + " ".join(cmd)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log = ANSI.sub("", proc.stdout + proc.stderr)
    log_path.write_text(log)
    run = parse_log(log, proc.returncode, command)
    if not run["ok"]:
        print(f"[{log_path.stem}] FAILED (rc={proc.returncode}, {time.time() - t0:.0f}s); log tail:\n{log[-3000:]}",
              flush=True)
    return run


def parse_log(log: str, returncode: int, command: str) -> dict:
    """``steps``: dicts with step, loss, mem_gib, tps, tflops, mfu, t (seconds since the first step);
    ``validation``: (step, loss) pairs; ``tokens_per_step`` (per device, as torchtitan's tps counts them:
    the rank's tokens over the tp · pp ranks that share them; step_s = tokens_per_step / tps);
    ``command``; ``ok``; ``error``: the log's last exception line ("" when none)."""
    steps = [dict(zip(("t", "step", "loss", "mem_gib", "tps", "tflops", "mfu"),
                      (_seconds(m[0]), int(m[1]), _loss(m[2]), float(m[3]), int(m[4].replace(",", "")),
                       float(m[5]), float("nan") if m[6] == "n/a" else float(m[6])))) for m in STEP.findall(log)]
    t0_log = steps[0]["t"] if steps else 0
    for r in steps:
        r["t"] = (r["t"] - t0_log) % 86400
    batch = BATCH.search(log)
    # torchtitan's tps is per device: a rank's tokens / step time / (tp · pp), the ranks that share them
    shared = 1
    for key in ("tensor_parallel_degree", "pipeline_parallel_degree"):
        m = re.findall(rf"--parallelism\.{key}[ =](\d+)", command)
        shared *= int(m[-1]) if m else 1
    return {"steps": steps, "validation": [(int(a), float(b)) for a, b in VALIDATION.findall(log)],
            "tokens_per_step": int(batch[1]) * int(batch[2]) // shared if batch else 0,
            "ok": returncode == 0 and bool(steps), "returncode": returncode, "command": command,
            "error": errors[-1][:300] if (errors := ERROR.findall(log)) else ""}


def summarize(name: str, rows: list[dict], skip: int, command: str, tokens_per_step: int) -> dict:
    timed = [r for r in rows if r["step"] > skip] or rows
    med = lambda k: statistics.median(r[k] for r in timed) if timed else float("nan")  # noqa: E731
    tps = med("tps")
    return {"variant": name, "steps_timed": len(timed), "tokens_per_s": tps,
            "step_s": tokens_per_step / tps if tps == tps and tps else float("nan"),
            "mfu_pct": med("mfu"), "tflops": med("tflops"), "peak_mem_gib": max((r["mem_gib"] for r in rows), default=0),
            "final_loss": rows[-1]["loss"] if rows else float("nan"), "command": command}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="cola_1b,cola_1b_compile,fullrank_1b,fullrank_1b_compile")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps excluded from the medians")
    p.add_argument("--batch", type=int, default=None, help="local batch size for every run (default: the config's)")
    p.add_argument("--log-freq", type=int, default=1,
                   help="torchtitan's metrics.log_freq: each logged rate is the mean over that many steps. Every "
                        "log reads the loss (.item()), a host-device sync per logged step; training configs log "
                        "every 10 or more, so 10 measures the loop as it trains (then --skip 10 --steps 40)")
    p.add_argument("--ngpu", type=int, default=1)
    p.add_argument("--out", default="docs/results/e2e_1gpu")
    p.add_argument("--extra", default="",
                   help='more CLI overrides for every run (e.g. a smoke test on CPU); write --extra="--a.b c"')
    p.add_argument("--profile", action="store_true", help="trace the last step of each run and bucket its GPU time")
    p.add_argument("--emulate", action="store_true",
                   help="run each variant as rank 0 of --ngpu on the fake backend (torchtitan_ext.runtime.emulate)")
    p.add_argument("--torchtitan-step", action="store_true",
                   help="with --emulate: train with torchtitan 0.2.2's own train step (scripts.bench.torchtitan_step), "
                        "which waits for the GPU before every forward, instead of the project's sync-free one")
    a = p.parse_args()
    if a.torchtitan_step and not a.emulate:
        p.error("--torchtitan-step runs the emulated rank (scripts.bench.torchtitan_step): add --emulate")
    log_dir = Path(a.out + "_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    results, profiles, buckets, gaps, host, failed = [], [], {}, [], [], []
    names = a.variants.split(",")
    plans = {name: variant(name) for name in names}  # a bad name fails before any run
    for name in names:
        config, extra = plans[name]
        dump = ROOT / "outputs" / "e2e" / name.replace("+", ".")
        profiling = ["--job.dump_folder", str(dump), *trace_step_overrides(a.steps)] if a.profile else []
        batch = ["--training.local_batch_size", str(a.batch)] if a.batch else []  # before extra: "+bN" wins
        overrides = ["--training.steps", str(a.steps), "--metrics.log_freq", str(a.log_freq), *batch, *extra, *profiling,
                     *a.extra.split()]
        if a.profile:
            shutil.rmtree(dump / "traces", ignore_errors=True)  # never read an earlier run's trace
        log = log_dir / f"{name.replace('+', '.')}.log"
        run = run_train(config, overrides, a.ngpu, log, emulate_rank=0 if a.emulate else None,
                        emulator="scripts.bench.torchtitan_step" if a.torchtitan_step else "torchtitan_ext.runtime.emulate")
        timed = [r for r in run["steps"] if r["step"] <= a.steps - 2] if a.profile else run["steps"]
        results.append(summarize(name, timed, a.skip, run["command"], run["tokens_per_step"]))
        if not run["ok"]:
            failed.append(name)
            results[-1]["error"] = run["error"] or f"no step logged (exit status {run['returncode']})"
        print_table([results[-1]], ["variant", "tokens_per_s", "step_s", "mfu_pct", "peak_mem_gib"])
        if a.profile:
            trace = step_trace(dump, a.steps)
            if trace.is_file():
                buckets[name] = trace_buckets(trace)
                # the traced step's GPU-busy time beside the median step: what the host leaves idle
                busy = sum(buckets[name].values()) / 1e3
                results[-1]["gpu_busy_s"] = busy
                results[-1]["host_bound_pct"] = max(0.0, 100 * (1 - busy / results[-1]["step_s"]))
                profiles += bucket_rows(name, buckets[name])
                gaps += [{"variant": name, **r} for r in trace_gaps(trace)]
                host += [{"variant": name, **r} for r in trace_host(trace)]
            else:
                print(f"[{name}] no profiler trace at {trace}", flush=True)
    by_name = {r["variant"]: r for r in results}
    bounds = []
    for cola in by_name:
        full = dense_twin(cola)
        if full is None:
            continue
        if full in by_name:
            by_name[cola]["speedup_vs_fullrank"] = by_name[cola]["tokens_per_s"] / by_name[full]["tokens_per_s"]
        if cola in buckets and full in buckets:
            bounds += [{"pair": f"{cola} / {full}", **r} for r in removal_bounds(buckets[cola], buckets[full])]
    cols = ["variant", "tokens_per_s", "step_s", *(["gpu_busy_s", "host_bound_pct"] if buckets else []), "mfu_pct",
            "peak_mem_gib", "speedup_vs_fullrank", "final_loss"]
    sections = [("GPU time of the traced step by kernel kind (ms)", profiles, None)] if a.profile else []
    if gaps:
        sections.append(("GPU idle time of the traced step by host cause", gaps, None,
                         "A gap: no kernel on any stream for >= 10 us. `launched_by`: the host ops around the launch "
                         "of the kernel that ended it; `after_sync`: the host op whose blocking CUDA call (a "
                         "synchronize or a pageable copy) returned during the gap, i.e. the host had waited for the "
                         "GPU to drain and the gap is its time from there to the next launch."))
    if host:
        sections.append(("Host time of the traced step by kind", host, None,
                         "Each host thread's ops nest; an op's own time (less its children's) is charged to the "
                         "nearest kind among itself and the ops around it (`scripts.bench.traces.HOST_KINDS`). "
                         "Time outside any op (Python between ops, a thread waiting for another) is not counted; "
                         "the launches of a compiled graph's kernels count as that graph's."))
    if bounds:
        sections.append(("GPU-busy ratio full rank / CoLA if a kind of kernel cost nothing", bounds, None))
    write_results(a.out, results, env_info(), "End-to-end training throughput (torchtitan loop)", columns=cols,
                  sections=sections,
                  notes="Medians over the timed steps (first `--skip` excluded). MFU uses the model's own FLOP "
                        "count (low-rank aware) against torchtitan's peak for the device. Attention: PyTorch "
                        "SDPA (default backend choice) for both families unless the variant says `+flash` "
                        "(flash-attn-4); `+fused`: lm_head fused with the loss (liger-kernel); `+fp8` / `+fp8tw`: "
                        "torchao float8 rowwise / tensorwise GEMMs in every projection (MFU still against the bf16 peak); "
                        "`+cg`: `[boost] cudagraphs` (compiled blocks replayed as CUDA graphs; their first steps "
                        "re-record: time them after --skip 10); `+sg`: `[boost] step_cudagraph` (the whole train step "
                        "captured once at step 3 and replayed); `+bN`: local batch N; "
                        "`+mbNN`: torchtitan's `memory_budget` activation checkpointing at NN %.")
    if profiles:
        print_table(profiles)
    if gaps:
        print_table(gaps)
    if host:
        print_table(host)
    if bounds:
        print_table(bounds)
    print_table(results, cols)
    if failed:  # the tables keep the failed rows (nan); the exit status says the measurement is incomplete
        raise SystemExit(f"scripts.bench.e2e: {len(failed)} of {len(names)} runs failed: "
                         + "; ".join(f"{r['variant']}: {r['error']}" for r in results if r["variant"] in failed)
                         + f" (logs in {log_dir})")


if __name__ == "__main__":
    main()
