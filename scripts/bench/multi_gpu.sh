#!/usr/bin/env bash
# BOOST's Fig. 5 rows for real, over NCCL, on one multi-GPU node (3B tp 2 on 2 GPUs, 7B tp 4 on 4,
# 13B tp 4 x pp 2 on 8; fullrank / vanilla / btp; compiled, bf16, local batch 4 x seq 4096), next to
# the emulated + predicted rows of scripts/bench/emulate.py. Run from the repo root on the GPU node:
#   bash scripts/bench/multi_gpu.sh                 # needs 8 GPUs (the 13B row), 4 for 7B, 2 for 3B
#   FAKE=1 bash scripts/bench/multi_gpu.sh          # the same rows through the fake backend on one GPU
#   ROWS="tiny" FAKE=1 EXTRA="..." bash scripts/bench/multi_gpu.sh   # CPU smoke test (tests/)
# Leave NVLink SHARP as the machine has it (the model in comm_model.py assumes it off: NCCL_NVLS_ENABLE=0).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
ROWS=${ROWS:-"3B;7B;13B:btp,vanilla,fullrank"}
OUT=${OUT:-docs/results/multi_gpu_fig5}
mode=(--real)
if [ -n "${FAKE:-}" ]; then mode=(); OUT=${OUT}_emulated; fi
python -m scripts.bench.emulate "${mode[@]}" --rows "$ROWS" --batch "${BATCH:-4}" --steps "${STEPS:-12}" \
  --skip "${SKIP:-5}" ${EXTRA:+--extra="$EXTRA"} --out "$OUT"
