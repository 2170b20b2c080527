"""End to end: torchtitan 0.2.2's own training loop (scripts/run_train.sh → torchrun, gloo CPU ranks)
on the cola_llama family, compared across parallel layouts by the per-step losses it logs.

Every run is a subprocess. The runs that the selected tests need are launched as soon as the first
test asks for them, BOOST_E2E_JOBS at a time (default: half the cores this process may use, at
least 2), because most of a run is interpreter start-up and torchtitan's fixed 2 s shutdown sleep,
which leave the cores idle part of the time. Each test then waits for its runs. Dump folders are
created under pytest's tmp path, with ``runs.txt`` listing each run as it ends and where its time went.

All tiny-flavor runs share one recipe (fp32, synthetic tokens, seq 64, local batch 2, LR schedule
over 30 steps) so that they follow the same loss curve whatever the layout. Two settings make
pipeline parallelism comparable too: in 0.2.2 the PP schedule back-propagates the token *sum*
(here 128× the gradient of the other runs, see the notes §8), which gradient clipping would then
rescale step by step. With clipping off (max_norm 1e6; the other runs' norms are < 1 anyway) and
AdamW's eps at 1e-16, AdamW is invariant to that constant factor.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from conftest import ROOT, free_port

pytestmark = pytest.mark.e2e

RUN_TRAIN = ROOT / "scripts" / "run_train.sh"
CONFIG = ROOT / "train_configs" / "debug_cpu.toml"
TIMEOUT_S = 420
JOBS = max(1, int(os.environ.get("BOOST_E2E_JOBS", max(2, len(os.sched_getaffinity(0)) // 2))))
RTOL = 1e-5
# [boost] float8 needs torchao (the fp8 and test extras); without it its runs are not started
HAS_TORCHAO = importlib.util.find_spec("torchao") is not None

COMMON = ("--metrics.log_freq", "1", "--debug.seed", "42", "--metrics.disable_color_printing")
TP2 = ("--parallelism.tensor_parallel_degree", "2")
TB = ("--metrics.enable_tensorboard",)
PP_STAGES = {"1F1B": 2, "Interleaved1F1B": 4}  # tiny (2 layers): [emb, L0], [L1, head] / emb, L0, L1, head


def tiny(*extra: str, steps: int = 10, flavor: str = "tiny") -> tuple[str, ...]:
    return ("--parallelism.tensor_parallel_degree", "1",  # debug_cpu.toml's tp 2 is the main job's; TP2 overrides
            "--model.flavor", flavor, "--training.dataset", "synthetic", "--boost.tokenizer", "none",
            "--boost.synthetic_vocab_size", "512", "--training.seq_len", "64",
            "--training.local_batch_size", "2", "--training.steps", str(steps),
            "--lr_scheduler.total_steps", "30", "--optimizer.eps", "1e-16", "--training.max_norm", "1e6",
            *extra)


@dataclass(frozen=True)
class Spec:
    ngpu: int
    args: tuple[str, ...]
    log_rank: int = 0  # the rank whose log is kept (PP: the last stage's, which computes the loss)
    cost: float = 16.0  # rough wall seconds alone on 2 cores: longest runs are started first
    expect_failure: bool = False
    resume_from: str | None = None  # start from this run's checkpoint (runs after it) ...
    resume_step: int | None = 15  # ... its step-15, or None: its whole checkpoint folder (the latest wins)
    hf_import_from: str | None = None  # load the weights of this run's last (Hugging Face) save first
    nodes: int = 1  # > 1: that many run_train.sh launchers of ngpu ranks each, one c10d rendezvous (localhost)
    train_file: str | None = None  # run_train.sh's TRAIN_FILE (default: torchtitan_ext.runtime.train)

    @property
    def source(self) -> str | None:
        return self.resume_from or self.hf_import_from


# checkpoint/resume recipe: online norm, grouping and low-rank checkpointing on, save every 15 steps
CKPT = tiny(*TP2, "--boost.rmsnorm", "online", "--boost.grouped", "--boost.lowrank_checkpoint",
            "--checkpoint.enable", "--checkpoint.interval", "15", *TB, steps=30)

HF_STEPS = 5
HF_SAVE = ("--checkpoint.enable", "--checkpoint.last_save_in_hf", "--checkpoint.last_save_model_only")
HF_LOAD = ("--checkpoint.enable", "--checkpoint.initial_load_in_hf")
FULLRANK = ("--boost.tp_strategy", "fullrank")

DP2_TP2 = tiny(*TP2, "--parallelism.data_parallel_shard_degree", "2")  # FSDP2 x btp TP2 on 4 ranks
ACCUM = tiny("--training.global_batch_size", "8", *TB)  # FSDP over 2 ranks, local batch 2: 2 microbatches

SPECS: dict[str, Spec] = {
    "debugmodel": Spec(2, ("--training.steps", "10", "--training.seq_len", "64",
                           "--training.local_batch_size", "2"), cost=28),  # the main job: embedded text, btp tp 2
    "tp1": Spec(1, tiny(*TB, steps=30)),
    "tp2": Spec(2, tiny(*TP2)),
    "tp2_sync": Spec(2, tiny(*TP2, "--boost.rmsnorm", "sync")),
    "tp2_ungrouped": Spec(2, tiny(*TP2, "--boost.no-grouped")),
    "dp2": Spec(2, tiny()),  # data_parallel_shard_degree = -1 → FSDP over both ranks
    "dp2_tp2": Spec(4, DP2_TP2, cost=33),
    **{f"pp_{s}": Spec(4, tiny(*TP2, "--parallelism.pipeline_parallel_degree", "2",
                               "--parallelism.pipeline_parallel_schedule", s), log_rank=2, cost=27)
       for s in PP_STAGES},
    "compile": Spec(2, tiny(*TP2, "--compile.enable", steps=3), cost=35),
    "ac_full": Spec(2, tiny(*TP2, "--activation_checkpoint.mode", "full")),
    "ac_selective": Spec(2, tiny(*TP2, "--activation_checkpoint.mode", "selective",
                                 "--activation_checkpoint.selective_ac_option", "op")),
    # torch.compile + TP + checkpointing: blocks compiled on the local shards of their parameters
    "compile_lowrank": Spec(2, tiny(*TP2, "--compile.enable", "--boost.lowrank_checkpoint", steps=3), cost=35),
    "compile_ac_full": Spec(2, tiny(*TP2, "--compile.enable", "--activation_checkpoint.mode", "full", steps=3),
                            cost=35),
    "compile_budget": Spec(2, tiny(*TP2, "--compile.enable", "--activation_checkpoint.mode", "memory_budget",
                                   "--activation_checkpoint.memory_budget", "0.9", steps=3), cost=35),
    "ckpt": Spec(2, CKPT, cost=22),
    # low-rank checkpointing composed with pipeline stages, and with FSDP2
    "pp_lowrank": Spec(4, tiny(*TP2, "--parallelism.pipeline_parallel_degree", "2", "--boost.lowrank_checkpoint"),
                       log_rank=2, cost=27),
    "dp2_tp2_lowrank": Spec(4, tiny(*TP2, "--parallelism.data_parallel_shard_degree", "2",
                                    "--boost.lowrank_checkpoint"), cost=33),
    "resume": Spec(2, CKPT, cost=18, resume_from="ckpt"),
    # the same resume through [boost] step_cudagraph's step, uncaptured (tests/step_graph_trainer.py)
    "resume_graph": Spec(2, CKPT, cost=18, resume_from="ckpt", train_file="tests.step_graph_trainer"),
    # the configs' defaults: save every 5 of 10 steps, then the same command for 20 steps resumes at 11
    "ckpt_short": Spec(2, tiny(*TP2, "--checkpoint.enable", "--checkpoint.interval", "5", steps=10), cost=14),
    "resume_short": Spec(2, tiny(*TP2, "--checkpoint.enable", "--checkpoint.interval", "5", steps=20), cost=16,
                         resume_from="ckpt_short", resume_step=None),
    # bf16 compute (fp32 master weights) in layouts without FSDP: tp only, pp only
    **{name: Spec(n, tiny(*extra, "--training.mixed_precision_param", "bfloat16"), log_rank=log_rank)
       for name, n, extra, log_rank in [("tp1_bf16", 1, (), 0), ("tp2_bf16", 2, TP2, 0),
                                        ("pp2_bf16", 2, ("--parallelism.pipeline_parallel_degree", "2"), 1)]},
    # a tied embedding / lm_head split across pipeline stages (1F1B × TP2; interleaved, 4 stages on 2 ranks)
    "tp1_tied": Spec(1, tiny(flavor="tiny_tied"), cost=10),
    "pp_tied": Spec(4, tiny(*TP2, "--parallelism.pipeline_parallel_degree", "2", flavor="tiny_tied"),
                    log_rank=2, cost=27),
    "pp_tied_interleaved": Spec(2, tiny("--parallelism.pipeline_parallel_degree", "2",
                                        "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
                                        flavor="tiny_tied"), log_rank=1, cost=20),
    # full-rank Megatron + SP under torch.compile (its all-gather / reduce-scatter along the sequence)
    "fullrank_tp1": Spec(1, tiny("--boost.tp_strategy", "fullrank", flavor="tiny_fullrank", steps=3), cost=10),
    "compile_fullrank": Spec(2, tiny(*TP2, "--compile.enable", "--boost.tp_strategy", "fullrank",
                                     flavor="tiny_fullrank", steps=3), cost=35),
    # the lm_head fused into the loss (chunked PyTorch on CPU): alone, under FSDP2, tied under FSDP2
    "tp1_fused": Spec(1, tiny("--boost.fused_cross_entropy"), cost=10),
    "dp2_tied": Spec(2, tiny(flavor="tiny_tied")),
    "dp2_tied_fused": Spec(2, tiny("--boost.fused_cross_entropy", flavor="tiny_tied")),
    # float8 projection GEMMs (torchao's emulation on CPU): one rank, and btp tp 2 (scales per local shard)
    "tp1_fp8": Spec(1, tiny("--boost.float8", "rowwise"), cost=10),
    "tp2_fp8": Spec(2, tiny(*TP2, "--boost.float8", "rowwise")),
    # Hugging Face: btp tp 2 saves its last step as an HF directory; tp 1 and tp 2 start from it
    "hf_export": Spec(2, tiny(*TP2, *HF_SAVE, steps=HF_STEPS), cost=14),
    "hf_import_tp1": Spec(1, tiny(*HF_LOAD, steps=HF_STEPS), cost=10, hf_import_from="hf_export"),
    "hf_import_tp2": Spec(2, tiny(*TP2, *HF_LOAD, steps=HF_STEPS), cost=14, hf_import_from="hf_export"),
    # the dense twin: Megatron + SP tp 2 saves a LlamaForCausalLM directory and starts from it again
    "hf_export_fullrank": Spec(2, tiny(*TP2, *FULLRANK, *HF_SAVE, flavor="tiny_fullrank", steps=HF_STEPS), cost=14),
    "hf_import_fullrank_tp2": Spec(2, tiny(*TP2, *FULLRANK, *HF_LOAD, flavor="tiny_fullrank", steps=HF_STEPS),
                                   cost=14, hf_import_from="hf_export_fullrank"),
    "err_hf_save": Spec(1, tiny("--checkpoint.enable", "--checkpoint.last_save_in_hf"), cost=10,
                        expect_failure=True),  # the config's full last save: HF saves are weights only
    # the layout of dp2_tp2 launched as 2 nodes x 2 ranks (tests/test_multinode.py)
    "nodes2_tp2_fsdp2": Spec(2, DP2_TP2, nodes=2, cost=40),
    # torchtitan's own train step (tests/stock_trainer.py): FSDP2 x TP2, and FSDP2 with 2 microbatches
    "dp2_tp2_stock": Spec(4, DP2_TP2, cost=33, train_file="tests.stock_trainer"),
    "dp2_accum": Spec(2, ACCUM),
    "dp2_accum_stock": Spec(2, ACCUM, train_file="tests.stock_trainer"),
    # the step through [boost] step_cudagraph's buffers and device learning rates, uncaptured
    # (tests/step_graph_trainer.py); TP2 is covered by resume_graph
    "dp2_accum_graph": Spec(2, ACCUM, train_file="tests.step_graph_trainer"),
    "err_fullrank": Spec(1, tiny("--boost.tp_strategy", "fullrank"), cost=10, expect_failure=True),
    "err_flavor": Spec(1, tiny(flavor="no_such_flavor"), cost=10, expect_failure=True),
}


# ---------------------------------------------------------------------------------------------------
# running and parsing

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+)")


@dataclass
class Result:
    name: str
    returncode: int | None
    log: str
    dump: Path
    seconds: float

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.splitlines()[-n:])

    def metric_strings(self) -> dict[int, tuple[str, str]]:
        """step → (loss, grad_norm) as printed by torchtitan's metrics logger."""
        out: dict[int, tuple[str, str]] = {}
        for line in self.log.splitlines():
            m = _STEP.search(line) if "[titan]" in line else None
            if m:
                step = int(m.group(1))
                assert step not in out, f"{self.name}: step {step} logged twice"
                out[step] = (m.group(2), m.group(3))
        return out

    def losses(self) -> dict[int, float]:
        return {s: float(loss) for s, (loss, _) in self.metric_strings().items()}

    def tensorboard(self, tag: str) -> dict[int, float]:
        """float32 scalars of the (single) TensorBoard run in this dump folder."""
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        files = sorted(self.dump.glob("tb/*/events.out.tfevents.*"))
        assert len(files) == 1, f"{self.name}: expected one TensorBoard event file, found {files}"
        out = {}
        for event in EventFileLoader(str(files[0])).Load():
            for value in event.summary.value:
                if value.tag == tag:
                    out[event.step] = value.tensor.float_val[0] if value.HasField("tensor") else value.simple_value
        return out


