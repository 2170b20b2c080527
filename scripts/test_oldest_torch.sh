#!/usr/bin/env bash
# The distributed tests again on the oldest torch pyproject.toml allows (2.11.0, the GPU image's
# version), in its own virtual environment .venv-torch2.11. The registry has only its CUDA build
# (a few GB with its dependencies, a minute or two to install); it runs on the CPU. Part of the
# README's test command, so of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
OLDEST=2.11.0
# torchtitan's loop on the oldest torch: one run of each parallelism (tp, FSDP x tp, pp x tp, compile, compiled
# low-rank checkpointing). The newest torch runs every variant (bf16, float8, checkpoint + resume included), and
# what is plain autograd or launcher / adapter code (the fused loss, HF export / import, two nodes) only there.
E2E_NEWEST_ONLY="sync or ungrouped or Interleaved or ac_full or ac_selective or tied or default_configs"
E2E_NEWEST_ONLY="$E2E_NEWEST_ONLY or lowrank_checkpoint_composes or clear_errors or main_job or fullrank"
E2E_NEWEST_ONLY="$E2E_NEWEST_ONLY or compile_budget or bf16 or float8 or hf_export or two_nodes"
E2E_NEWEST_ONLY="$E2E_NEWEST_ONLY or checkpoint_resume or ckpt"
python3 -m venv .venv-torch2.11
. .venv-torch2.11/bin/activate
pip install -q torch==$OLDEST -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
python -c "import torch; assert torch.__version__.startswith('$OLDEST'), torch.__version__"
python -m pytest -q -n 2 --dist loadfile tests/test_tp_parity.py tests/test_rmsnorm.py tests/test_activation_checkpoint.py \
  tests/test_comm_accounting.py tests/test_comm_model.py tests/test_mixed_precision.py tests/test_examples.py \
  tests/test_emulate_stages.py tests/test_float8.py tests/test_local_shards.py tests/test_torchtitan_e2e.py \
  tests/test_overlap.py tests/test_compat.py -k "not fused_cross_entropy and not (test_torchtitan_e2e and ($E2E_NEWEST_ONLY))"
