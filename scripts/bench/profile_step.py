"""Where a training step's GPU time goes: CoLA vs full rank, one GPU, compiled blocks, bf16 autocast.

Same model code and shapes as the e2e runs (local batch 4 × seq 4096, V = 32000); the torch
profiler's CUDA kernel times are bucketed into GEMM / attention / fused elementwise (inductor,
Triton) / optimizer / other. Each variant is ``flavor[:option...]`` with options ``ungrouped``
(``grouped=False``) and ``autotune`` (inductor ``max-autotune-no-cudagraphs``: Triton GEMM templates
with fused epilogues compete with cuBLAS); its step time is the median of CUDA-event-timed steps.

    python scripts/bench/profile_step.py --variants 1B,1B_fullrank --out docs/results/profile_1b
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import cuda_time_ms, doc_notes, env_info, print_table, write_results  # noqa: E402

from boost_titan.models import FLAVORS, Transformer  # noqa: E402

BUCKETS = [("attention", ("fmha", "flash", "cudnn", "attention", "sdpa")),
           ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "matmul")),
           ("optimizer", ("adam", "multi_tensor", "foreach")),
           ("fused elementwise (triton)", ("triton",))]


def bucket(name: str) -> str:
    low = name.lower()
    for label, keys in BUCKETS:
        if any(k in low for k in keys):
            return label
    return "other"


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
    del model, opt
    torch.cuda.empty_cache()
    return dict(per_bucket), kernels[:top], step_ms


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="1B,1B_fullrank", help="flavor[:ungrouped][:autotune],...")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=15, help="kernels listed per variant")
    p.add_argument("--out", default="docs/results/profile_1b")
    a = p.parse_args()
    rows, top, steps = [], [], []
    for variant in a.variants.split(","):
        buckets, kernels, step_ms = profile(variant, a.batch, a.seq, a.steps, a.top)
        total = sum(buckets.values())
        rows += [{"variant": variant, "bucket": b, "ms_per_step": t, "share_pct": 100 * t / total}
                 for b, t in sorted(buckets.items(), key=lambda kv: -kv[1])]
        rows.append({"variant": variant, "bucket": "TOTAL (GPU busy)", "ms_per_step": total, "share_pct": 100.0})
        steps.append({"variant": variant, "step_ms": step_ms, "gpu_busy_ms": total,
                      "tokens_per_s": a.batch * a.seq / step_ms * 1e3})
        top += kernels
        print(steps[-1], flush=True)
    write_results(a.out, rows, env_info(), "GPU time per training step by kernel kind",
                  sections=[("Step time (CUDA events, median)", steps, None),
                            ("Top kernels", top, ["variant", "kernel", "bucket", "ms_per_step"])],
                  notes=doc_notes(__doc__))
    print_table(rows, ["variant", "bucket", "ms_per_step", "share_pct"])
    print_table(steps)


if __name__ == "__main__":
    main()