_STAMP = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _phases(log: str, started_at: float) -> str:
    """Where a run's time went, from the log's timestamps: until torchtitan's first line (the processes'
    start and imports), until the first step's line (building, sharding, compiling), the steps, the end."""
    stamps = [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), _STEP.search(line) is not None)
              for line in log.splitlines() if (m := _STAMP.search(line))]
    steps = [t for t, is_step in stamps if is_step]
    if not steps:
        return ""
    marks = [started_at, stamps[0][0], steps[0], steps[-1], time.time()]
    return "; " + ", ".join(f"{what} {b - a:.1f} s" for what, a, b in zip(
        ["start", "to step 1", "steps", "end"], marks, marks[1:]))


def _launch(name: str, spec: Spec, dump: Path, extra: tuple[str, ...] = ()) -> Result:
    env = {k: v for k, v in os.environ.items() if k not in ("COMM_MODE", "TRAIN_FILE")}
    env.update(NGPU=str(spec.ngpu), LOG_RANK=str(spec.log_rank), CONFIG_FILE=str(CONFIG))
    if spec.train_file:
        env["TRAIN_FILE"] = spec.train_file
    cmd = [str(RUN_TRAIN), *COMMON, "--job.dump_folder", str(dump), *spec.args, *extra]
    nodes = [{}] if spec.nodes == 1 else [
        {"NNODES": str(spec.nodes), "NODE_RANK": str(i), "RDZV_ENDPOINT": endpoint, "RDZV_ID": name}
        for endpoint in [f"127.0.0.1:{free_port()}"] for i in range(spec.nodes)]
    start, started_at = time.monotonic(), time.time()
    procs = [subprocess.Popen(cmd, cwd=ROOT, env={**env, **node}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)  # own process group: killable as a whole
             for node in nodes]
    logs, codes = [], []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += f"\n[test] killed after {TIMEOUT_S} s"
        logs.append(_ANSI.sub("", out))
        codes.append(proc.returncode)
    dump.mkdir(parents=True, exist_ok=True)
    for i, log in enumerate(logs):
        (dump / f"run{i if len(logs) > 1 else ''}.log").write_text(log)  # for debugging a failed comparison
    # several nodes: the log of the node whose local rank LOG_RANK printed the losses (pipeline: the last stage's)
    log = next((log for log in logs if _losses_positive(log)), logs[0])
    code = next((c for c in codes if c != 0), 0) if None not in codes else None
    seconds = time.monotonic() - start
    with open(dump.parent / "runs.txt", "a") as f:  # as each run ends: what an interrupted session ran
        f.write(f"{name}: {seconds:.1f} s (rc={code}){_phases(log, started_at)}\n")
    return Result(name, code, log, dump, seconds)


