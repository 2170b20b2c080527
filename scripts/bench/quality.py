"""Quality: CoLA-60M against dense models at equal tokens and at equal compute, with seeds.

The experiment (train_configs/quality_60m.toml: Llama-2's 32K tokenizer, seq 1024, batch 32, AdamW
(0.9, 0.95), weight decay 0.01, clip 0.5, cosine to 10%), on the corpus of ``scripts/build_corpus.py``
(no document in both splits; every run reads at most one epoch). Four arms, each its own family:

* ``cola``        CoLA-60M (d 512, L 8, r 128) on D tokens;
* ``dense``       its dense twin on D tokens (equal tokens);
* ``dense_flops`` the dense twin on D / R tokens, R = the twin's training FLOPs per token over CoLA's
  (equal compute, its own schedule);
* ``dense_small`` a dense model with CoLA's FLOPs per token (``60M_flopmatch_fullrank``, d 384) on D
  tokens (equal compute, equal tokens).

Stages, each resumable (a run whose log holds its final validation is not run again):

* ``sweep``: per arm, every learning rate x warm-up (10% and 20% of the run) at the arm's final
  length, seed 0 (curves only). The setting with the lowest final validation loss is chosen; a
  choice at the edge of the learning-rate grid is flagged and gets no seeds until the grid is extended.
* ``seeds``: every arm's chosen setting with seeds 1..3 (curves only; CoLA's and dense's seed 1 are
  the speed runs). Sweep and seed runs share one pool, ``--parallel`` at once on the one GPU; an
  arm's seeds join it as soon as its sweep has chosen.
* ``speed``: last, the chosen CoLA and dense settings, seed 1, one run at a time, alone on the GPU,
  with a profiler trace of one step (GPU-busy beside step time): tokens/s and the training time to
  reach the dense twin's final validation loss.

``report`` (run after every stage) writes ``<out>.{md,json,png}`` and the verdict, decided by the rule
in ``VERDICT_RULE`` (fixed before any run, printed by ``--rule``)::

    python scripts/build_corpus.py                         # once, where the registries are reachable
    python -m scripts.bench.quality --stages sweep,speed,seeds --parallel 6 --out docs/results/quality_60m
    python -m scripts.bench.quality --stages report --out docs/results/quality_60m   # from the logs alone

The logs live in ``<out>_logs/`` and are committed packed as ``<out>_logs.tar.gz`` (rewritten after
every call, unpacked where the folder is missing), so a later call, on another machine, resumes.

Validation is the whole held-out split, ~10 times per run, on logging steps (so no tokens/s window
holds a validation). ``--extra`` overrides go last, to every run (write ``--extra="--a.b c"``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import statistics
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from boost_titan.models.args import flops_per_token
from boost_titan.models.flavors import FLAVORS
from scripts.bench.e2e import ANSI, ROOT, parse_log, run_train
from scripts.bench.results import env_info, print_table, pyplot, write_results
from scripts.bench.traces import step_trace, trace_buckets, trace_step_overrides

CONFIG = "train_configs/quality_60m.toml"
CORPUS_STATS = ROOT / "data" / "corpus" / "stats.json"
SEQ_LEN, BATCH = 1024, 32  # the config's; tokens per step = 32768

VERDICT_RULE = """\
Verdict rule (fixed before the runs). L(arm) = final validation loss on the whole held-out split,
mean ± std over 3 seeds at each arm's chosen setting; ΔL = L(cola) − L(dense) at equal tokens D, with
σ = sqrt(std_cola² / 3 + std_dense² / 3).
- parity: |ΔL| ≤ 0.03 nats and |ΔL| ≤ 2σ;
- CoLA worse: ΔL ≥ 0.05 and no win at equal FLOPs (L(cola) > L(dense_flops) and L(cola) > L(dense_small));
- compute-efficient: L(cola) ≤ L(dense_flops) (the twin on D/R tokens) and L(cola) ≤ L(dense_small);
- otherwise: inconclusive at this budget.
Parity and compute-efficient can both hold; the headline lists every verdict that holds.
Time to the dense twin's final loss (mean over seeds): training seconds (validation excluded) until
the CoLA run's validation curve reaches it, both runs alone on the GPU."""


