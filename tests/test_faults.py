"""Faults around a run (CPU, gloo, torchtitan's loop through scripts/run_train.sh; faults injected here)."""

import os
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model.flavor", "tiny", "--training.dataset", "synthetic", "--boost.tokenizer", "none",
        "--boost.synthetic_vocab_size", "512", "--training.seq_len", "64", "--training.local_batch_size", "2",
        "--metrics.log_freq", "1"]


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


def test_ranks_exit_when_the_launcher_is_killed(tmp_path):
    """SIGKILL of torchrun (the launcher) mid-training: both ranks are gone within seconds, instead of
    training on, parented to init (torchrun starts each worker in a session of its own)."""
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(["./scripts/run_train.sh", *TINY, "--training.steps", "2000",
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
