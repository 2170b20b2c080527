"""``[boost] cudagraphs`` on a GPU: replaying the compiled blocks as CUDA graphs does not change training.

GPU-only (CPU CI skips it; the CPU-side errors are in ``test_preflight.py``). One GPU, torchtitan's
loop, CoLA debugmodel compiled with and without the graphs from the same seed: the bf16 losses of every
step agree within bf16 noise. Emulated multi-GPU runs cannot show this: on the fake backend the
all-gathered weights are partly uninitialised memory, so their losses depend on the allocator.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+)")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _losses(tmp_path: Path, *extra: str) -> dict[int, float]:
    env = {**os.environ, "NGPU": "1", "CONFIG_FILE": "train_configs/cola_1b_h200.toml"}
    cmd = ["./scripts/run_train.sh", "--model.flavor", "debugmodel", "--training.seq_len", "256",
           "--training.local_batch_size", "2", "--training.steps", "8", "--metrics.log_freq", "1",
           "--debug.seed", "42", "--compile.enable", "--job.dump_folder", str(tmp_path), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {int(m.group(1)): float(m.group(2)) for line in (proc.stdout + proc.stderr).splitlines()
            if (m := _STEP.search(line))}


def test_cudagraphs_train_like_the_compiled_blocks(tmp_path):
    plain = _losses(tmp_path / "plain")
    graphs = _losses(tmp_path / "graphs", "--boost.cudagraphs")
    assert sorted(plain) == sorted(graphs) == list(range(1, 9))
    for step in plain:  # same kernels, replayed: only bf16 rounding of a different reduction order may differ
        assert graphs[step] == pytest.approx(plain[step], rel=2e-2), (step, plain, graphs)
