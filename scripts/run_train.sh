#!/usr/bin/env bash
# Launch torchtitan's stock training loop on the cola_llama family.
#   NGPU=2 CONFIG_FILE=train_configs/debug_cpu.toml LOG_RANK=0 ./scripts/run_train.sh [--section.key value ...]
# NGPU is the number of ranks: GPUs when CUDA is present, gloo CPU processes otherwise.
# --help: this usage and the [boost] keys (instant); --help-all: every torchtitan option (slow).
set -euo pipefail
cd "$(dirname "$0")/.."

NGPU=${NGPU:-2}
LOG_RANK=${LOG_RANK:-0}
CONFIG_FILE=${CONFIG_FILE:-train_configs/debug_cpu.toml}
TRAIN_FILE=${TRAIN_FILE:-torchtitan_ext.train}  # torchtitan.train, exiting cleanly (see the module)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

for arg in "$@"; do
  case $arg in
    -h|--help)
      echo "usage: [NGPU=ranks] [CONFIG_FILE=file.toml] [LOG_RANK=r] [COMM_MODE=fake_backend] $0 [--section.key value ...]"
      echo "  trains the cola_llama family with torchtitan's loop; configs in train_configs/, any key overridable."
      echo "  --help-all lists all of torchtitan's options (slow: ~20 s, ~900 lines)."
      echo
      python3 torchtitan_ext/job_config.py
      exit 0 ;;
    --help-all)
      exec python3 -m "$TRAIN_FILE" --job.config_file "$CONFIG_FILE" --help ;;
  esac
done
if [ ! -f "$CONFIG_FILE" ]; then
  echo "config error: CONFIG_FILE=$CONFIG_FILE does not exist (the family's configs: $(ls train_configs/*.toml | tr '\n' ' '))" >&2
  exit 2
fi
# one readable line per configuration problem, before any rank starts (torchtitan_ext/preflight.py)
# (it also claims the checkpoint folder for this process, which exec becomes torchrun: one live run per folder)
NGPU=$NGPU BOOST_LAUNCHER_PID=$$ python3 -m torchtitan_ext.preflight --job.config_file "$CONFIG_FILE" "$@" || exit 2

if [ -n "${COMM_MODE:-}" ]; then  # fake_backend: dry-run an NGPU layout in one process
  NGPU=$NGPU LOCAL_RANK=0 exec python3 -m "$TRAIN_FILE" --job.config_file "$CONFIG_FILE" "$@" \
    --comm.mode="$COMM_MODE" --training.steps=1
fi

PYTORCH_ALLOC_CONF="expandable_segments:True" exec python3 -m torch.distributed.run --nproc_per_node="$NGPU" \
  --rdzv_backend c10d --rdzv_endpoint="localhost:0" --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
  -m "$TRAIN_FILE" --job.config_file "$CONFIG_FILE" "$@"