def _losses_positive(log: str) -> bool:
    losses = [float(m.group(2)) for line in log.splitlines() if "[titan]" in line and (m := _STEP.search(line))]
    return bool(losses) and min(losses) > 0


class RunPool:
    """Runs the named specs in the background (``jobs`` at a time); ``get`` waits for one."""

    def __init__(self, base: Path, names: list[str], jobs: int):
        self.base, self.results, self.lock = base, {}, threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=jobs)
        self.futures = {}
        chains, names = [], list(dict.fromkeys(names))
        for name in names:  # a run that starts from another's checkpoint goes right after it, in one worker
            dependents = [n for n in names if SPECS[n].source == name]
            if SPECS[name].source is None:
                chains.append([name, *dependents])
            elif SPECS[name].source not in names:
                chains.append([SPECS[name].source, name])
        chains.sort(key=lambda chain: -sum(SPECS[n].cost for n in chain))
        for chain in chains:
            future = self.executor.submit(self._run_chain, chain)
            for name in chain:
                self.futures[name] = future

    def _run_chain(self, chain: list[str]) -> None:
        for name in chain:
            spec, dump, extra = SPECS[name], self.base / name, ()
            if spec.source is not None:
                source = self.results[spec.source]
                if source.returncode != 0:
                    return
            if spec.hf_import_from is not None:
                extra = ("--checkpoint.initial_load_path", str(source.dump / "checkpoint" / f"step-{HF_STEPS}"))
            elif spec.resume_from is not None:
                if spec.resume_step is None:
                    shutil.copytree(source.dump / "checkpoint", dump / "checkpoint")
                else:
                    step = f"step-{spec.resume_step}"
                    if (source.dump / "checkpoint" / step).is_dir():
                        shutil.copytree(source.dump / "checkpoint" / step, dump / "checkpoint" / step)
            self.results[name] = _launch(name, spec, dump, extra)

    def get(self, name: str) -> Result:
        if name not in self.futures:  # not pre-launched (unusual selection): run it now
            with self.lock:
                if name not in self.futures:
                    source = SPECS[name].source
                    self.futures[name] = self.executor.submit(self._run_chain, [source, name] if source else [name])
        self.futures[name].result()
        if name not in self.results:
            pytest.fail(f"run {name!r} was skipped: the run it resumes from failed")
        result, spec = self.results[name], SPECS[name]
        if not spec.expect_failure:
            assert result.returncode == 0, f"run {name!r} failed (rc={result.returncode}):\n{result.tail()}"
        return result

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def _runs_for(item) -> list[str]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    name = item.originalname
    if name == "test_main_job_btp_tp2_loss_decreases":
        return ["debugmodel"]
    if name == "test_btp_tp2_matches_tp1":
        return ["tp1", params.get("variant", "tp2")]
    if name == "test_train_step_matches_torchtitans":
        return {"fsdp_tp": ["dp2_tp2", "dp2_tp2_stock"], "accum": ["dp2_accum", "dp2_accum_stock"]
                }[params.get("layout", "fsdp_tp")]
    if name == "test_step_graph_resumes_a_plain_checkpoint":
        return ["ckpt", "resume_graph"]
    if name == "test_step_graph_runs_the_plain_step":
        return ["dp2_accum_graph", "dp2_accum"]
    if name == "test_fsdp_tp_matches_fsdp":
        return ["dp2_tp2", "dp2"]
    if name == "test_pp_tp_matches_tp1":
        return ["tp1", f"pp_{params.get('schedule', '1F1B')}"]
    if name == "test_compile_matches_eager":
        return ["compile", "tp2"]
    if name == "test_compiled_checkpointing_matches_tp1":
        return ["tp1", params.get("variant", "compile_lowrank")]
    if name == "test_activation_checkpointing_matches_no_ac":
        return ["tp2", params.get("variant", "ac_full")]
    if name == "test_checkpoint_resume_and_tp_parity":
        return ["tp1", "ckpt", "resume"]
    if name == "test_lowrank_checkpoint_composes":
        return {"pp": ["tp1", "pp_lowrank"], "fsdp": ["dp2", "dp2_tp2_lowrank"]}[params.get("variant", "pp")]
    if name == "test_bf16_without_fsdp_tracks_tp1":
        return ["tp1", "tp1_bf16", params.get("variant", "tp2_bf16")]
    if name == "test_pp_keeps_tied_embeddings_tied":
        return ["tp1_tied", params.get("variant", "pp_tied")]
    if name == "test_fullrank_tp2_compiled_matches_tp1":
        return ["fullrank_tp1", "compile_fullrank"]
    if name == "test_default_configs_resume_from_the_last_save":
        return ["ckpt_short", "resume_short"]
    if name == "test_float8_tracks_fp32":
        return ["tp1", "tp1_fp8", "tp2_fp8"] if HAS_TORCHAO else []
    if name == "test_two_nodes_match_one_node":
        layout = params.get("layout", "tp2_fsdp2")
        return [f"nodes2_{layout}", {"tp2_fsdp2": "dp2_tp2"}[layout]]
    if name == "test_clear_errors":
        return ["err_fullrank", "err_flavor", "err_hf_save"]
    if name == "test_hf_export_and_import_through_the_loop":
        return {"cola": ["hf_export", "hf_import_tp1", "hf_import_tp2"],
                "fullrank": ["hf_export_fullrank", "hf_import_fullrank_tp2"]
                }[params.get("family", "cola")]
    return []


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    names = [n for item in request.session.items if item.module is request.module for n in _runs_for(item)]
    pool = RunPool(tmp_path_factory.mktemp("e2e"), names, JOBS)
    yield pool
    pool.close()
    print("\n".join(f"e2e run {r.name}: {r.seconds:.1f} s (rc={r.returncode})" for r in pool.results.values()))