@dataclass(frozen=True)
class Arm:
    flavor: str
    token_share: float  # of D
    lrs: tuple[str, ...]
    label: str


def flops_ratio() -> float:
    """The dense twin's training FLOPs per token over CoLA-60M's (6·matmul weights + attention)."""
    return flops_per_token(FLAVORS["60M_fullrank"], SEQ_LEN) / flops_per_token(FLAVORS["60M"], SEQ_LEN)


ARMS = {
    # CoLA's grid was extended downward after its first sweep chose its lowest rate (docs/results/quality_60m.md)
    "cola": Arm("60M", 1.0, ("3e-4", "5e-4", "1e-3", "2e-3", "4e-3", "6e-3", "1e-2"), "CoLA-60M, D tokens"),
    "dense": Arm("60M_fullrank", 1.0, ("5e-4", "1e-3", "2e-3", "3e-3", "5e-3"), "dense twin, D tokens"),
    "dense_flops": Arm("60M_fullrank", 1 / flops_ratio(), ("5e-4", "1e-3", "2e-3", "3e-3", "5e-3"),
                       "dense twin, D/R tokens (CoLA's compute)"),
    "dense_small": Arm("60M_flopmatch_fullrank", 1.0, ("1e-3", "2e-3", "3e-3", "5e-3", "8e-3"),
                       "dense d 384 (CoLA's FLOPs/token), D tokens"),
}
WARMUPS = ("0.1", "0.2")
SEEDS = (1, 2, 3)


def validation_freq(steps: int, points: int, log_freq: int) -> int:
    """The divisor of ``steps`` nearest ``steps / points`` that is a multiple of ``log_freq``.

    A divisor, so the last step is validated; a multiple of the logging interval, so validation time
    never falls inside a logged tokens/s window (torchtitan restarts that clock after validating).
    """
    target = max(1, steps / max(1, points))
    candidates = [f for f in range(1, steps + 1) if steps % f == 0 and f % log_freq == 0] or [steps]
    return min(candidates, key=lambda f: (abs(f - target), f))


def arm_steps(arm: Arm, d_steps: int, log_freq: int) -> int:
    """The arm's share of D, in whole logging intervals (so validations land on logged steps)."""
    return max(log_freq, round(d_steps * arm.token_share / log_freq) * log_freq)


@dataclass(frozen=True)
class Run:
    arm: str
    lr: str
    warmup: str
    seed: int
    steps: int
    alone: bool = False  # the speed stage: one run at a time, with a traced step

    @property
    def tag(self) -> str:
        return f"{self.arm}_lr{self.lr}_wu{self.warmup}_s{self.seed}"


def overrides(run: Run, a: argparse.Namespace) -> list[str]:
    arm = ARMS[run.arm]
    out = ["--model.flavor", arm.flavor, "--optimizer.lr", run.lr, "--training.steps", str(run.steps),
           "--boost.tp_strategy", "fullrank" if arm.flavor.endswith("_fullrank") else "btp",
           "--lr_scheduler.warmup_steps", str(max(1, round(float(run.warmup) * run.steps))),
           "--debug.seed", str(run.seed),
           "--metrics.log_freq", str(a.log_freq),
           "--validation.freq", str(validation_freq(run.steps, a.val_points, a.log_freq)),
           "--validation.steps", "-1",
           "--job.dump_folder", f"./outputs/quality/{run.tag}"]
    if run.alone:  # trace one step that neither validates nor ends the run
        out += trace_step_overrides(traced_step(run.steps))
    return out + a.extra.split()


def traced_step(steps: int) -> int:
    return steps - 3  # not a multiple of the logging interval: no validation, no log sync


