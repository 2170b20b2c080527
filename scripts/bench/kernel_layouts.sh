#!/usr/bin/env bash
# The kernel options ([boost] attention = "flash", fused_cross_entropy) in every layout that one GPU can run:
# real tp 1 runs with torchtitan's selective AC and with lowrank_checkpoint, and rank 0 of tp 2 under each
# TP strategy on the fake backend (its real kernels at real per-rank shapes: local heads). 3 eager steps each;
# prints one line per layout: ok (with the last step line) or FAILED (with the log tail).
#   bash scripts/bench/kernel_layouts.sh [extra overrides...]        (GPU box, repo root)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CONFIG_FILE=train_configs/cola_1b_h200.toml  # run_train.sh's config; the emulator gets it as a flag
common=(--training.steps 3 --training.local_batch_size 1
        --metrics.log_freq 1 --boost.attention flash "$@")
run() {  # name, NGPU, emulate (0/1), overrides...
  local name=$1 n=$2 fake=$3; shift 3
  if [ "$fake" = 1 ]; then
    log=$(NGPU=$n EMULATE_RANK=0 LOCAL_RANK=0 timeout 300 python -m torchtitan_ext.runtime.emulate --job.config_file "$CONFIG_FILE" "${common[@]}" "$@" --comm.mode fake_backend 2>&1)
  else
    log=$(NGPU=$n timeout 300 ./scripts/run_train.sh "${common[@]}" "$@" 2>&1)
  fi
  if grep -q "step:  *3 " <<<"$log"; then echo "ok      $name: $(grep -o 'Attention: .*' <<<"$log" | head -1)"
  else echo "FAILED  $name"; tail -25 <<<"$log"; fi
}
run "tp1 selective AC + fused CE" 1 0 --activation_checkpoint.mode selective --boost.fused_cross_entropy
run "tp1 lowrank_checkpoint"      1 0 --boost.lowrank_checkpoint
run "tp2 btp (rank 0, fake)"      2 1 --parallelism.tensor_parallel_degree 2 --boost.tp_strategy btp
run "tp2 vanilla (rank 0, fake)"  2 1 --parallelism.tensor_parallel_degree 2 --boost.tp_strategy vanilla
run "tp2 fullrank (rank 0, fake)" 2 1 --parallelism.tensor_parallel_degree 2 --boost.tp_strategy fullrank --model.flavor 1B_fullrank
