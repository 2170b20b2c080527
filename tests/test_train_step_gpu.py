"""The trainer's sync-free train step on a GPU: its pinned, non-blocking host-to-device copies feed the
same batches as torchtitan 0.2.2's own step (``tests/stock_trainer.py``).

GPU-only (CPU CI skips it; there the copies are plain ``.to`` and ``test_torchtitan_e2e.py``
compares the two steps bit for bit, with FSDP2 and gradient accumulation). One GPU, torchtitan's
loop, CoLA debugmodel compiled, same seed, 2 microbatches per step: the bf16 losses of every step agree
within the noise of nondeterministic (atomic) reductions.
"""

import pytest
import torch

from conftest import run_train, run_trains_together

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned copies need a CUDA device"),
              pytest.mark.gpu]  # its training runs keep the GPU (conftest.gpus_for_gpu_tests)


def _losses(dump, **env: str) -> dict[int, float]:
    args = ["--model.flavor", "debugmodel", "--training.seq_len", "256", "--training.local_batch_size", "2",
            "--training.global_batch_size", "4", "--training.steps", "8", "--metrics.log_freq", "1",
            "--debug.seed", "42", "--compile.enable", "--job.dump_folder", str(dump)]
    code, log, losses = run_train(args, ngpu=1, CONFIG_FILE="train_configs/cola_1b_h200.toml", **env)
    assert code == 0, log[-6000:]
    return losses


def test_sync_free_step_trains_like_torchtitans(tmp_path):
    ours, stock = run_trains_together(lambda: _losses(tmp_path / "ours"),
                                      lambda: _losses(tmp_path / "stock", TRAIN_FILE="tests.stock_trainer"))
    assert sorted(ours) == sorted(stock) == list(range(1, 9))
    for step in ours:
        assert ours[step] == pytest.approx(stock[step], rel=2e-2), (step, ours, stock)
