"""``[boost] cudagraphs`` on a GPU: replaying the compiled blocks as CUDA graphs does not change training.

GPU-only (CPU CI skips it; the CPU-side errors are in ``test_preflight.py``). One GPU, torchtitan's
loop, CoLA debugmodel compiled with and without the graphs from the same seed: the bf16 losses of every
step agree within bf16 noise. Emulated multi-GPU runs cannot show this: on the fake backend the
all-gathered weights are partly uninitialised memory, so their losses depend on the allocator.
"""

import pytest
import torch

from conftest import run_train, run_trains_together

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device"),
              pytest.mark.gpu]  # its training runs keep the GPU (conftest.gpus_for_gpu_tests)


def _losses(dump, *extra: str) -> dict[int, float]:
    args = ["--model.flavor", "debugmodel", "--training.seq_len", "256", "--training.local_batch_size", "2",
            "--training.steps", "8", "--metrics.log_freq", "1", "--debug.seed", "42", "--compile.enable",
            "--job.dump_folder", str(dump), *extra]
    code, log, losses = run_train(args, ngpu=1, CONFIG_FILE="train_configs/cola_1b_h200.toml")
    assert code == 0, log[-6000:]
    return losses


def test_cudagraphs_train_like_the_compiled_blocks(tmp_path):
    plain, graphs = run_trains_together(lambda: _losses(tmp_path / "plain"),
                                        lambda: _losses(tmp_path / "graphs", "--boost.cudagraphs"))
    assert sorted(plain) == sorted(graphs) == list(range(1, 9))
    for step in plain:  # the same kernels, replayed; two runs differ only by nondeterministic (atomic) reductions
        assert graphs[step] == pytest.approx(plain[step], rel=2e-2), (step, plain, graphs)
