#!/usr/bin/env bash
# The single-GPU benchmark suite, in the order results/ cites it. Usage (repo root, on the GPU box):
#   bash scripts/bench/h200_suite.sh [e2e] [gemm] [kernels] [ac] [attention] [profile] [quality]   (default: all)
# Extra parts, not in the default (e2e_kernels and attention_quality need flash-attn-4 and liger-kernel installed: docs/design.md, "Kernels"):
# e2e_kernels (flash-attn-4 + fused loss, both families), attention_quality (flash vs SDPA losses, 60M, corpus),
# e2e_float8 (torchao float8 projections, both families; needs torchao), float8_quality (bf16 vs float8 losses, 60M, corpus),
# float8_quality_tw (the same for tensorwise), emulate_stages (13B tp 4 x pp 2: each pipeline stage's rank, torch 2.11),
# emulate_13b_mb4 (the same with microbatches of 4 samples, BOOST's mbz, 4 per step), emulate_13b_balanced (btp's
# stages with the lm_head counted as 5 blocks: 22 + 18 blocks instead of 20 + 20), fsdp_groups (7B btp tp 4 at
# local batch 4 and 1 with the 1-rank mixed-precision wrapper as 1 or 4 FSDP groups),
# e2e_batch (local batch 12 / 16 with flash + fused), attention_quality_1b (flash vs SDPA losses, 1B compiled, corpus), norm_kernels (quack / liger / Inductor RMSNorm), e2e_more (ablation), e2e_profile (compiled pair, traced in the loop),
# gemm_quick (7B tp 4, b 1/4), gemm_ops (per-product formulations), clocks (throughput and SM clock under sustained load), profile_autotune, ceiling (1B vs its dense twin), quality_compiled.
# Each part writes JSON + markdown under docs/results/ and prints its table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
parts=${*:-e2e gemm kernels ac attention profile quality}
for part in $parts; do
  echo "=== $part ($(date -u +%T))"
  case $part in
    e2e) python -m scripts.bench.e2e --steps 20 --skip 6 \
           --variants cola_1b,fullrank_1b,cola_1b_compile,fullrank_1b_compile --out docs/results/e2e_1gpu ;;
    e2e_kernels) python -m scripts.bench.e2e --steps 14 --skip 6 --variants \
           cola_1b_compile,cola_1b_compile+flash,cola_1b_compile+flash+fused,fullrank_1b_compile,fullrank_1b_compile+flash+fused \
           --out docs/results/e2e_kernels && bash scripts/bench/kernel_layouts.sh ;;
    attention_quality) python -m scripts.bench.loss_match --steps 300 --out docs/results/attention_quality_60m \
           --runs "sdpa=--boost.attention sdpa" "flash=--boost.attention flash" ;;
    float8_quality) python -m scripts.bench.loss_match --steps 500 --out docs/results/float8_quality_60m \
           --runs "bf16=" "fp8=--boost.float8 rowwise" ;;
    float8_quality_tw) python -m scripts.bench.loss_match --steps 500 --out docs/results/float8_tensorwise_quality_60m \
           --runs "bf16=" "fp8tw=--boost.float8 tensorwise" ;;
    emulate_stages) python -m scripts.bench.emulate --rows "13B" --batch 4 --stages --out docs/results/emulate_13b_stages ;;
    emulate_13b_mb4) python -m scripts.bench.emulate --rows "13B" --batch 16 --microbatch 4 --stages --out docs/results/emulate_13b_mb4 ;;
    emulate_13b_balanced) python -m scripts.bench.emulate --rows "13B:btp" --batch 4 --stages --steps 12 --skip 6 \
           --extra="--parallelism.pipeline_parallel_last_stage_less_layers 5" --out docs/results/emulate_13b_balanced ;;
    fsdp_groups) for g in 1 4; do python -m scripts.bench.emulate --rows "7B:btp" --batch 4,1 --steps 16 --skip 6 \
           --extra="--boost.one_rank_fsdp_groups $g" --out docs/results/emulate_7b_fsdp_groups$g; done ;;
    e2e_float8) python -m scripts.bench.e2e --steps 40 --skip 10 --log-freq 10 --variants \
           cola_1b_compile+flash+fused,cola_1b_compile+flash+fused+fp8,cola_1b_compile+flash+fused+fp8tw,fullrank_1b_compile+flash+fused,fullrank_1b_compile+flash+fused+fp8,fullrank_1b_compile+flash+fused+fp8tw \
           --out docs/results/e2e_float8 ;;
    e2e_batch) python -m scripts.bench.e2e --steps 30 --skip 10 --log-freq 10 --variants \
           cola_1b_compile+flash+fused+b12,cola_1b_compile+flash+fused+b16,fullrank_1b_compile+flash+fused+b12,cola_1b_compile+flash+fused+fp8tw+b16,fullrank_1b_compile+flash+fused+fp8tw+b16 \
           --out docs/results/e2e_batch ;;
    attention_quality_1b) python -m scripts.bench.loss_match --config train_configs/cola_1b_h200.toml --steps 300 \
           --extra="--compile.enable --boost.fused_cross_entropy --training.dataset corpus --boost.tokenizer gpt2 --boost.vocab_from_tokenizer" \
           --runs "sdpa=--boost.attention sdpa" "flash=--boost.attention flash" --out docs/results/attention_quality_1b ;;
    norm_kernels) python -m scripts.bench.norm_kernels --out docs/results/norm_kernels ;;
    e2e_more) python -m scripts.bench.e2e --steps 16 --skip 6 \
           --variants cola_1b_compile,cola_1b_ungrouped_compile,cola_1b_lowrank_ckpt_compile \
           --out docs/results/e2e_1gpu_ablation ;;
    e2e_profile) python -m scripts.bench.e2e --steps 20 --skip 8 --profile \
           --variants cola_1b_compile,fullrank_1b_compile --out docs/results/e2e_1gpu_profile ;;
    gemm) python -m scripts.bench.gemm_efficiency --out docs/results/gemm_efficiency ;;
    gemm_ops) python -m scripts.bench.gemm_ops --out docs/results/gemm_ops_7b_tp4 &&
           python -m scripts.bench.gemm_ops --size 1B --tp 1 --batch 4 --out docs/results/gemm_ops_1b_tp1 ;;
    clocks) python -m scripts.bench.clocks ;;
    gemm_quick) python -m scripts.bench.gemm_efficiency --quick --out docs/results/gemm_efficiency_7b_tp4 ;;
    attention) python -m scripts.bench.attention ;;
    kernels) python -m pytest -q tests/test_triton_kernels.py && python -m scripts.bench.norm_grouping ;;
    ac) python -m scripts.bench.ac_memory ;;
    profile) python -m scripts.bench.profile_step --variants 1B,1B:ungrouped,1B_fullrank --top 40 ;;
    profile_autotune) python -m scripts.bench.profile_step --variants 1B:autotune,1B_fullrank:autotune \
           --out docs/results/profile_1b_autotune ;;
    ceiling) python -m scripts.bench.profile_step --variants 1B,1B_fullrank --top 30 \
           --out docs/results/profile_1b_ceiling ;;
    quality_compiled) python -m scripts.bench.quality --steps ${QUALITY_STEPS:-1200} --extra="--compile.enable" \
           --out docs/results/quality_60m_compiled ;;
    quality) python -m scripts.bench.quality --sweep "60M:1e-3,3e-3,6e-3;60M_fullrank:1e-3,3e-3,6e-3" \
           --sweep-steps 250 --parallel 3 --steps ${QUALITY_STEPS:-1200} --out docs/results/quality_60m ;;
    *) echo "unknown part $part" ;;
  esac
done