def assert_curves_close(actual: dict[int, float], expected: dict[int, float], steps, rtol: float, what: str):
    steps = list(steps)
    missing = [s for s in steps if s not in actual or s not in expected]
    assert not missing, f"{what}: steps {missing} not logged"
    bad = [(s, actual[s], expected[s]) for s in steps
           if not abs(actual[s] - expected[s]) <= rtol * abs(expected[s])]  # NaN counts as bad
    assert not bad, f"{what}: (step, got, expected) beyond rtol={rtol}: {bad}"


# ---------------------------------------------------------------------------------------------------
# tests


def test_main_job_btp_tp2_loss_decreases(runs):
    """The README's main job (debug_cpu.toml): btp over 2 ranks, debugmodel flavor, GPT-2 tokenizer,
    embedded real text: it learns."""
    run = runs.get("debugmodel")
    assert "tp=2" in run.log and "Applied tensor parallelism: tp_strategy=btp tp=2" in run.log
    losses = run.losses()
    assert sorted(losses) == list(range(1, 11)), losses
    assert all(math.isfinite(v) for v in losses.values()), losses
    # the loss starts near ln(vocab) = ln(50304) ≈ 10.8 (near-uniform predictions); require a drop of
    # more than 1 nat within the 10 steps
    assert losses[10] < losses[1] - 1.0, f"loss did not clearly decrease: {losses}"


