"""Faults around a run (CPU, gloo, torchtitan's loop through scripts/run_train.sh; faults injected here)."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY_RUN


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too (its parent, killed, cannot reap it until init does)
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.e2e
def test_ranks_exit_when_the_launcher_is_killed(tmp_path):
    """SIGKILL of torchrun (the launcher) mid-training: both ranks are gone within seconds, instead of
    training on, parented to init (torchrun starts each worker in a session of its own)."""
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(["./scripts/run_train.sh", *TINY_RUN, "--training.steps", "2000",
                             "--job.dump_folder", str(tmp_path / "dump")], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "NGPU": "2"}, start_new_session=True)
    workers = []
    try:
        deadline = time.monotonic() + 120
        while "step:  3" not in (tmp_path / "run.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()[-3000:]
            time.sleep(0.5)
        workers = _children(proc.pid)  # run_train.sh exec'd torchrun: proc.pid is the launcher
        assert len(workers) == 2, workers
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 15
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), "ranks outlived their launcher"
    finally:
        for pid in [proc.pid, *_children(proc.pid), *workers]:  # never leave an orphan behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


@pytest.mark.e2e
def test_one_live_run_per_checkpoint_folder(tmp_path):
    """A folder held by a live process refuses a second run with one line naming it; a lock left by
    a dead run (or a reused pid) is taken over."""
    import json
    import socket

    from torchtitan_ext.runtime.faults import claim_checkpoint_folder, lock_path

    folder = tmp_path / "dump" / "checkpoint"
    assert claim_checkpoint_folder(str(folder), os.getpid()) is None  # this test's process holds it
    assert not folder.exists()  # torchtitan would take an existing folder for a run to resume
    lock_file = Path(lock_path(str(folder)))
    lock = json.loads(lock_file.read_text())
    assert lock["host"] == socket.gethostname() and lock["pid"] == os.getpid()

    proc = subprocess.run(["./scripts/run_train.sh", *TINY_RUN, "--training.steps", "2", "--checkpoint.enable",
                           "--job.dump_folder", str(tmp_path / "dump")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NGPU": "2"}, timeout=120)
    assert proc.returncode == 2 and "Training starts" not in proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"is held by a live run (host {socket.gethostname()}, pid {os.getpid()}, since {lock['since']})" in line

    dead = subprocess.Popen(["true"])
    dead.wait()
    lock_file.write_text(json.dumps({**lock, "pid": dead.pid}))  # its run is gone
    assert claim_checkpoint_folder(str(folder), 424242) is None
    assert json.loads(lock_file.read_text())["pid"] == 424242
    lock_file.write_text(json.dumps({**lock, "start_time": "1"}))  # same pid, another process
    assert claim_checkpoint_folder(str(folder), 424243) is None


def _blow_up(tmp_path, *extra):
    """A run whose weights explode at step 1 (lr 1e30): step 2's loss and gradients are nan."""
    return subprocess.run(["./scripts/run_train.sh", *TINY_RUN, "--training.steps", "5", "--optimizer.lr", "1e30",
                           "--lr_scheduler.warmup_steps", "0", "--checkpoint.enable", "--checkpoint.interval", "1",
                           "--job.dump_folder", str(tmp_path / "dump"), *extra], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "NGPU": "2"}, timeout=200)


def _model_weights(folder: Path) -> dict:
    """A DCP checkpoint's model tensors (converted to one torch.save file)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = folder.parent / (folder.name + ".pt")
    dcp_to_torch_save(str(folder), str(out))
    state = torch.load(out, weights_only=False)
    state = state.get("model", state)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}


@pytest.mark.e2e
def test_nonfinite_gradient_stops_without_applying_it(tmp_path):
    """Fused AdamW (torchtitan's default): step 2 is skipped on the device, its flag read at step 3, where
    the run stops naming step 2; the checkpoint of step 2 holds step 1's weights, all finite."""
    import torch

    proc = _blow_up(tmp_path)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if "non-finite loss or gradient at step" in line]
    assert lines and all("at step 2: its optimizer step was not applied; stopping" in line for line in lines), out[-2000:]
    assert "Traceback" not in out.split("non-finite loss or gradient")[0][-2000:]
    folder = tmp_path / "dump" / "checkpoint"
    saved = sorted(p.name for p in folder.glob("step-*"))
    assert saved == ["step-1", "step-2"], saved
    one, two = _model_weights(folder / "step-1"), _model_weights(folder / "step-2")
    assert one.keys() == two.keys() and one
    for name in one:
        assert torch.isfinite(two[name]).all(), name
        assert torch.equal(one[name], two[name]), name


