"""``[boost] step_cudagraph`` on a GPU: the captured and replayed train step trains as the plain one.

GPU-only (CPU CI skips it; the uncaptured step through the same buffers is compared bit for bit on the
CPU in ``test_torchtitan_e2e.py::test_step_graph_runs_the_plain_step``, the errors in
``test_preflight.py``). One GPU, torchtitan's loop, CoLA debugmodel with compiled blocks, with and without
the step graph from the same seed: steps 1–2 run eagerly, step 3 is captured, steps 3–10 are replays. The
bf16 losses of every step agree within bf16 noise, and the run logs the capture.
"""

import pytest
import torch

from conftest import run_train, run_trains_together

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device"),
              pytest.mark.gpu]  # its training runs keep the GPU (conftest.gpus_for_gpu_tests)


def _run(dump, *extra: str):
    args = ["--model.flavor", "debugmodel", "--training.seq_len", "256", "--training.local_batch_size", "2",
            "--training.steps", "10", "--metrics.log_freq", "1", "--debug.seed", "42", "--compile.enable",
            "--job.dump_folder", str(dump), *extra]
    code, log, losses = run_train(args, ngpu=1, CONFIG_FILE="train_configs/cola_1b_h200.toml")
    assert code == 0, log[-6000:]
    return log, losses


def test_step_graph_trains_like_the_plain_step(tmp_path):
    (_, plain), (log, graph) = run_trains_together(lambda: _run(tmp_path / "plain"),
                                                   lambda: _run(tmp_path / "graph", "--boost.step_cudagraph"))
    assert "captured the train step as a CUDA graph" in log
    assert sorted(plain) == sorted(graph) == list(range(1, 11))
    assert len(set(graph.values())) == 10  # the replays train (a stale graph would repeat its loss)
    for step in plain:  # same kernels; two runs differ by nondeterministic reductions and the fp32 rate
        assert graph[step] == pytest.approx(plain[step], rel=2e-2), (step, plain, graph)
