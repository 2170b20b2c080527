"""Playing a later pipeline stage on the fake backend (torchtitan_ext.runtime.emulate): the stage's input shape,
which a real run receives from the previous stage, is supplied for the family's residual stream."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.pipelining.stage import PipelineStage

from conftest import ROOT

HOOK = hasattr(PipelineStage, "_shape_inference")  # torch 2.11's pipelining (the GPU image's)


def job(tp: int, strategy: str, dtype: str = "bfloat16"):
    return SimpleNamespace(
        parallelism=SimpleNamespace(pipeline_parallel_microbatch_size=2, tensor_parallel_degree=tp),
        training=SimpleNamespace(seq_len=64, mixed_precision_param=dtype), boost=SimpleNamespace(tp_strategy=strategy))


@pytest.mark.parametrize("tp, strategy, shape", [(1, "btp", [2, 64, 256]), (4, "btp", [2, 64, 64]),
                                                 (4, "fullrank", [2, 16, 256]), (4, "vanilla", [2, 64, 256])])
def test_stage_input_is_the_residual_stream_in_the_strategy_layout(tp, strategy, shape):
    """btp keeps d sharded between blocks, Megatron + SP the sequence, vanilla nothing."""
    from torchtitan_ext.cola_llama.parallelize import stage_input

    t = stage_input(job(tp, strategy), dim=256)
    assert list(t.shape) == shape and t.dtype == torch.bfloat16 and t.device.type == "meta"


@pytest.mark.skipif(not HOOK, reason="later stages are emulated through torch 2.11's PipelineStage._shape_inference")
def test_every_stage_of_a_tp2_pp2_layout_runs_on_the_fake_backend(tmp_path):
    out = tmp_path / "stages"
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.emulate", "--rows", "tiny_pp:btp", "--batch", "2",
                           "--seq-len", "64", "--steps", "3", "--skip", "1", "--stages",
                           "--extra=--boost.synthetic_vocab_size 512 --compile.no-enable", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.with_suffix(".json").read_text())
    from scripts.bench.emulate import STAGES_HEADING

    stages = data["sections"][STAGES_HEADING]
    assert [(r["stage"], r["emulated_rank"], r["ok"]) for r in stages] == [(0, 0, True), (1, 2, True)], stages
    assert all(r["step_s"] > 0 for r in stages)
    assert data["rows"][0]["ok"]  # the pipeline-free row of the same layout still runs


@pytest.mark.skipif(HOOK, reason="torch 2.11 has the hook")
def test_later_stage_without_the_hook_fails_with_one_line():
    from torchtitan_ext.runtime import emulate

    with pytest.raises(RuntimeError, match=r"EMULATE_RANK=\d+ may hold a later pipeline stage.*use torch 2.11"):
        emulate.RANK = 2
        try:
            emulate._check_stage_emulation(SimpleNamespace(parallelism=SimpleNamespace(pipeline_parallel_degree=2)))
        finally:
            emulate.RANK = 0