def pack_logs(a: argparse.Namespace) -> None:
    """``<out>_logs/`` as one reproducible ``<out>_logs.tar.gz`` (the folder itself is not committed)."""
    folder = Path(a.out + "_logs")
    with open(a.out + "_logs.tar.gz", "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for path in sorted(folder.glob("*.log")):
                info = tar.gettarinfo(str(path), arcname=f"{folder.name}/{path.name}")
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)


def unpack_logs(a: argparse.Namespace) -> None:
    """Resume from the committed ``<out>_logs.tar.gz`` where ``<out>_logs/`` is not here (a fresh clone)."""
    folder, packed = Path(a.out + "_logs"), Path(a.out + "_logs.tar.gz")
    if packed.is_file() and not any(folder.glob("*.log")):
        with tarfile.open(packed) as tar:
            tar.extractall(folder.parent, members=[m for m in tar.getmembers() if m.isfile()
                                                   and m.name.startswith(folder.name + "/") and ".." not in m.name])


def log_path(run: Run, a: argparse.Namespace) -> Path:
    return Path(a.out + "_logs") / f"{run.tag}.log"


def load(run: Run, a: argparse.Namespace) -> dict | None:
    """The parsed log of a finished run (its last step validated), else None."""
    path = log_path(run, a)
    if not path.is_file():
        return None
    text = ANSI.sub("", path.read_text(errors="replace"))
    parsed = parse_log(text, 0, "")
    if not parsed["steps"] or not parsed["validation"] or parsed["validation"][-1][0] != run.steps:
        return None
    first = text.splitlines()[0] if text else ""
    parsed["command"] = first.removeprefix("# command: ")
    parsed["alone"] = "--profiling.enable_profiling" in first
    parsed["train_s"] = _training_seconds(parsed)
    return parsed


def train(run: Run, a: argparse.Namespace) -> dict | None:
    if (done := load(run, a)) is not None:
        return done
    if a.start_deadline and time.time() > a.start_deadline:  # left for the next call (runs resume from logs)
        return None
    path = log_path(run, a)
    result = run_train(CONFIG, overrides(run, a), 1, path)
    path.write_text(f"# command: {result['command']}\n" + path.read_text())
    if run.alone:
        trace = step_trace(ROOT / "outputs" / "quality" / run.tag, traced_step(run.steps))
        if trace.is_file():
            busy_s = sum(trace_buckets(trace).values()) / 1e3
            path.write_text(path.read_text() + f"\n# gpu_busy_s of traced step {traced_step(run.steps)}: {busy_s:.6f}\n")
    return load(run, a)


def run_devices(a: argparse.Namespace) -> set[str]:
    """The GPUs the logged runs trained on (torchtitan logs "CUDA capacity: <name> with ..."); the
    report may be written elsewhere, from the logs alone."""
    found = set()
    for path in Path(a.out + "_logs").glob("*.log"):
        found.update(re.findall(r"CUDA capacity: (.+?) with", path.read_text(errors="replace")))
    return found


def gpu_busy_s(run: Run, a: argparse.Namespace) -> float | None:
    path = log_path(run, a)
    for line in path.read_text().splitlines()[::-1] if path.is_file() else []:
        if line.startswith("# gpu_busy_s"):
            return float(line.rsplit(":", 1)[1])
    return None


def _training_seconds(run: dict) -> dict[int, float]:
    """Seconds of training (validation excluded) up to each logged step, from the logged tokens/s.

    torchtitan's tokens/s covers one logging window and restarts after a validation, so summing
    window tokens / tokens/s gives the time spent training, step 1's start-up included.
    """
    out, prev, total = {}, 0, 0.0
    for r in run["steps"]:
        if r["tps"] > 0:
            total += (r["step"] - prev) * run["tokens_per_step"] / r["tps"]
        prev = r["step"]
        out[r["step"]] = total
    return out


def _time_to_reach(run: dict, target: float | None) -> tuple[int | None, float | None]:
    """First validated step with loss <= target, and the training seconds at which the validation
    curve (linear between points) crosses the target."""
    if target is None:
        return None, None
    t_of, prev = run["train_s"], None
    for step, loss in run["validation"]:
        if loss <= target:
            if prev is None or prev[1] == loss or prev[0] not in t_of or step not in t_of:
                return step, t_of.get(step)
            frac = (prev[1] - target) / (prev[1] - loss)
            return step, t_of[prev[0]] + frac * (t_of[step] - t_of[prev[0]])
        prev = (step, loss)
    return None, None