@pytest.mark.parametrize("variant", ["tp2", "tp2_sync", "tp2_ungrouped"])
def test_btp_tp2_matches_tp1(runs, variant):
    """btp at tp 2 (online norm / sync norm / ungrouped GEMMs) reproduces the single-rank curve."""
    run = runs.get(variant)
    assert "Applied tensor parallelism: tp_strategy=btp tp=2" in run.log
    assert_curves_close(run.losses(), runs.get("tp1").losses(), range(1, 11), RTOL, f"{variant} vs tp1")


def test_fsdp_tp_matches_fsdp(runs):
    """FSDP2 × btp TP2 on 4 ranks == FSDP on 2 ranks: same dp degree, same data, same math."""
    run = runs.get("dp2_tp2")
    assert "dp_shard=2, cp=1, tp=2" in run.log and "Applied FSDP2 to the model" in run.log
    assert_curves_close(run.losses(), runs.get("dp2").losses(), range(1, 11), RTOL, "fsdp2 x tp2 vs fsdp2")


@pytest.mark.parametrize("layout", ["fsdp_tp", "accum"])
def test_train_step_matches_torchtitans(runs, layout):
    """The trainer's sync-free train step (torchtitan_ext/runtime/train.py) trains exactly as torchtitan 0.2.2's
    own: same logged loss and gradient norm at every step, bit for bit, under FSDP2 x TP2 (the token
    count all-reduced over the batch ranks) and with 2 microbatches per step."""
    ours, stock = {"fsdp_tp": ("dp2_tp2", "dp2_tp2_stock"), "accum": ("dp2_accum", "dp2_accum_stock")}[layout]
    ours, stock = runs.get(ours), runs.get(stock)
    assert ours.metric_strings() == stock.metric_strings() and len(ours.metric_strings()) == 10
    if layout == "accum":  # float32 losses, and 2 microbatches of 2 x 64 tokens per rank and step
        for tag in ("loss_metrics/global_avg_loss", "loss_metrics/global_max_loss", "grad_norm"):
            assert ours.tensorboard(tag) == stock.tensorboard(tag) and len(stock.tensorboard(tag)) == 10, tag
        assert ours.tensorboard("n_tokens_seen")[1] == 2 * 2 * 2 * 64


def test_step_graph_runs_the_plain_step(runs):
    """What ``[boost] step_cudagraph`` captures and replays — the trainer's ``device_step`` on static
    device buffers refilled each step, with the optimizer's learning rate a tensor the scheduler fills —
    trains exactly as the plain step: same logged losses, gradient norms and learning rates, bit for bit,
    under FSDP2 with 2 microbatches per step (TP2: test_step_graph_resumes_a_plain_checkpoint), the
    schedule's warm-up and decay included; and from the third
    step on (the one a GPU captures) the step reads no tensor on the host (the run fails otherwise,
    tests/step_graph_trainer.py). The capture itself needs CUDA: tests/test_step_graph.py."""
    ours, plain = runs.get("dp2_accum_graph"), runs.get("dp2_accum")
    assert ours.metric_strings() == plain.metric_strings() and len(plain.metric_strings()) == 10
    for tag in ("loss_metrics/global_avg_loss", "grad_norm", "lr"):
        assert ours.tensorboard(tag) == plain.tensorboard(tag) and len(plain.tensorboard(tag)) == 10, tag
    assert len(set(plain.tensorboard("lr").values())) > 5  # the schedule moved the rate every step


