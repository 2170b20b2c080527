#!/usr/bin/env bash
# Launch torchtitan's stock training loop on the cola_llama family.
#   NGPU=2 CONFIG_FILE=train_configs/debug_cpu.toml LOG_RANK=0 ./scripts/run_train.sh [--section.key value ...]
# NGPU is the number of ranks per node: GPUs when CUDA is present, gloo CPU processes otherwise.
# Several nodes: the same command on every node, with NNODES=N, NODE_RANK=0..N-1 and
# RDZV_ENDPOINT=host:port of node 0 (torchrun's c10d rendezvous; scripts/multinode_trainer.slurm).
# --help: this usage and the [boost] keys (instant); --help-all: every torchtitan option (slow).
set -euo pipefail
cd "$(dirname "$0")/.."

NGPU=${NGPU:-2}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-}  # required with NNODES > 1 (the preflight says so); one node: 0
[ "$NNODES" = 1 ] && NODE_RANK=${NODE_RANK:-0}
RDZV_ENDPOINT=${RDZV_ENDPOINT:-}
RDZV_ID=${RDZV_ID:-boost_titan}
LOG_RANK=${LOG_RANK:-0}
CONFIG_FILE=${CONFIG_FILE:-train_configs/debug_cpu.toml}
TRAIN_FILE=${TRAIN_FILE:-torchtitan_ext.runtime.train}  # torchtitan.train, exiting cleanly (see the module)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

for arg in "$@"; do
  case $arg in
    -h|--help)
      echo "usage: [NGPU=ranks per node] [CONFIG_FILE=file.toml] [LOG_RANK=r] [COMM_MODE=fake_backend] $0 [--section.key value ...]"
      echo "  several nodes: NNODES=N NODE_RANK=i RDZV_ENDPOINT=node0:29500 [RDZV_ID=job] on each node"
      echo "  trains the cola_llama family with torchtitan's loop; configs in train_configs/, any key overridable."
      echo "  --help-all lists all of torchtitan's options (slow: ~20 s, ~900 lines)."
      echo
      python3 torchtitan_ext/cola_llama/job_config.py
      exit 0 ;;
    --help-all)
      exec python3 -m "$TRAIN_FILE" --job.config_file "$CONFIG_FILE" --help ;;
  esac
done
if [ ! -f "$CONFIG_FILE" ]; then
  echo "config error: CONFIG_FILE=$CONFIG_FILE does not exist (the family's configs: $(ls train_configs/*.toml | tr '\n' ' '))" >&2
  exit 2
fi
# one readable line per configuration problem, before any rank starts (torchtitan_ext/runtime/preflight.py)
# (it also claims the checkpoint folder for this process, which exec becomes torchrun: one live run per folder)
NGPU=$NGPU NNODES=$NNODES NODE_RANK=$NODE_RANK RDZV_ENDPOINT=$RDZV_ENDPOINT BOOST_LAUNCHER_PID=$$ \
  python3 -m torchtitan_ext.runtime.preflight --job.config_file "$CONFIG_FILE" "$@" || exit 2

if [ -n "${COMM_MODE:-}" ]; then  # fake_backend: dry-run an NGPU layout in one process
  NGPU=$NGPU LOCAL_RANK=0 exec python3 -m "$TRAIN_FILE" --job.config_file "$CONFIG_FILE" "$@" \
    --comm.mode="$COMM_MODE" --training.steps=1
fi

if [ "$NNODES" = 1 ]; then
  NODES=(--nnodes=1 --rdzv_endpoint="localhost:0")
else  # the rendezvous numbers the nodes as they join; a node's ranks are consecutive, so every tp
  # group (consecutive ranks, tp dividing NGPU: the preflight checks) stays inside one node
  NODES=(--nnodes="$NNODES" --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="$RDZV_ID")
fi
PYTORCH_ALLOC_CONF="expandable_segments:True" exec python3 -m torch.distributed.run --nproc_per_node="$NGPU" \
  "${NODES[@]}" --rdzv_backend c10d --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
  -m "$TRAIN_FILE" --job.config_file "$CONFIG_FILE" "$@"