@pytest.mark.e2e
def test_nonfinite_gradient_stops_before_its_checkpoint_without_fused_adamw(tmp_path):
    """Any other optimizer implementation: the flag is read before the step (one host sync), the run stops
    there and nothing is written from the non-finite step."""
    proc = _blow_up(tmp_path, "--optimizer.implementation", "foreach")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if "non-finite loss or gradient at step" in line]
    assert lines and all("at step 2: stopping before its optimizer step" in line for line in lines), out[-2000:]
    saved = sorted(p.name for p in (tmp_path / "dump" / "checkpoint").glob("step-*"))
    assert saved == ["step-1"], saved


@pytest.mark.e2e
def test_nonfinite_steps_can_be_skipped(tmp_path):
    """Every step after the blow-up is skipped and named; the last one's flag is read at exit."""
    proc = _blow_up(tmp_path, "--boost.skip_nonfinite_steps")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    skipped = [line for line in proc.stdout.splitlines() if "step skipped" in line and "[rank0]" in line]
    assert [line.split("at step ")[1].split(":")[0] for line in skipped] == ["2", "3", "4", "5"], skipped


@pytest.mark.parametrize("fused", [True, False])
def test_guard_skips_a_step_exactly(fused, monkeypatch):
    """In process, one rank: a step with a nan gradient changes no weight and no optimizer state (step
    counter included); the run then matches AdamW that never saw that step, to the bit. Fused: the
    kernel skips it (found_inf) and the guard names it at the next step; otherwise before the step."""
    import torch
    from torchtitan.tools.logging import logger

    from torchtitan_ext.runtime.faults import NonFiniteGuard

    warnings = []
    monkeypatch.setattr(logger, "warning", warnings.append)

    def run(steps_with_nan, guard: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, fused=fused, foreach=False if fused else True)
        if guard:
            opt.register_step_pre_hook(NonFiniteGuard([model], skip=True))
        data = torch.Generator().manual_seed(1)
        for step in range(1, 6):
            x = torch.randn(4, 8, generator=data)
            model(x).square().mean().backward()
            if step in steps_with_nan:
                model[0].weight.grad[0, 0] = float("nan")
            if step in steps_with_nan and not guard:
                opt.zero_grad()
                continue  # the reference: that step never happened
            opt.step()
            opt.zero_grad()
        return model, opt

    guarded, g_opt = run({2, 3}, guard=True)
    reference, r_opt = run({2, 3}, guard=False)
    for p, q in zip(guarded.parameters(), reference.parameters()):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(g_opt.state[p][key], r_opt.state[q][key]), key
    assert int(g_opt.state[next(guarded.parameters())]["step"]) == 3
    assert warnings == [f"non-finite gradient at step {s}: step skipped (weights and optimizer state kept)"
                        for s in (2, 3)]


