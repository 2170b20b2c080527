"""Where a training step's GPU time goes: CoLA vs full rank, one GPU, compiled blocks, bf16 autocast.

Same model code and shapes as the e2e runs (local batch 4 × seq 4096, V = 32000); the torch
profiler's CUDA kernel times are bucketed into GEMM / attention / fused elementwise (inductor,
Triton) / optimizer / other. Each variant is ``flavor[:option...]`` with options ``ungrouped``
(``grouped=False``) and ``autotune`` (inductor ``max-autotune-no-cudagraphs``: Triton GEMM templates
with fused epilogues compete with cuBLAS); its step time is the median of CUDA-event-timed steps.

The ceiling table asks how far a CoLA variant can get against its ``_fullrank`` twin profiled in the
same run. GEMM TFLOP per step is counted from the weights (6 · matmul weights · tokens, lm_head
included, attention excluded). ``ratio_if_gemm_at_peak`` keeps the CoLA variant's non-GEMM GPU time
and runs its GEMMs at the measured bf16 peak (a bound on what faster low-rank GEMMs could give);
``non_gemm_ms_for_target`` is the non-GEMM time the CoLA variant would need, with its GEMM time as
measured, for the target ratio.

    python -m scripts.bench.profile_step --variants 1B,1B_fullrank --out docs/results/profile_1b
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F

from boost_titan.models import FLAVORS, Transformer
from boost_titan.models.args import linear_params_per_layer
from scripts.bench.results import doc_notes, env_info, print_table, write_results
from scripts.bench.timing import cuda_time_ms, measured_bf16_peak_tflops
from scripts.bench.traces import bucket, bucket_rows


def profile(variant: str, batch: int, seq: int, steps: int, top: int) -> tuple[dict, list, float]:
    flavor, *options = variant.split(":")
    unknown = set(options) - {"ungrouped", "autotune"}
    if unknown:
        raise ValueError(f"unknown variant option(s) {sorted(unknown)} in {variant!r}: use ungrouped, autotune")
    args = FLAVORS[flavor].replace(max_seq_len=seq, grouped="ungrouped" not in options)
    mode = "max-autotune-no-cudagraphs" if "autotune" in options else None
    with torch.device("cuda"):
        model = Transformer(args)
    model.init_weights()
    for i, block in model.layers.named_children():
        model.layers.register_module(i, torch.compile(block, fullgraph=True, mode=mode))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, args.vocab_size, (batch, seq + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step_ms = cuda_time_ms(step, warmup=3, repeats=max(steps, 5))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per_bucket, kernels = defaultdict(float), []
    for evt in prof.key_averages():
        t = evt.device_time_total / 1e3 / steps  # ms per step
        if t <= 0:
            continue
        per_bucket[bucket(evt.key)] += t
        kernels.append({"variant": variant, "kernel": evt.key[:90], "bucket": bucket(evt.key), "ms_per_step": t})
    kernels.sort(key=lambda r: -r["ms_per_step"])
    model = opt = None  # freed before the next variant (the closure holds them too)
    torch.cuda.empty_cache()
    return dict(per_bucket), kernels[:top], step_ms


def gemm_tflop_per_step(flavor: str, tokens: int) -> float:
    """6 · (projection weights + lm_head) · tokens: the training FLOPs of every weight GEMM."""
    args = FLAVORS[flavor]
    return 6 * (args.n_layers * linear_params_per_layer(args) + args.vocab_size * args.dim) * tokens / 1e12


def ceiling_rows(steps: list[dict], gemm_ms: dict, tokens: int, peak: float, target: float) -> list[dict]:
    """For each CoLA variant whose ``<flavor>_fullrank`` twin ran too: measured ratio and bounds."""
    busy = {s["variant"]: s["gpu_busy_ms"] for s in steps}
    rows = []
    for variant, cola_ms in busy.items():
        flavor = variant.split(":")[0]
        twin = f"{flavor}_fullrank"
        if flavor.endswith("_fullrank") or twin not in busy:
            continue
        gemm, non_gemm = gemm_ms[variant], cola_ms - gemm_ms[variant]
        at_peak = gemm_tflop_per_step(flavor, tokens) / peak * 1e3
        rows.append({"variant": variant, "vs": twin, "ratio_gpu_busy": busy[twin] / cola_ms,
                     "gemm_ms": gemm, "gemm_ms_at_peak": at_peak, "non_gemm_ms": non_gemm,
                     "ratio_if_gemm_at_peak": busy[twin] / (at_peak + non_gemm),
                     f"non_gemm_ms_for_{target}x": busy[twin] / target - gemm})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="1B,1B_fullrank", help="flavor[:ungrouped][:autotune],...")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=15, help="kernels listed per variant")
    p.add_argument("--target", type=float, default=1.7, help="speed-up over full rank for the ceiling table")
    p.add_argument("--out", default="docs/results/profile_1b")
    a = p.parse_args()
    peak = measured_bf16_peak_tflops()
    rows, top, steps, gemm_ms = [], [], [], {}
    for variant in a.variants.split(","):
        buckets, kernels, step_ms = profile(variant, a.batch, a.seq, a.steps, a.top)
        total = sum(buckets.values())
        rows += bucket_rows(variant, buckets)
        steps.append({"variant": variant, "step_ms": step_ms, "gpu_busy_ms": total,
                      "tokens_per_s": a.batch * a.seq / step_ms * 1e3})
        flavor = variant.split(":")[0]
        gemm_ms[variant] = buckets.get("gemm", 0.0)
        steps[-1]["gemm_tflop"] = gemm_tflop_per_step(flavor, a.batch * a.seq)
        steps[-1]["gemm_tflops_per_s"] = steps[-1]["gemm_tflop"] / gemm_ms[variant] * 1e3 if gemm_ms[variant] else None
        top += kernels
        print(steps[-1], flush=True)
    ceiling = ceiling_rows(steps, gemm_ms, a.batch * a.seq, peak, a.target)
    meta = env_info()
    meta["measured_bf16_peak_tflops"] = round(peak, 1)
    write_results(a.out, rows, meta, "GPU time per training step by kernel kind",
                  sections=[("Step time (CUDA events, median)", steps, None),
                            (f"Ceiling against the full-rank twin (target {a.target}x)", ceiling, None),
                            ("Top kernels", top, ["variant", "kernel", "bucket", "ms_per_step"])],
                  notes=doc_notes(__doc__))
    print_table(rows, ["variant", "bucket", "ms_per_step", "share_pct"])
    print_table(steps)
    if ceiling:
        print_table(ceiling)


if __name__ == "__main__":
    main()
