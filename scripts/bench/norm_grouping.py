"""Single-GPU compute parts of BOOST's RMSNorm (Fig. 7b) and grouping (Tab. 2) comparisons.

At 7B shard shapes (tp = 4: x ``[b·s, d/4]``, r = 1024, f/4 = 2752, bf16), forward + backward:

* norm → A GEMM (qkv site, ``[m, d/t] × [d/t, 3r]``): unsharded ``Linear(RMSNorm(x))`` on the full d;
  sync (local statistic + normalise + GEMM); online (fused x⊙γ & statistic, GEMM, pack, rescale),
  with the Triton kernel and with the torch reference. The all-reduces run on a 1-rank group, so
  this is the local compute a rank does; the collective times need several GPUs.
* grouping: the qkv and gate/up low-rank projections (A GEMMs + σ + B GEMMs), grouped (one A GEMM
  + one batched B GEMM) vs ungrouped (one GEMM per factor).

    python -m scripts.bench.norm_grouping --batch 1,4 --out docs/results/norm_grouping
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from boost_titan.models.model import Projection
from boost_titan.ops import comm, rmsnorm
from boost_titan.ops.triton_rmsnorm import scale_and_statistic_reference
from scripts.bench.common import cuda_time_ms, doc_notes, env_info, print_table, write_results

D, F_DIM, R, TP, S = 4096, 11008, 1024, 4, 4096


def fwd_bwd(fn, inputs):
    def step():
        out = fn()
        out = out if isinstance(out, (list, tuple)) else [out]
        torch.autograd.backward(out, [torch.ones_like(o) for o in out])
        for t in inputs:
            t.grad = None
    return step


def norm_rows(m, mesh):
    dl = D // TP
    mk = lambda *shape: (torch.randn(*shape, device="cuda") * 0.05).bfloat16().requires_grad_()  # noqa: E731
    x_full, x, g_full, g = mk(m, D), mk(m, dl), mk(D), mk(dl)
    w_full, w = mk(3 * R, D), mk(3 * R, dl)
    eps = 1e-6
    cases = {
        "unsharded Linear(RMSNorm(x)), full d": (lambda: F.linear(rmsnorm.rms_norm(x_full, g_full, eps), w_full),
                                                 [x_full, g_full, w_full]),
        "sync (local compute)": (lambda: comm.reduce(F.linear(rmsnorm.sync_rms_norm(x, g, eps, D, mesh), w), mesh),
                                 [x, g, w]),
        "online, Triton kernel": (lambda: rmsnorm.online_rms_norm_linear(x, g, lambda y: [F.linear(y, w)], eps, D, mesh),
                                  [x, g, w]),
    }
    rows = []
    for name, (fn, inputs) in cases.items():
        rows.append({"bench": "norm→A", "m": m, "case": name, "ms": cuda_time_ms(fwd_bwd(fn, inputs), 5, 20)})
    # the same online path with the torch reference instead of the Triton kernel
    original = rmsnorm.scale_and_statistic
    rmsnorm.scale_and_statistic = scale_and_statistic_reference
    try:
        fn, inputs = cases["online, Triton kernel"]
        rows.append({"bench": "norm→A", "m": m, "case": "online, torch reference",
                     "ms": cuda_time_ms(fwd_bwd(fn, inputs), 5, 20)})
    finally:
        rmsnorm.scale_and_statistic = original
    return rows


def grouping_rows(m):
    rows = []
    for site, d_in, outs in [("qkv", D // TP, [D // TP] * 3), ("gate_up", D // TP, [F_DIM // TP] * 2)]:
        for grouped in (True, False):
            proj = Projection(d_in, outs, R, norm_eps=None, dense_std=0.02, grouped=grouped).cuda().bfloat16()
            for p in proj.parameters():
                torch.nn.init.normal_(p, std=0.02)
            x = torch.randn(m, d_in, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            ms = cuda_time_ms(fwd_bwd(lambda proj=proj, x=x: proj(x), [x, *proj.parameters()]), 5, 20)
            rows.append({"bench": "grouping", "m": m, "case": f"{site} {'grouped' if grouped else 'ungrouped'}",
                         "ms": ms})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="1,4")
    p.add_argument("--out", default="docs/results/norm_grouping")
    a = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    mesh = init_device_mesh("cuda", (1,))
    rows = []
    for b in map(int, a.batch.split(",")):
        rows += norm_rows(b * S, mesh) + grouping_rows(b * S)
    for r in rows:  # speed relative to the first row of its group: same bench, m and (grouping) site
        group = lambda q: (q["bench"], q["m"], q["case"].split()[0] if q["bench"] == "grouping" else "")  # noqa: E731
        base = next(q for q in rows if group(q) == group(r))
        r["vs_first"] = base["ms"] / r["ms"]
    write_results(a.out, rows, env_info(), "RMSNorm → A GEMM and grouping, local compute (7B shard, tp=4)",
                  notes=doc_notes(__doc__))
    print_table(rows, ["bench", "m", "case", "ms", "vs_first"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