def test_step_graph_resumes_a_plain_checkpoint(runs):
    """The step-graph trainer keeps the optimizer's and schedulers' state as the plain one does (float
    rates outside the step), so it resumes the plain btp TP2 run's step-15 checkpoint, reproduces steps
    16-30 bit-exactly and saves its own."""
    full, resumed = runs.get("ckpt"), runs.get("resume_graph")
    assert "checkpoint/step-15" in resumed.log and "Training starts at step 16" in resumed.log
    assert resumed.metric_strings() == {s: v for s, v in full.metric_strings().items() if s > 15}
    assert (resumed.dump / "checkpoint" / "step-30").is_dir()


@pytest.mark.parametrize("schedule", list(PP_STAGES))
def test_pp_tp_matches_tp1(runs, schedule):
    """PP2 × btp TP2 on 4 ranks (dp 1) == the single-rank run, for 1F1B and Interleaved1F1B."""
    run = runs.get(f"pp_{schedule}")
    assert f"Using pipeline schedule {schedule} with 2 microbatches and {PP_STAGES[schedule]} stages" in run.log
    assert_curves_close(run.losses(), runs.get("tp1").losses(), range(1, 11), RTOL, f"pp2 x tp2 {schedule} vs tp1")


def test_compile_matches_eager(runs):
    """Per-block torch.compile (and the compiled loss) under btp TP2 follows the eager TP2 run."""
    run = runs.get("compile")
    assert "Compiling each TransformerBlock with torch.compile" in run.log
    assert "Compiling the loss function with torch.compile" in run.log
    losses = run.losses()
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) for v in losses.values()), losses
    assert_curves_close(losses, runs.get("tp2").losses(), range(1, 4), RTOL, "compiled tp2 vs eager tp2")


@pytest.mark.parametrize("variant", ["compile_lowrank", "compile_ac_full", "compile_budget"])
def test_compiled_checkpointing_matches_tp1(runs, variant):
    """torch.compile + btp TP2 + low-rank checkpointing / torchtitan's full AC / its memory_budget mode
    (with the compiled loss-parallel loss), all at once: the losses of the eager single-rank run without
    checkpointing."""
    run = runs.get(variant)
    marker = {"compile_lowrank": "Applied low-rank activation checkpointing",
              "compile_ac_full": "Applied full activation checkpointing",
              "compile_budget": "Applied memory_budget activation checkpointing"}[variant]
    assert marker in run.log
    assert "Compiling each TransformerBlock with torch.compile (on the local shards of its tp parameters)" in run.log
    losses, ref = run.losses(), runs.get("tp1")
    assert sorted(losses) == [1, 2, 3], losses
    assert_curves_close(losses, ref.losses(), range(1, 4), RTOL, f"{variant} vs eager tp1")
    grad_norms = {s: float(g) for s, (_, g) in run.metric_strings().items()}  # printed to 4 decimals
    ref_norms = {s: float(g) for s, (_, g) in ref.metric_strings().items()}
    assert_curves_close(grad_norms, ref_norms, range(1, 4), 1e-3, f"{variant} vs eager tp1 (grad norm)")


@pytest.mark.parametrize("variant", ["ac_full", "ac_selective", "ckpt"])
def test_activation_checkpointing_matches_no_ac(runs, variant):
    """torchtitan's full / op-selective AC and [boost] lowrank_checkpoint change no loss (btp TP2)."""
    run = runs.get(variant)
    marker = {"ac_full": "Applied full activation checkpointing",
              "ac_selective": "Applied selective activation checkpointing",
              "ckpt": "Applied low-rank activation checkpointing"}[variant]
    assert marker in run.log
    assert_curves_close(run.losses(), runs.get("tp2").losses(), range(1, 11), RTOL, f"{variant} vs no AC")


def test_checkpoint_resume_and_tp_parity(runs):
    """btp TP2 (online norm, grouping, low-rank checkpointing) tracks TP1 over 30 steps (≤ 1e-5 rel
    per step, float32 values from TensorBoard); a resume from the step-15 DCP checkpoint reproduces
    steps 16-30 bit-exactly (loss and grad norm)."""
    tp1, full, resumed = runs.get("tp1"), runs.get("ckpt"), runs.get("resume")
    assert (full.dump / "checkpoint" / "step-15").is_dir()
    tag = "loss_metrics/global_avg_loss"
    assert_curves_close(full.tensorboard(tag), tp1.tensorboard(tag), range(1, 31), RTOL, "tp2 vs tp1 (30 steps)")

    assert "checkpoint/step-15" in resumed.log and "Training starts at step 16" in resumed.log
    printed_full, printed_resumed = full.metric_strings(), resumed.metric_strings()
    assert sorted(printed_resumed) == list(range(16, 31)), sorted(printed_resumed)
    assert printed_resumed == {s: printed_full[s] for s in range(16, 31)}
    for metric in (tag, "grad_norm"):
        expected = {s: v for s, v in full.tensorboard(metric).items() if s > 15}
        assert resumed.tensorboard(metric) == expected, f"{metric}: resumed run differs from the uninterrupted one"


