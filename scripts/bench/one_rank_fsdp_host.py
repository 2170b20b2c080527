"""Host time of FSDP2 on a 1-rank mesh (the mixed-precision wrapper of tp/pp-only layouts), per step.

The GPU traces of 7B btp tp 4 (docs/results/emulate_7b_gaps_after_bmm.md) show the GPU idle while the host
walks FSDP2's per-parameter code: the world-size-1 unshard before forward (a cast and a copy per
parameter) and the end-of-backward reduction. This script measures that host time directly, on the
CPU, with as many parameters as the 7B tp 4 rank has (322; a cast and a copy each: the trace's 643
gaps) but tiny ones, so that the kernels cost next to nothing and the wall time is the host's:
FSDP's own unshard and reduction vs :mod:`boost_titan.parallel.one_rank_fsdp`'s one
``_foreach_copy_`` each way, and, to size what FSDP adds at all, the same model without FSDP (bf16
weights trained directly: the model's own autograd host time). CPU kernels run inline (a GPU launch
costs a few µs more per kernel), so these are a lower bound on the host time a GPU run pays; and
what grows with the gradients' size on a GPU (the host-side metadata of ``fsdp::chunk_cat``'s CUDA
kernel, one entry per 2 KiB block of gradient) does not show at these sizes.

    python -m scripts.bench.one_rank_fsdp_host --params 322 --out docs/results/one_rank_fsdp_host_grads_cpu
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from boost_titan.parallel.one_rank_fsdp import batch_one_rank_fsdp
from scripts.bench.common import doc_notes, env_info, print_table, write_results


class Params(nn.Module):
    """``n`` small weights, each used once: forward is a sum of tiny matmuls (the host is what is timed)."""

    def __init__(self, n: int, dim: int):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(dim, dim) / dim) for _ in range(n)])

    def forward(self, x):
        return sum((x @ w).sum() for w in self.weights)


def time_steps(n: int, dim: int, unshard: str, steps: int, warmup: int) -> dict:
    """``unshard``: "fsdp" (FSDP2's own), "batched" (one foreach copy each way) or "none" (no FSDP: bf16 weights
    trained directly, the model's own host time, to size what FSDP adds)."""
    torch.manual_seed(0)
    model = Params(n, dim)
    if unshard == "none":
        model.bfloat16()
    else:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                      cast_forward_inputs=False)
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)), mp_policy=policy, reshard_after_forward=False)
    if unshard == "batched":
        batch_one_rank_fsdp(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(2, dim, dtype=torch.bfloat16)
    fwd, bwd = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = model(x)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return {"forward_ms": 1e3 * statistics.median(fwd), "backward_ms": 1e3 * statistics.median(bwd)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=int, default=322, help="parameters (7B btp tp 4: 322)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default="docs/results/one_rank_fsdp_host_cpu")
    a = p.parse_args()
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())  # one process: no rendezvous
    torch.set_num_threads(1)
    names = {"fsdp": "FSDP2 per parameter", "batched": "one _foreach_copy_ each way", "none": "no FSDP (bf16 weights)"}
    rows = []
    for unshard in ("fsdp", "batched", "none") * 2:  # alternated: drift shows up as disagreeing repeats
        times = time_steps(a.params, a.dim, unshard, a.steps, a.warmup)
        rows.append({"unshard": names[unshard], "params": a.params, **times})
        print_table(rows[-1:])
    dist.destroy_process_group()
    write_results(a.out, rows, env_info("cpu"), "MEASURED host time of FSDP2 on a 1-rank mesh (CPU, tiny weights)",
                  notes=doc_notes(__doc__))
    print_table(rows)


if __name__ == "__main__":
    main()
