"""Causal attention core, forward and forward + backward, per backend (bf16, one GPU).

The attention core is identical in CoLA and its dense twin and is a third of CoLA-1B's step, so its
backend bounds the CoLA/full-rank speed-up. Compares PyTorch SDPA's cuDNN / flash / memory-efficient
backends with FlexAttention (compiled, causal block mask). FLOPs: causal forward = 2·b·h·s²·hd,
backward = 2.5 × forward.

    python -m scripts.bench.attention --out docs/results/attention
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from scripts.bench.results import doc_notes, env_info, print_table, write_results
from scripts.bench.timing import cuda_time_ms

SDPA = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION}


def attention_fn(backend: str, s: int):
    if backend in SDPA:
        def sdpa(q, k, v):
            with sdpa_kernel(SDPA[backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return sdpa
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, s, s, device="cuda")
    flex = torch.compile(flex_attention, fullgraph=True)
    return lambda q, k, v: flex(q, k, v, block_mask=mask)


def bench(backend: str, b: int, h: int, s: int, hd: int, layout: str) -> dict:
    # "bshd": q/k/v are [b, s, h, hd] transposed to [b, h, s, hd] (how the model calls SDPA)
    shape = (b, s, h, hd) if layout == "bshd" else (b, h, s, hd)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    view = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
    fn = attention_fn(backend, s)
    grad = torch.randn(b, h, s, hd, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            fn(view(q), view(k), view(v))

    def fwd_bwd():
        out = fn(view(q), view(k), view(v))
        torch.autograd.backward(out, grad)

    fwd_flops = 2 * b * h * s * s * hd  # causal: half of 4·b·h·s²·hd
    try:
        f_ms, fb_ms = cuda_time_ms(fwd, warmup=5, repeats=20), cuda_time_ms(fwd_bwd, warmup=5, repeats=20)
    except Exception as e:  # a backend that does not support the shape
        return {"backend": backend, "shape": f"{b},{h},{s},{hd}", "layout": layout, "error": str(e)[:80]}
    return {"backend": backend, "shape": f"{b},{h},{s},{hd}", "layout": layout, "fwd_ms": f_ms,
            "fwd_tflops": fwd_flops / f_ms / 1e9, "bwd_ms": fb_ms - f_ms,
            "fwd_bwd_ms": fb_ms, "fwd_bwd_tflops": 3.5 * fwd_flops / fb_ms / 1e9}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4,32,4096,64;4,32,4096,128", help="b,h,s,hd;...")
    p.add_argument("--backends", default="cudnn,flash,efficient,flex")
    p.add_argument("--out", default="docs/results/attention")
    a = p.parse_args()
    rows = []
    for shape in a.shapes.split(";"):
        b, h, s, hd = map(int, shape.split(","))
        for backend in a.backends.split(","):
            for layout in ("bshd", "bhsd"):
                rows.append(bench(backend, b, h, s, hd, layout))
                print(rows[-1], flush=True)
    cols = ["backend", "shape", "layout", "fwd_ms", "fwd_tflops", "bwd_ms", "fwd_bwd_ms", "fwd_bwd_tflops"]
    write_results(a.out, rows, env_info(), "Causal attention core per backend (bf16)", columns=cols,
                  notes=doc_notes(__doc__))
    print_table(rows, cols)


if __name__ == "__main__":
    main()