def test_default_configs_resume_from_the_last_save(runs):
    """With the family's TOML defaults, the final save of a run is a full training checkpoint: the same
    command with more steps resumes from it (step 10 → 11..20) and continues the same data and curve."""
    first, resumed = runs.get("ckpt_short"), runs.get("resume_short")
    assert (first.dump / "checkpoint" / "step-10").is_dir()
    assert "Training starts at step 11" in resumed.log, resumed.tail()
    assert sorted(resumed.metric_strings()) == list(range(11, 21))


@pytest.mark.parametrize("variant", ["pp", "fsdp"])
def test_lowrank_checkpoint_composes(runs, variant):
    """lowrank_checkpoint under PP2 × TP2 (vs tp 1), and under FSDP2 × TP2 (vs FSDP 2)."""
    if variant == "pp":
        run, ref = runs.get("pp_lowrank"), runs.get("tp1")
    else:
        run, ref = runs.get("dp2_tp2_lowrank"), runs.get("dp2")
    assert "Applied low-rank activation checkpointing" in run.log
    assert_curves_close(run.losses(), ref.losses(), range(1, 11), RTOL, f"lowrank checkpoint ({variant})")


@pytest.mark.parametrize("variant", ["pp_tied", "pp_tied_interleaved"])
def test_pp_keeps_tied_embeddings_tied(runs, variant):
    """A tied embedding / lm_head on the first and last pipeline stages trains as the one matrix of the
    single-rank model: the mirror's gradient is folded into the owner's, the owner's update copied back."""
    run = runs.get(variant)
    assert "Tied embedding / lm_head across pipeline stages" in run.log
    assert_curves_close(run.losses(), runs.get("tp1_tied").losses(), range(1, 11), RTOL, f"{variant} vs tp1 tied")


def test_fullrank_tp2_compiled_matches_tp1(runs):
    """The dense twin under Megatron TP + sequence parallelism, compiled, follows its eager tp 1 run."""
    run = runs.get("compile_fullrank")
    assert "tp_strategy=fullrank tp=2" in run.log and "Compiling each TransformerBlock" in run.log
    assert_curves_close(run.losses(), runs.get("fullrank_tp1").losses(), range(1, 4), RTOL, "compiled fullrank tp2")


@pytest.mark.parametrize("variant", ["tp2_bf16", "pp2_bf16"])
def test_bf16_without_fsdp_tracks_tp1(runs, variant):
    """TP-only and PP-only layouts compute in bf16 (torchtitan alone would run them in fp32): their
    losses leave the fp32 curve by bf16 rounding and follow the single-rank bf16 run (torchtitan's
    autocast) within bf16 tolerance."""
    run, fp32, bf16 = runs.get(variant), runs.get("tp1"), runs.get("tp1_bf16")
    assert "Mixed precision: compute in bfloat16, fp32 master weights" in run.log
    assert "1-rank shard mesh" in run.log and "Mixed precision training is disabled" not in run.log
    # fp32 layouts agree to ~1e-7 (RTOL 1e-5); bf16 rounding moves this tiny model's loss by ~5e-5
    losses = run.losses()
    assert max(abs(losses[s] - fp32.losses()[s]) / fp32.losses()[s] for s in range(1, 11)) > 1.5e-5, \
        "the bf16 run matches the fp32 one: it did not compute in bf16"
    assert_curves_close(losses, bf16.losses(), range(1, 11), 2e-3, f"{variant} vs tp1 bf16")


@pytest.mark.parametrize("variant, reference", [("tp1_fused", "tp1"), ("dp2_tied_fused", "dp2_tied")])
def test_fused_cross_entropy_matches_logits_loss(runs, variant, reference):
    """``[boost] fused_cross_entropy``: the lm_head applied inside the loss gives the same training curve,
    on one rank (untied) and under FSDP2 tied to the embedding (the head's weight, the embedding's, read
    unsharded in forward and its gradient reduced at the end of backward)."""
    run = runs.get(variant)
    assert "lm_head + loss: boost_titan's chunked linear cross-entropy" in run.log
    assert_curves_close(run.losses(), runs.get(reference).losses(), range(1, 11), RTOL, f"{variant} vs {reference}")


@pytest.mark.skipif(not HAS_TORCHAO, reason="[boost] float8 needs torchao (pip install -e '.[fp8]')")
def test_float8_tracks_fp32(runs):
    """``[boost] float8 = "rowwise"`` through torchtitan's loop: the log says what runs; the curve leaves the
    fp32 one (float8 really ran) but stays within float8 tolerance of it, at tp 1 and under btp tp 2,
    whose scales come from each rank's shard (so tp 2 matches tp 1 within float8 tolerance, not exactly)."""
    fp32, tp1, tp2 = runs.get("tp1").losses(), runs.get("tp1_fp8"), runs.get("tp2_fp8")
    for run in (tp1, tp2):
        assert "Projection GEMMs: torchao float8 'rowwise' GEMMs in every projection" in run.log
    assert max(abs(tp1.losses()[s] - fp32[s]) / fp32[s] for s in range(1, 11)) > 1e-5, "float8 did not run"
    # measured: float8 moves this tiny model's loss by ≤ 0.1% over 10 steps (tp 1 and tp 2)
    assert_curves_close(tp1.losses(), fp32, range(1, 11), 1e-2, "tp1 float8 vs fp32")
    assert_curves_close(tp2.losses(), tp1.losses(), range(1, 11), 1e-2, "btp tp2 float8 vs tp1 float8")