def _median_tps(run: dict) -> float:
    timed = run["steps"][len(run["steps"]) // 4:] or run["steps"]
    return statistics.median(r["tps"] for r in timed)


# ---- the plan ---------------------------------------------------------------------------------

def sweep_runs(d_steps: int, a: argparse.Namespace) -> list[Run]:
    return [Run(name, lr, wu, 0, arm_steps(arm, d_steps, a.log_freq))
            for name, arm in ARMS.items() for lr in arm.lrs for wu in WARMUPS]


def chosen(d_steps: int, a: argparse.Namespace) -> dict[str, Run | None]:
    """Per arm, the finished seed-0 sweep run with the lowest final validation loss (None until every
    sweep run of the arm has finished)."""
    best: dict[str, Run | None] = {}
    for name in ARMS:
        runs = [r for r in sweep_runs(d_steps, a) if r.arm == name]
        logs = [load(r, a) for r in runs]
        best[name] = None if any(x is None for x in logs) else \
            min(zip(runs, logs), key=lambda rl: rl[1]["validation"][-1][1])[0]
    return best


def at_grid_edge(run: Run) -> bool:
    """A choice at the lowest or highest learning rate swept: the optimum may lie outside the grid."""
    return run.lr in (ARMS[run.arm].lrs[0], ARMS[run.arm].lrs[-1])


def seed_runs(best: dict[str, Run | None], alone: bool) -> list[Run]:
    """The chosen settings with seeds 1..3; ``alone``: only the speed pair's seed 1. An arm whose
    choice sits at the edge of its grid gets no seeds: its grid is extended first."""
    out = []
    for name, run in best.items():
        if run is None or at_grid_edge(run):
            continue
        for seed in SEEDS:
            speed = name in ("cola", "dense") and seed == SEEDS[0]
            if alone == speed:
                out.append(Run(name, run.lr, run.warmup, seed, run.steps, alone=speed))
    return out


def run_alone(runs: list[Run], a: argparse.Namespace) -> None:
    """One run at a time: nothing else on the GPU while each is timed."""
    todo = [r for r in runs if load(r, a) is None]
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already done; {len(todo)} to run, one at a time", flush=True)
    for run in todo:
        _report_done(run, train(run, a))


def _report_done(run: Run, result: dict | None) -> None:
    print(f"[{run.tag}] " + ("done" if result else "not run or FAILED: no final validation"), flush=True)


def sweep_then_seeds(stages: list[str], a: argparse.Namespace) -> None:
    """The sweep runs and the seeds that share the GPU, in one pool: an arm's seeds start as soon as
    its sweep has chosen (so a call does not wait for the slowest arm's sweep before any seed runs)."""
    arms = set(a.arms.split(","))
    queued = [r for r in sweep_runs(a.d_steps, a) if r.arm in arms] if "sweep" in stages else []
    submitted: set[Run] = set()
    with ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
        futures = {}

        def submit_ready():
            ready = queued + (seed_runs(chosen(a.d_steps, a), alone=False) if "seeds" in stages else [])
            for run in ready:
                if run not in submitted and load(run, a) is None:
                    submitted.add(run)
                    futures[pool.submit(train, run, a)] = run

        submit_ready()
        print(f"{len(futures)} runs to run now, {a.parallel} at a time (seeds join as their arm's sweep ends)",
              flush=True)
        while futures:
            done = next(as_completed(futures))
            _report_done(futures.pop(done), done.result())
            submit_ready()


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else float("nan")


def verdict(losses: dict[str, list[float]]) -> dict:
    """VERDICT_RULE applied to the final validation losses of each arm's seeds."""
    stats = {arm: mean_std(v) for arm, v in losses.items() if v}
    if not {"cola", "dense", "dense_flops", "dense_small"} <= stats.keys():
        return {"verdict": "not decided: an arm has no seed runs yet"}
    (c, sc), (d, sd) = stats["cola"], stats["dense"]
    n_c, n_d = len(losses["cola"]), len(losses["dense"])
    delta, sigma = c - d, math.sqrt(sc ** 2 / n_c + sd ** 2 / n_d)
    f, s = stats["dense_flops"][0], stats["dense_small"][0]
    held = []
    if abs(delta) <= 0.03 and abs(delta) <= 2 * sigma:
        held.append("parity")
    if c <= f and c <= s:
        held.append("compute-efficient")
    if delta >= 0.05 and c > f and c > s:
        held.append("CoLA worse")
    return {"delta_L": delta, "sigma": sigma, "cola": c, "dense": d, "dense_flops": f, "dense_small": s,
            "cola_minus_dense_flops": c - f, "cola_minus_dense_small": c - s,
            "verdict": " and ".join(held) if held else "inconclusive at this budget"}


# ---- report -----------------------------------------------------------------------------------

def report(d_steps: int, a: argparse.Namespace, meta: dict) -> None:
    best = chosen(d_steps, a)
    sweep_rows = []
    for run in sweep_runs(d_steps, a):
        r = load(run, a)
        lr_edge = at_grid_edge(run)
        sweep_rows.append({"arm": run.arm, "lr": run.lr, "warmup": run.warmup, "steps": run.steps,
                           "final_val_loss": r["validation"][-1][1] if r else None,
                           "chosen": ("yes (grid edge)" if lr_edge else "yes") if best[run.arm] == run else "",
                           "val_curve": r["validation"] if r else None})
    seed_rows, losses, logs = [], {name: [] for name in ARMS}, {}
    for run in seed_runs(best, alone=True) + seed_runs(best, alone=False):
        r = load(run, a)
        if r is None:
            continue
        logs[run.tag] = r
        losses[run.arm].append(r["validation"][-1][1])
        seed_rows.append({"arm": run.arm, "seed": run.seed, "lr": run.lr, "warmup": run.warmup,
                          "tokens": run.steps * r["tokens_per_step"],
                          "final_train_loss": r["steps"][-1]["loss"], "final_val_loss": r["validation"][-1][1],
                          "alone": run.alone, "val_curve": r["validation"],
                          "train_curve": [(s["step"], s["loss"]) for s in r["steps"]], "command": r["command"]})
    v = verdict(losses)
    arm_rows = [{"arm": name, "what": ARMS[name].label, "seeds": len(vals),
                 "val_loss_mean": round(mean_std(vals)[0], 4) if vals else None,
                 "val_loss_std": round(mean_std(vals)[1], 4) if vals else None,
                 "lr": best[name].lr if best[name] else None, "warmup": best[name].warmup if best[name] else None,
                 "steps": best[name].steps if best[name] else None} for name, vals in losses.items()]
    target = statistics.fmean(losses["dense"]) if losses["dense"] else None
    speed_rows = []
    for run in seed_runs(best, alone=True):
        r = logs.get(run.tag)
        if r is None:
            continue
        tps = _median_tps(r)
        reach_step, reach_s = _time_to_reach(r, target)
        busy = gpu_busy_s(run, a)
        speed_rows.append({"arm": run.arm, "tokens_per_s": round(tps), "step_ms": round(1e3 * r["tokens_per_step"] / tps, 2),
                           "gpu_busy_ms": round(1e3 * busy, 2) if busy is not None else None,
                           "train_s": r["train_s"][r["steps"][-1]["step"]],
                           "step_reaching_dense_loss": reach_step if reach_step is not None else "not reached",
                           "train_s_to_dense_loss": reach_s,
                           "peak_mem_gib": max(s["mem_gib"] for s in r["steps"])})
    v = {k: round(x, 4) if isinstance(x, float) else x for k, x in v.items()}
    sections = [("Verdict", [v], None, f"```\n{VERDICT_RULE}\n```"),
                ("Arms at their chosen setting (final validation loss over seeds)", arm_rows, None),
                ("Speed: the chosen CoLA and dense runs, each alone on the GPU", speed_rows, None,
                 "tokens_per_s: median of the last 3/4 of the logged windows; step_ms = tokens per step / "
                 "tokens_per_s; gpu_busy_ms: GPU kernel time of one traced step; train_s: training time from "
                 "the logged tokens/s (validation excluded), start-up included; train_s_to_dense_loss: when the "
                 "validation curve (linear between points) reaches the dense twin's mean final loss."),
                ("Learning-rate sweep (seed 0, each arm at its final length, runs sharing the GPU)",
                 [{k: x for k, x in row.items() if k != "val_curve"} for row in sweep_rows], None)]
    cols = ["arm", "seed", "lr", "warmup", "tokens", "final_train_loss", "final_val_loss", "alone"]
    write_results(a.out, seed_rows, meta, "Quality: CoLA-60M vs dense at equal tokens and equal compute",
                  columns=cols, sections=sections, notes=_notes(d_steps, Path(a.out + "_logs")))
    _plot(seed_rows, sweep_rows, a.out + ".png")
    print(VERDICT_RULE)
    print_table(arm_rows)
    print_table(speed_rows)
    print(f"VERDICT: {v['verdict']}  " + ", ".join(f"{k} {x:.4f}" for k, x in v.items() if isinstance(x, float)))


def _notes(d_steps: int, log_dir: Path) -> str:
    stats = json.loads(CORPUS_STATS.read_text()) if CORPUS_STATS.is_file() else None
    corpus = (f"train {stats['train']['tokens'] / 1e6:.2f}M Llama-2 tokens in {stats['train']['docs']} documents, "
              f"validation {stats['validation']['tokens'] / 1e6:.2f}M in {stats['validation']['docs']} documents "
              "(no document in both)") if stats else "corpus stats missing"
    peaks = [float(m) for path in log_dir.glob("*.log")
             for m in re.findall(r"memory:\s*([\d.]+)GiB", path.read_text(errors="replace"))]
    peak = f" Peak memory of a run: {max(peaks):.1f} GiB (torchtitan's reserved memory)." if peaks else ""
    d_tokens = d_steps * SEQ_LEN * BATCH
    epochs = f", {d_tokens / stats['train']['tokens']:.2f} epoch" if stats else ""
    return (f"D = {d_steps} steps x {BATCH} x {SEQ_LEN} = {d_tokens / 1e6:.1f}M tokens{epochs}. "
            f"R = {flops_ratio():.3f} (dense twin / CoLA training FLOPs per token at seq {SEQ_LEN}). "
            f"Corpus: {corpus}. Every run validates on the whole held-out split. The header's date, device "
            "and versions are the machine's that wrote this report from the logs; the runs trained on "
            "runs_device (`<out>_logs.tar.gz`: one log per run, its command on the first line)." + peak)


def _plot(seed_rows: list[dict], sweep_rows: list[dict], path: str) -> None:
    """Left: each arm's validation curve, mean and min-max band over its seeds (before the seeds: its
    chosen sweep run); right: the sweep's final validation loss by learning rate and warm-up."""
    plt = pyplot()
    if plt is None or not (seed_rows or any(r["final_val_loss"] is not None for r in sweep_rows)):
        return
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, arm in enumerate(ARMS):
        rows = [r for r in seed_rows if r["arm"] == arm] or \
            [r for r in sweep_rows if r["arm"] == arm and r["chosen"] and r["val_curve"]]
        if rows:
            steps = [s for s, _ in rows[0]["val_curve"]]
            curves = [[v for _, v in r["val_curve"]] for r in rows if [s for s, _ in r["val_curve"]] == steps]
            tokens = [s * SEQ_LEN * BATCH / 1e6 for s in steps]
            what = f"{len(curves)} seeds" if "seed" in rows[0] else "sweep's choice, seed 0"
            ax.plot(tokens, [statistics.fmean(c) for c in zip(*curves)], "o-", color=f"C{i}", ms=3,
                    label=f"{arm} ({what})")
            ax.fill_between(tokens, [min(c) for c in zip(*curves)], [max(c) for c in zip(*curves)],
                            color=f"C{i}", alpha=0.25)
        swept = [r for r in sweep_rows if r["arm"] == arm and r["final_val_loss"] is not None]
        for wu, marker in zip(WARMUPS, "os"):
            pts = sorted((float(r["lr"]), r["final_val_loss"]) for r in swept if r["warmup"] == wu)
            if pts:
                bx.plot(*zip(*pts), marker + ("-" if wu == WARMUPS[0] else "--"), color=f"C{i}",
                        label=f"{arm} warm-up {float(wu):.0%}")
    ax.set(xlabel="training tokens (M)", ylabel="validation loss", title="validation loss (band: min-max over seeds)")
    ax.set_ylim(top=min(ax.get_ylim()[1], 6.0))
    bx.set(xscale="log", xlabel="learning rate", ylabel="final validation loss", title="sweep (seed 0)")
    bx.set_ylim(top=min(bx.get_ylim()[1], 5.5))
    for axis in (ax, bx):
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default="sweep,speed,seeds", help="of sweep, speed, seeds (report always runs last)")
    p.add_argument("--arms", default=",".join(ARMS), help="limit the sweep stage to these arms")
    p.add_argument("--d-steps", type=int, default=500, help=f"D in steps of {BATCH} x {SEQ_LEN} tokens")
    p.add_argument("--parallel", type=int, default=6,
                   help="runs at once on the one GPU (sweep and seeds); each run's peak memory is in the "
                        "report's notes (6 fit an 80 GB GPU)")
    p.add_argument("--val-points", type=int, default=10, help="about this many validations per run")
    p.add_argument("--log-freq", type=int, default=10)
    p.add_argument("--extra", default="", help='more CLI overrides for every run (last); write --extra="--a.b c"')
    p.add_argument("--out", default="docs/results/quality_60m")
    p.add_argument("--start-within", type=float, default=0,
                   help="start no run after this many seconds (a device call's limit; later calls resume)")
    p.add_argument("--rule", action="store_true", help="print the verdict rule and exit")
    a = p.parse_args()
    a.start_deadline = time.time() + a.start_within if a.start_within else 0
    if a.rule:
        print(VERDICT_RULE)
        return
    stats = json.loads(CORPUS_STATS.read_text()) if CORPUS_STATS.is_file() else None
    if stats and a.d_steps * SEQ_LEN * BATCH > stats["train"]["tokens"]:
        p.error(f"--d-steps {a.d_steps} reads {a.d_steps * SEQ_LEN * BATCH:,} tokens, more than one epoch of "
                f"the training split ({stats['train']['tokens']:,}): every quality run reads at most one epoch")
    stages = [s for s in a.stages.split(",") if s]
    if unknown := set(stages) - {"sweep", "speed", "seeds", "report"}:
        p.error(f"unknown stages {sorted(unknown)}; choose from sweep, speed, seeds, report")
    unpack_logs(a)
    Path(a.out + "_logs").mkdir(parents=True, exist_ok=True)
    print(VERDICT_RULE, flush=True)
    sweep_then_seeds(stages, a)
    best = chosen(a.d_steps, a)
    for name, run in best.items():
        if run is not None and at_grid_edge(run):
            print(f"{name}: the sweep chose lr {run.lr}, the edge of its grid {ARMS[name].lrs}: extend the grid "
                  "before its seeds run", flush=True)
    if "speed" in stages:  # last, alone on the GPU
        run_alone(seed_runs(best, alone=True), a)
    meta = env_info()
    meta["runs_device"] = ", ".join(sorted(run_devices(a))) or "no run yet"
    meta["command"] = f"python -m scripts.bench.quality --d-steps {a.d_steps} --parallel {a.parallel} --out {a.out}" + \
        (f' --extra="{a.extra}"' if a.extra else "")
    report(a.d_steps, a, meta)
    pack_logs(a)


if __name__ == "__main__":
    main()
