"""Shared test helpers (pytest loads this file first; test modules import from it as ``conftest``):
the repository root, the tiny model shapes, running a function on N gloo ranks (CPU), a free port,
a run of ``scripts/run_train.sh`` with its per-step losses, the fp32-vs-fp64 reassociation bound, and
a recorder of the aten ops a block of code dispatches.

On a GPU machine the CPU tests stay on the CPU: a test and the processes it starts see no GPU unless
the test is marked ``gpu`` (``gpus_for_gpu_tests``)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from boost_titan.models import TransformerArgs

ROOT = Path(__file__).resolve().parents[1]  # the repository: cwd of every subprocess the tests start

# On a GPU machine the CPU tests stay on the CPU: every process the tests start (torchtitan's loop, a
# gloo rank, a benchmark, an example under torchrun; from a test or from a module's shared fixture)
# sees no GPU, since torchtitan and torchrun pick CUDA and NCCL wherever one is visible, and several
# ranks cannot share one GPU. The machine's GPUs are kept in MACHINE_GPUS_VAR: pytest-xdist starts its
# workers after the main process has loaded this file, so a worker inherits the hidden value.
MACHINE_GPUS_VAR = "BOOST_TESTS_CUDA_VISIBLE_DEVICES"
_UNSET = "<unset>"
os.environ.setdefault(MACHINE_GPUS_VAR, os.environ.get("CUDA_VISIBLE_DEVICES", _UNSET))
VISIBLE_AT_START = None if os.environ[MACHINE_GPUS_VAR] == _UNSET else os.environ[MACHINE_GPUS_VAR]


def _show_machine_gpus(setenv, delenv) -> None:
    if VISIBLE_AT_START is None:
        delenv("CUDA_VISIBLE_DEVICES")
    else:
        setenv("CUDA_VISIBLE_DEVICES", VISIBLE_AT_START)


# The test process finds the machine's GPUs first: CUDA reads CUDA_VISIBLE_DEVICES once, when it
# starts, which is_available() does; then the variable hides them from every process started later.
_show_machine_gpus(os.environ.__setitem__, lambda name: os.environ.pop(name, None))
torch.cuda.is_available()
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# torch.compile's kernels compile in the rank's own process: by default each rank starts a pool of one
# worker per core, and on a many-core machine the concurrent runs' pools (each worker importing torch)
# cost more than the tiny models' few kernels
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


@pytest.fixture(autouse=True)
def gpus_for_gpu_tests(request, monkeypatch):
    """A test marked ``gpu`` gets the machine's GPUs back, for the processes it starts and for itself:
    torch.cuda.device_count() reads the variable again until CUDA is initialised."""
    if request.node.get_closest_marker("gpu") is not None:
        _show_machine_gpus(monkeypatch.setenv, monkeypatch.delenv)


# The model of the in-process tests: divisible by tp 2/4/8 where a strategy shards it; attn_rank ≠
# mlp_rank so a mix-up shows. (The runs of torchtitan's loop use the "tiny" flavor, TINY_RUN below.)
TINY = TransformerArgs(dim=64, n_layers=2, n_heads=8, ffn_dim=96, vocab_size=128, attn_rank=16, mlp_rank=24)


def run_train(args: list[str], ngpu: int, timeout: int = 600, **env: str) -> tuple[int, str, dict[int, float]]:
    """``scripts/run_train.sh`` with these overrides on ``ngpu`` ranks (more environment in ``env``):
    its return code, its log (stdout + stderr) and the loss of each logged step."""
    proc = subprocess.run(["./scripts/run_train.sh", *args], cwd=ROOT, env={**os.environ, "NGPU": str(ngpu), **env},
                          capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    losses = {int(s): float(v) for s, v in re.findall(r"step:\s*(\d+)\s+loss:\s*(\S+)", log)}
    return proc.returncode, log, losses


def run_trains_together(*runs):
    """Call each ``run`` (a function that starts one training run and returns its result) in a thread of
    its own, all at once: a GPU test's runs are processes of their own that spend most of their time
    compiling on the CPU, which a many-core GPU machine can do for two at once. Their results, in order."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        return [f.result() for f in [pool.submit(run) for run in runs]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, fn, args, errors, cuda):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # torchtitan reads the device type at import (unpickling fn imports its test module): no GPU seen
    assert cuda or (os.environ.get("CUDA_VISIBLE_DEVICES") == "" and not torch.cuda.is_available())
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    except BaseException:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()
    # Done and checked: leave without interpreter finalization, where gloo's worker threads can still
    # be torn down and abort the process ("terminate called without an active exception", SIGABRT;
    # seen once in CI after passing runs; the mechanism: pytorch/pytorch#179291).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_distributed(fn, world_size: int, *args, cuda: bool = False) -> None:
    """Spawn ``world_size`` gloo processes running ``fn(rank, world_size, *args)``; re-raise any failure.
    They see no GPU unless ``cuda``: a test marked ``gpu`` runs its CUDA arm (``gpus_for_gpu_tests``)."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    port = free_port()
    try:
        mp.start_processes(_worker, args=(world_size, port, fn, args, errors, cuda), nprocs=world_size,
                           join=True, start_method="spawn")
    except Exception as exc:
        msgs = []
        while not errors.empty():
            msgs.append(errors.get())
        raise AssertionError("\n".join(msgs) or str(exc)) from None


FP32_UNIT_ROUNDOFF = 2.0 ** -24


def assert_fp32_reassociation_close(got: torch.Tensor, ref64: torch.Tensor, n: int, msg: str = "") -> None:
    """fp32 ``got`` equals the fp64 ``ref64`` of the same math up to the rounding of fp32 sums.

    A sum of ``n`` products, evaluated in fp32 in *any* order (eager, or code a compiler fused and
    reassociated), is within γ_n·Σ|terms| of the exact sum, γ_n = n·u/(1 − n·u), u = 2⁻²⁴ (Higham,
    *Accuracy and Stability of Numerical Algorithms*, §3.1). We take the terms' scale as the
    tensor's largest entry and ``n`` as the longest reduction the computation chains, so each element
    may be off by γ_n·max|ref64|: an element whose own value cancels to near zero may carry a large
    *relative* error (the flaky elementwise ``rtol`` this replaces), a wrong collective or a missing
    term is off by O(max|ref64|) and still fails.
    """
    gamma = n * FP32_UNIT_ROUNDOFF / (1 - n * FP32_UNIT_ROUNDOFF)
    tol = gamma * ref64.abs().max().item()
    err = (got.double() - ref64).abs().max().item()
    assert err <= tol, f"{msg}: max |fp32 − fp64| = {err:.3g} > γ_{n}·max|ref| = {tol:.3g}"


# torchtitan's loop on the "tiny" flavor with synthetic tokens: the fastest run that trains
TINY_RUN = ["--model.flavor", "tiny", "--training.dataset", "synthetic", "--boost.tokenizer", "none",
            "--boost.synthetic_vocab_size", "512", "--training.seq_len", "64", "--training.local_batch_size", "2",
            "--metrics.log_freq", "1"]


# The slowest modules first, so that under pytest-xdist (``-n 2 --dist loadfile``: one module per worker
# at a time) they do not start last and leave one worker idle at the end.
SLOWEST_FIRST = ("test_torchtitan_e2e.py", "test_faults.py", "test_bench_scripts.py", "test_multinode.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


class DispatchedOps(TorchDispatchMode):
    """``with DispatchedOps() as ops:`` records the name of every aten op the block dispatches
    (``ops.names``), e.g. to count the kernels a code path issues."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