def test_clear_errors(runs):
    """Misconfigurations fail before any rank starts (run_train.sh's preflight), each with one line that
    names the bad value and the rule, and no traceback."""
    for name, pattern in [("err_fullrank", r"config error: tp_strategy='fullrank' is for the dense"),
                          ("err_flavor", r"config error: unknown cola_llama flavor 'no_such_flavor'"),
                          ("err_hf_save", r"config error: checkpoint.last_save_in_hf=true saves weights only: "
                                          r"add --checkpoint.last_save_model_only")]:
        run = runs.get(name)
        assert run.returncode == 2, f"{name} did not fail as a config error:\n{run.tail()}"
        assert "Training starts" not in run.log and "Traceback" not in run.log, run.tail()
        assert re.search(pattern, run.log), f"{name}: no error matching {pattern!r} in:\n{run.tail()}"
        assert run.seconds < 30, f"{name} took {run.seconds:.0f} s to fail"


@pytest.mark.parametrize("family", ["cola", "fullrank"])
def test_hf_export_and_import_through_the_loop(runs, family):
    """``--checkpoint.last_save_in_hf`` under tp 2 (btp; the dense twin: Megatron + SP) leaves a complete
    Hugging Face directory (weights gathered from the shards, config.json, CoLA's modeling file);
    ``--checkpoint.initial_load_in_hf`` starts runs from it under another layout (CoLA: tp 1 and btp tp 2;
    the dense twin: Megatron tp 2): the first loss is the exported model's loss on that
    batch as ``transformers`` computes it, and tp 2 follows tp 1. The runs' own (DCP) last saves, from
    tp 1 and tp 2, load as the same full model for generation (boost_titan.checkpoints, generate.py)."""
    import subprocess
    import sys

    import numpy as np
    import torch

    from boost_titan.checkpoints import load_model

    transformers = pytest.importorskip("transformers")
    flavor = "tiny" if family == "cola" else "tiny_fullrank"
    suffix = "" if family == "cola" else "_fullrank"
    export = runs.get(f"hf_export{suffix}").dump / "checkpoint" / f"step-{HF_STEPS}"
    files = sorted(p.name for p in export.iterdir())
    expected = ["config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]
    assert files == sorted(expected + (["modeling_boost_cola.py"] if family == "cola" else [])), files
    tp2s = [runs.get(f"hf_import{suffix}_tp2")]
    tp1 = runs.get("hf_import_tp1") if family == "cola" else None  # the dense twin: tp 2 against transformers alone
    for run in [r for r in (tp1, *tp2s) if r is not None]:
        assert f"loading from HF safetensors from --checkpoint.initial_load_path: {export}" in run.log, run.tail()

    # step 1's batch (SyntheticTokens: seed 42 from COMMON, dp rank 0, samples 0 and 1, seq 64, vocab 512)
    batch = torch.stack([torch.from_numpy(np.random.default_rng([42, 0, 0, k]).integers(0, 512, 65, dtype=np.int64))
                         for k in range(2)])
    model = transformers.AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True, dtype=torch.float32)
    assert type(model).__name__ == ("ColaForCausalLM" if family == "cola" else "LlamaForCausalLM")
    with torch.no_grad():
        logits = model(batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()
    first = tp1 or tp2s[0]
    assert_curves_close(first.losses(), {1: loss}, [1], RTOL, f"{first.name} vs transformers on the export")
    saved = [r.dump / "checkpoint" / f"step-{HF_STEPS}" for r in (tp1, tp2s[0]) if r is not None]
    if tp1 is not None:
        for run in tp2s:
            assert_curves_close(run.losses(), tp1.losses(), range(1, HF_STEPS + 1), RTOL, f"{run.name} vs tp1 import")
        # the imports' last DCP saves (full training state) from tp 1 and tp 2: one model
        one, two = (load_model(path, flavor).state_dict() for path in saved)
        for key, value in one.items():
            torch.testing.assert_close(two[key], value, rtol=1e-4, atol=1e-6, msg=key)
    out = subprocess.run([sys.executable, "scripts/generate.py", str(saved[-1]), "--flavor", flavor, "--tokenizer",
                          "none", "--prompt", "1 2 3", "--max-new-tokens", "4"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and len(out.stdout.strip().splitlines()[-1].split()) == 7, out.stderr[-2000:]


@pytest.mark.parametrize("layout", ["tp2_fsdp2"])
def test_two_nodes_match_one_node(runs, layout):
    """Two run_train.sh launchers as 2 nodes x 2 gloo ranks (NNODES, NODE_RANK, one c10d rendezvous
    endpoint): btp tp 2 inside each node x FSDP across the two gives the per-step losses of the same
    layout launched as one 4-rank node."""
    one_node = {"tp2_fsdp2": "dp2_tp2"}[layout]
    two = runs.get(f"nodes2_{layout}")
    assert_curves_close(two.losses(), runs.get(one_node).losses(), range(1, 11), RTOL,
                        f"{layout}: 2 nodes x 2 ranks vs 1 node x 4")