def test_guard_reads_the_clipping_norm_while_its_gradients_are_unchanged(monkeypatch):
    """The loop's clipping (through the family's wrapper of torchtitan's ``clip_grad_norm_``) hands its
    all-reduced norm to the guard, which then makes no norm pass of its own; a gradient changed after
    the clipping, or a step without clipping, makes the guard compute its own flag again."""
    import torch
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.tools.logging import logger

    from torchtitan_ext.cola_llama import spec as train_spec
    from torchtitan_ext.cola_llama.hand_offs import HandOffs
    from torchtitan_ext.runtime import faults

    monkeypatch.setattr(dist_utils, "clip_grad_norm_", dist_utils.clip_grad_norm_)  # undone after the test
    hand_offs = HandOffs()
    train_spec.clip_on_local_shards(hand_offs)
    norm_passes = []
    foreach_norm = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm", lambda *a, **k: norm_passes.append(1) or foreach_norm(*a, **k))
    warnings = []
    monkeypatch.setattr(logger, "warning", warnings.append)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=0.1, fused=True)
    guard = faults.NonFiniteGuard([model], skip=True, hand_offs=hand_offs)
    opt.register_step_pre_hook(guard)

    def step(clip=True, after_clip=None):
        """One step; returns (guard's own norm passes, whether the weights changed)."""
        opt.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        if clip:
            expected = torch.nn.utils.get_total_norm([p.grad for p in params])
            assert torch.equal(dist_utils.clip_grad_norm_(params, 1e9, foreach=True), expected)
        if after_clip is not None:
            after_clip()
        before, passes = [p.detach().clone() for p in params], len(norm_passes)
        opt.step()
        guard.check()
        return len(norm_passes) - passes, not all(torch.equal(a, b) for a, b in zip(before, params))

    assert step() == (0, True)  # the clipping's norm served: no pass of the guard's own
    # the flag comes from that norm: a non-finite one noted for finite gradients skips the step
    assert step(after_clip=lambda: hand_offs.note_clip(params, torch.tensor(float("nan")))) == (0, False)
    # a gradient changed in place after the clipping: the guard computes its own flag, sees the nan
    assert step(after_clip=lambda: model.weight.grad.view(-1)[0].fill_(float("nan"))) == (1, False)
    # a replaced gradient, or no clipping at all: its own pass too
    assert step(after_clip=lambda: setattr(model.bias, "grad", model.bias.grad.clone())) == (1, True)
    assert step(clip=False) == (1, True)
    assert warnings == [f"non-finite gradient at step {s}: step skipped (weights and optimizer state kept)"
                        for s in (2, 3)]


def test_guard_stop_names_the_step(capsys):
    """Stop mode with fused AdamW: the bad step is not applied and the next step's hook stops, naming it;
    with nothing after it, the exit check does."""
    import torch

    from torchtitan_ext.runtime.faults import NonFiniteGuard, check_nonfinite_at_exit

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    guard = NonFiniteGuard([model])
    opt.register_step_pre_hook(guard)
    for step in (1, 2):
        model(torch.ones(2, 4)).sum().backward()
        if step == 2:
            model.bias.grad.fill_(float("inf"))
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # step 2 not applied
    with pytest.raises(SystemExit) as stop:
        check_nonfinite_at_exit(guard.hand_offs)
    assert stop.value.code == 3
    assert "non-finite loss or gradient at step 2: its optimizer step was not applied; stopping" in capsys.readouterr().err


def _metrics(log: str) -> dict[int, str]:
    out = {}
    for line in log.splitlines():
        m = re.search(r"step:\s*(\d+)\s+(loss:\s*\S+\s+grad_norm:\s*\S+)", line)
        if m and "[rank0]" in line:
            out[int(m.group(1))] = m.group(2)
    return out


RESUME_ARGS = [*TINY_RUN, "--parallelism.tensor_parallel_degree", "2", "--training.steps", "30", "--checkpoint.enable",
               "--checkpoint.interval", "5", "--debug.seed", "7"]

# injected into the ranks of one run by the test (a sitecustomize on their PYTHONPATH): the process that
# writes DCP's metadata dies right before writing it, in the save of step 10 (data files already written)
CRASH_IN_SAVE = """
import os
from torch.distributed.checkpoint import filesystem

_finish = filesystem._FileSystemWriter.finish

def finish(self, metadata, results):
    if "step-10" in str(self.path):
        os._exit(9)
    return _finish(self, metadata, results)

filesystem._FileSystemWriter.finish = finish
"""


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """loss and grad norm as printed at steps 1-30 of the run nothing interrupts."""
    dump = tmp_path_factory.mktemp("uninterrupted")
    ref = subprocess.run(["./scripts/run_train.sh", *RESUME_ARGS, "--job.dump_folder", str(dump)], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "NGPU": "2"}, timeout=300)
    assert ref.returncode == 0, ref.stdout[-2000:]
    expected = _metrics(ref.stdout)
    assert sorted(expected) == list(range(1, 31))
    return expected


