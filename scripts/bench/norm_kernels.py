"""Which RMSNorm kernel for the tp 1 blocks? The block's norm site — residual add, then RMSNorm — as
compiled code produces it (Inductor fuses both into one reduction kernel per direction) against the
well-kept kernel libraries that offer the same fused op: quack-kernels (CuTe DSL,
``quack.rmsnorm.rmsnorm(x, w, residual=r, prenorm=True)``) and liger-kernel (``LigerRMSNorm``, norm only,
the add left to PyTorch). Forward + backward, bf16, interleaved CUDA-event timing (median).

A kernel that replaces Inductor's here must win by more than what it costs in the real loop: the
norm then becomes an opaque call, and Inductor can no longer fuse its neighbours (the residual add
of the next block, the online statistic). The per-step saving is ``2 · n_layers`` times the row's
difference.

    python -m scripts.bench.norm_kernels --out docs/results/norm_kernels
"""

from __future__ import annotations

import argparse

import torch

from boost_titan.ops.rmsnorm import rms_norm
from scripts.bench.common import env_info, interleaved_time_ms, print_table, write_results

QUACK = "quack rmsnorm (residual fused)"


def add_rmsnorm(x, residual, w, eps=1e-6):
    """The block's norm site as the model writes it (``rms_norm`` upcasts to fp32)."""
    h = x + residual
    return rms_norm(h, w, eps), h


def candidates(x, r, w, dy, dh):
    out = {}
    compiled = torch.compile(add_rmsnorm)
    out["inductor (torch.compile)"] = lambda: torch.autograd.backward(compiled(x, r, w), (dy, dh))
    out["eager PyTorch"] = lambda: torch.autograd.backward(add_rmsnorm(x, r, w), (dy, dh))
    try:
        from quack.rmsnorm import rmsnorm as quack_rmsnorm

        def quack():
            y, h = quack_rmsnorm(x, w, residual=r, prenorm=True, eps=1e-6)
            torch.autograd.backward((y, h), (dy, dh))
        out[QUACK] = quack
    except ImportError as e:
        print(f"quack-kernels not importable ({e}): row skipped")
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm

        liger = LigerRMSNorm(w.shape[0], eps=1e-6).to(w.device, w.dtype)
        liger.weight = w

        def liger_fn():
            h = x + r
            torch.autograd.backward((liger(h), h), (dy, dh))
        out["liger RMSNorm (+ PyTorch add)"] = liger_fn
    except ImportError as e:
        print(f"liger-kernel not importable ({e}): row skipped")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="16384x2048,16384x4096", help="tokens x dim (1B b4 s4096, 7B)")
    p.add_argument("--layers", type=int, default=24, help="blocks per step: 2 norm sites each")
    p.add_argument("--out", default="docs/results/norm_kernels")
    a = p.parse_args()
    rows = []
    for shape in a.shapes.split(","):
        m, d = map(int, shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        x, r = (torch.randn(m, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(2))
        w = torch.nn.Parameter(torch.rand(d, device="cuda", dtype=torch.bfloat16, generator=g) + 0.5)
        dy, dh = (torch.randn(m, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        fns = candidates(x, r, w, dy, dh)
        ref_y, _ = add_rmsnorm(x.float(), r.float(), w.float())
        times = interleaved_time_ms(fns, warmup=5, repeats=20, rounds=5)
        base = times["inductor (torch.compile)"]
        for name, ms in times.items():
            rows.append({"tokens x dim": shape, "kernel": name, "fwd_bwd_ms": ms,
                         "vs_inductor": base / ms, "ms_per_step_saved": 2 * a.layers * (base - ms)})
        if QUACK in fns:  # the same function: its output against the fp32 reference, on its own row
            from quack.rmsnorm import rmsnorm as quack_rmsnorm

            y, _ = quack_rmsnorm(x, w, residual=r, prenorm=True, eps=1e-6)
            quack_row = next(row for row in rows if row["tokens x dim"] == shape and row["kernel"] == QUACK)
            quack_row["quack_max_rel_err"] = ((y.float() - ref_y).abs().max() / ref_y.abs().max()).item()
    write_results(a.out, rows, env_info(), "RMSNorm kernels at the block's norm site (residual add + norm)",
                  notes="fwd+bwd of `h = x + residual; y = rmsnorm(h)` with both outputs' gradients; median ms "
                        "over interleaved rounds. ms_per_step_saved = 2 · layers · (inductor − row), before the "
                        "fusions an opaque kernel would cost in the compiled block.")
    print_table(rows)


if __name__ == "__main__":
    main()
