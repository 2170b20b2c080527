"""Is σ worth moving into the GEMMs? The CoLA bottleneck ``y = B σ(A x)`` (σ = SiLU) as compiled code
runs it — cuBLAS GEMMs with Inductor's σ / σ' kernels between them — against quack-kernels' GEMMs
with the activation in the epilogue: forward ``gemm_act`` (A x and σ in one kernel, both written),
backward ``gemm_dact`` (``dz = dy B`` and ``σ'`` in one kernel, which also rebuilds σ(A x) for B's
weight gradient, so only the pre-activation is saved). Forward + backward, bf16, interleaved CUDA-event
timing (median), at the 1B's per-layer bottleneck shapes (tp 1: the A GEMM's output is whole, so σ
can follow it; under bottleneck-aware TP it cannot — the A output is a partial sum until its
all-reduce).

The per-step saving is ``layers · Σ count · (compiled − row)`` over the shapes (q, k, v, o:
2048 → 512 → 2048; gate, up: 2048 → 512 → 5472; down: 5472 → 512 → 2048). It bounds what the
fusion can give in the loop, where the model groups q|k|v and gate|up (one A GEMM, batched B GEMMs).

    python -m scripts.bench.lowrank_epilogue --out docs/results/lowrank_epilogue_1b
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from scripts.bench.common import env_info, interleaved_time_ms, print_table, write_results

COMPILED = "cuBLAS + Inductor σ (torch.compile)"
# (d_in, d_out, count per layer) of the 1B's bottlenecks, rank 512
SHAPES_1B = [(2048, 2048, 4), (2048, 5472, 2), (5472, 2048, 1)]


def bottleneck(x, a, b):
    return F.silu(x @ a.T) @ b.T


def quack_bottleneck(tuned: bool):
    from quack.linear import act_linear_func, linear_act_func

    def fn(x, a, b):
        preact, postact = linear_act_func(x, a, "silu", tuned=tuned)
        return act_linear_func(preact, b, postact, "silu", tuned=tuned)
    return fn


def candidates(x, a, b, dy, quack_tuned: bool):
    def fwd_bwd(f):
        return lambda: torch.autograd.backward(f(x, a, b), dy)

    out = {COMPILED: fwd_bwd(torch.compile(bottleneck)), "eager PyTorch": fwd_bwd(bottleneck)}
    try:
        out["quack gemm_act / gemm_dact"] = fwd_bwd(quack_bottleneck(tuned=False))
        out["quack, compiled"] = fwd_bwd(torch.compile(quack_bottleneck(tuned=False)))
        if quack_tuned:
            out["quack, autotuned"] = fwd_bwd(quack_bottleneck(tuned=True))
    except ImportError as e:
        print(f"quack-kernels not importable ({e}): rows skipped")
    runnable = {}
    for name, fn in out.items():  # one call each: a candidate that fails is named and left out
        try:
            fn()
            runnable[name] = fn
        except Exception as e:  # noqa: BLE001 - a benchmark row, not library code
            print(f"{name}: left out, first call failed: {type(e).__name__}: {str(e)[:300]}")
    return runnable


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


def errors(fn, x, a, b, dy) -> dict:
    """Norm-wise relative error of output and gradients against the same bottleneck in fp32."""
    leaves = [t.detach().float().requires_grad_() for t in (x, a, b)]
    ref_y = bottleneck(*leaves)
    ref_y.backward(dy.float())
    got = [t.detach().clone().requires_grad_() for t in (x, a, b)]
    y = fn(*got)
    y.backward(dy)
    out = {"err_y": rel_err(y, ref_y.detach())}
    for name, g, r in zip(("dx", "dA", "dB"), got, leaves):
        out[f"err_{name}"] = rel_err(g.grad, r.grad)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16384, help="b · s (1B at b 4 × 4096)")
    p.add_argument("--rank", type=int, default=512)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--tuned", action="store_true", help="also quack's autotuned configs (slow first call)")
    p.add_argument("--graph", action="store_true",
                   help="time CUDA-graph replays: GPU time only, without the host's launch and dispatch cost")
    p.add_argument("--out", default="docs/results/lowrank_epilogue_1b")
    a = p.parse_args()
    rows, saved = [], {}
    for d_in, d_out, count in SHAPES_1B:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(a.tokens, d_in, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        wa = (torch.randn(a.rank, d_in, device="cuda", dtype=torch.bfloat16, generator=g) * d_in ** -0.5).requires_grad_()
        wb = (torch.randn(d_out, a.rank, device="cuda", dtype=torch.bfloat16, generator=g) * a.rank ** -0.5).requires_grad_()
        dy = torch.randn(a.tokens, d_out, device="cuda", dtype=torch.bfloat16, generator=g)
        fns = candidates(x, wa, wb, dy, a.tuned)
        times = interleaved_time_ms(fns, warmup=5, repeats=20, rounds=5, use_graph=a.graph)
        base = times[COMPILED]
        for name, ms in times.items():
            row = {"shape": f"{d_in}->{a.rank}->{d_out}", "per_layer": count, "kernel": name, "fwd_bwd_ms": ms,
                   "vs_compiled": base / ms, "ms_per_step_saved": a.layers * count * (base - ms)}
            if name in (COMPILED, "quack gemm_act / gemm_dact"):  # the same functions as the rows
                row |= errors(torch.compile(bottleneck) if name == COMPILED else quack_bottleneck(False),
                              x, wa, wb, dy)
            rows.append(row)
            saved[name] = saved.get(name, 0.0) + row["ms_per_step_saved"]
    for name, ms in saved.items():
        rows.append({"shape": "all (1B step)", "kernel": name, "ms_per_step_saved": ms})
    write_results(a.out, rows, env_info(), "CoLA bottleneck: σ in the GEMM epilogue (quack) vs compiled code",
                  notes="fwd+bwd of `y = B silu(A x)` with the gradients of x, A and B; median ms over "
                        "interleaved rounds. ms_per_step_saved = layers · per_layer · (compiled − row), summed "
                        "in the last rows; err_* are norm-wise relative errors against fp32. "
                        + ("CUDA-graph replays: GPU time only." if a.graph else
                           "Eager launches: host dispatch included (at these sizes it can dominate)."))
    print_table(rows)


if __name__ == "__main__":
    main()