def _run_until_killed(tmp_path, run, step: int, env) -> None:
    """Start ``run``; SIGKILL the launcher once step ``step`` is logged; wait for the ranks to go."""
    log = open(tmp_path / "b.log", "w")
    proc = subprocess.Popen(["./scripts/run_train.sh", *run], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    workers = []
    try:
        deadline = time.monotonic() + 120
        while not re.search(rf"step:\s+{step}\s", (tmp_path / "b.log").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "b.log").read_text()[-2000:]
            time.sleep(0.2)
        workers = _children(proc.pid)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 15
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


@pytest.mark.e2e
def test_killed_run_resumes_bit_exactly(tmp_path, uninterrupted):
    """SIGKILL of the launcher once step 8 of 30 is logged (checkpoints every 5 steps): the same command
    again resumes from the newest complete checkpoint (step-5 or later: the run may have got further
    before the kill landed) and reproduces the uninterrupted run's loss and gradient norm at every
    step after it, to the printed digit."""
    run, env = [*RESUME_ARGS, "--job.dump_folder", str(tmp_path / "b")], {**os.environ, "NGPU": "2"}
    _run_until_killed(tmp_path, run, 8, env)
    saved = [int(p.name.split("-")[1]) for p in (tmp_path / "b" / "checkpoint").glob("step-*")
             if (p / ".metadata").is_file()]
    latest = max(saved)
    assert 5 <= latest < 30, saved
    again = subprocess.run(["./scripts/run_train.sh", *run], cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=300)
    assert again.returncode == 0, again.stdout[-2000:]
    assert f"Training starts at step {latest + 1}" in again.stdout, again.stdout[-2000:]
    assert _metrics(again.stdout) == {s: uninterrupted[s] for s in range(latest + 1, 31)}


@pytest.mark.e2e
def test_crash_during_a_save_resumes_from_the_last_complete_checkpoint(tmp_path, uninterrupted):
    """A rank dies inside the save of step 10, after its data files and before DCP's metadata (which
    DCP writes last): the run fails, step-10 stays without metadata, and the same command again
    resumes from step-5 and reproduces steps 6-30 bit-exactly."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(CRASH_IN_SAVE)
    run, env = [*RESUME_ARGS, "--job.dump_folder", str(tmp_path / "b")], {**os.environ, "NGPU": "2"}
    crashed = subprocess.run(["./scripts/run_train.sh", *run], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**env, "PYTHONPATH": f"{tmp_path / 'inject'}:{env.get('PYTHONPATH', '')}"})
    assert crashed.returncode != 0 and "step: 10" in crashed.stdout, crashed.stdout[-2000:]
    step10 = tmp_path / "b" / "checkpoint" / "step-10"
    assert step10.is_dir() and any(step10.iterdir()) and not (step10 / ".metadata").exists()
    again = subprocess.run(["./scripts/run_train.sh", *run], cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=300)
    assert again.returncode == 0, again.stdout[-2000:]
    assert "Training starts at step 6" in again.stdout, again.stdout[-2000:]
    assert _metrics(again.stdout) == {s: uninterrupted[s] for s in range(6, 31)}


@pytest.mark.e2e
def test_rank_with_too_little_data_fails_with_one_line(tmp_path):
    """Two documents, two data-parallel ranks, and fewer tokens per rank than one batch: each rank stops
    before training with one line naming the dataset, the rank and the counts (no traceback of its own)."""
    short = tmp_path / "train.jsonl"
    short.write_text('{"text": "a few words only"}\n{"text": "and a few more"}\n')
    proc = subprocess.run(["./scripts/run_train.sh", "--parallelism.tensor_parallel_degree", "1", "--training.dataset",
                           "corpus", "--training.dataset_path", str(short), "--training.steps", "2",
                           "--job.dump_folder", str(tmp_path / "dump")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NGPU": "2", "LOG_RANK": "0,1"}, timeout=200)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Training starts" not in out
    lines = [line for line in out.splitlines() if "data error: corpus: DP rank" in line]
    assert lines and all("tokens, fewer than one batch (4 x 257)" in line for line in lines), out[-2000:]
    assert not any(line.startswith("[rank") and "Traceback" in line for line in out.splitlines()), out[-3000:]
    # (torchrun's own launcher then reports the failed child with its traceback: its behaviour, not the rank's)
