"""Activation checkpointing: peak memory and time of decoder layers, none / full / op-selective / low-rank.

Two settings, bf16, local batch 4 × seq 4096, forward + backward of a stack of decoder layers:

* ``1B``, one GPU, tp = 1 (no collectives: the low-rank policy saves the A GEMM outputs);
* ``7B@tp4``: 7B layer shapes as one rank of btp tp = 4 sees them, on a *fake* 4-rank process group
  (collectives are no-ops, compute and memory are the real per-rank ones).

torchtitan's AC modes are applied with torchtitan's own ``apply_ac``; "lowrank" is
``[boost] lowrank_checkpoint``. Memory = peak allocated during fwd+bwd minus what was allocated
before (weights, grads, input).

    python -m scripts.bench.ac_memory --out docs/results/ac_memory_h200
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn as nn

from boost_titan.models import FLAVORS, Transformer
from boost_titan.parallel import apply_tp
from boost_titan.parallel.activation_checkpoint import apply_lowrank_checkpoint
from boost_titan.planner.trace import fake_world
from scripts.bench.results import doc_notes, env_info, print_table, pyplot, write_results
from scripts.bench.timing import cuda_time_ms

B, S = 4, 4096


def build(flavor: str, layers: int, mesh, ac: str) -> tuple[nn.Module, int]:
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    args = FLAVORS[flavor].replace(n_layers=layers, max_seq_len=S)
    with torch.device("meta"):
        model = Transformer(args)
    width = args.dim
    if mesh is not None:
        apply_tp(model, mesh, "btp", args)
        width = args.dim // mesh.size()
    model.to_empty(device="cuda")
    model.init_weights(torch.device("cuda"))
    model.to(torch.bfloat16)
    if ac == "lowrank":
        apply_lowrank_checkpoint(model, args, tensor_parallel=mesh is not None)
    elif ac != "none":
        mode = "selective" if ac == "selective-op" else ac
        config = ActivationCheckpoint(mode=mode, selective_ac_option="op", preserve_rng_state=False)
        apply_ac(model, config, op_sac_save_list=_op_sac_save_list)
    return model, width


def measure(flavor, layers, mesh, ac):
    model, width = build(flavor, layers, mesh, ac)
    tp = mesh.size() if mesh is not None else 1
    x = torch.randn(B, S, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        h = x
        for layer in model.layers.values():
            h = layer(h, model.rope)
        h.float().pow(2).mean().backward()

    step()  # warm-up (also allocates the gradients)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30
    ms = cuda_time_ms(step, warmup=2, repeats=5)
    model = x = None  # freed before the next configuration (the closure holds them too)
    torch.cuda.empty_cache()
    return {"setting": f"{flavor}@tp{tp}", "layers": layers, "ac": ac, "act_mem_gib": peak,
            "act_mem_gib_per_layer": peak / layers, "fwd_bwd_ms": ms, "ms_per_layer": ms / layers}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/results/ac_memory_h200")
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()
    rows = []
    for flavor, tp in [("1B", 1), ("7B", 4), ("1B_fullrank", 1)]:
        with fake_world(tp, "cuda") if tp > 1 else contextlib.nullcontext() as mesh:
            for ac in ["none", "full", "selective-op", "lowrank"]:
                rows.append(measure(flavor, a.layers, mesh, ac))
                print_table(rows[-1:], None)
    write_results(a.out, rows, env_info(), "Activation checkpointing: memory and time per decoder layer",
                  notes=doc_notes(__doc__))
    print_table(rows, ["setting", "ac", "act_mem_gib_per_layer", "ms_per_layer"])
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for setting in dict.fromkeys(r["setting"] for r in rows):
        sel = [r for r in rows if r["setting"] == setting]
        ax.plot([r["act_mem_gib_per_layer"] for r in sel], [r["ms_per_layer"] for r in sel], "o-", label=setting)
        for r in sel:
            ax.annotate(r["ac"], (r["act_mem_gib_per_layer"], r["ms_per_layer"]), fontsize=7)
    ax.set_xlabel("activation memory per layer (GiB)")
    ax.set_ylabel("fwd+bwd time per layer (ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=120)

if __name__ == "__main__":
    main()
