#!/usr/bin/env bash
# Launch torchtitan's stock training loop on the cola_llama family.
#   NGPU=2 CONFIG_FILE=train_configs/debug_cpu.toml LOG_RANK=0 ./scripts/run_train.sh [--section.key value ...]
# NGPU is the number of ranks: GPUs when CUDA is present, gloo CPU processes otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

NGPU=${NGPU:-2}
LOG_RANK=${LOG_RANK:-0}
CONFIG_FILE=${CONFIG_FILE:-train_configs/debug_cpu.toml}
TRAIN_FILE=${TRAIN_FILE:-torchtitan.train}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ -n "${COMM_MODE:-}" ]; then  # fake_backend: dry-run an NGPU layout in one process
  NGPU=$NGPU LOCAL_RANK=0 exec python3 -m "$TRAIN_FILE" --job.config_file "$CONFIG_FILE" "$@" \
    --comm.mode="$COMM_MODE" --training.steps=1
fi

PYTORCH_ALLOC_CONF="expandable_segments:True" exec python3 -m torch.distributed.run --nproc_per_node="$NGPU" \
  --rdzv_backend c10d --rdzv_endpoint="localhost:0" --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
  -m "$TRAIN_FILE" --job.config_file "$CONFIG_FILE" "$@"
