#!/usr/bin/env bash
# The distributed tests again on the oldest torch pyproject.toml allows (2.11.0, the GPU image's
# version), in its own virtual environment .venv-torch2.11. The registry has only its CUDA build
# (a few GB with its dependencies, a minute or two to install); it runs on the CPU. Part of the
# README's test command, so of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
OLDEST=2.11.0
python3 -m venv .venv-torch2.11
. .venv-torch2.11/bin/activate
pip install -q torch==$OLDEST -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
python -c "import torch; assert torch.__version__.startswith('$OLDEST'), torch.__version__"
python -m pytest -q tests/test_tp_parity.py tests/test_rmsnorm.py tests/test_activation_checkpoint.py \
  tests/test_comm_accounting.py tests/test_comm_model.py tests/test_mixed_precision.py tests/test_examples.py \
  tests/test_emulate_stages.py tests/test_float8.py tests/test_local_shards.py tests/test_torchtitan_e2e.py \
  tests/test_overlap.py tests/test_compat.py -k "not fused_cross_entropy and not hf_export and not two_nodes"
# once, on the newest torch: the fused loss (plain autograd), the HF export / import and the two-node launch
# through the loop (launcher and adapter code; the HF save also ran on 2.11 on the GPU box)
