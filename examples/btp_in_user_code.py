"""Bottleneck-aware tensor parallelism in your own training loop (no torchtitan).

    torchrun --nproc_per_node 2 examples/btp_in_user_code.py            # CPU (gloo) or one GPU per rank
    torchrun --nproc_per_node 2 examples/btp_in_user_code.py --no-loss-parallel

All ranks form one tensor-parallel group and see the same batch. The model overfits one fixed batch,
so its loss falls within a few steps. The README's "In your own code" section shows this file.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from boost_titan.models import FLAVORS, Transformer
from boost_titan.parallel import apply_tp


def train(flavor: str, steps: int, use_loss_parallel: bool) -> list[float]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh(device, (dist.get_world_size(),))  # every rank in one tp group

    args = FLAVORS[flavor]
    with torch.device("meta"):
        model = Transformer(args)
    # parallelize_module(model, mesh, tp_plan("btp", args, tp)) + re-tying a tied embedding / lm_head
    apply_tp(model, mesh, "btp", args, rmsnorm="online", loss_parallel=use_loss_parallel)
    model.to_empty(device=device)
    model.init_weights()  # full weights depend only on (seed, parameter name): same for any layout
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    # tp ranks share the batch: draw it from the same seed everywhere
    tokens = torch.randint(0, args.vocab_size, (4, 65), generator=torch.Generator().manual_seed(0)).to(device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    losses = []
    for _ in range(steps):
        logits = model(inputs)
        if use_loss_parallel:  # logits stay vocab-sharded (a Shard(-1) DTensor); the loss runs on the shards
            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
                loss.backward()
        else:  # loss_parallel=False: the logits come back as a replicated plain tensor
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="tiny")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-loss-parallel", action="store_true")
    a = p.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        losses = train(a.flavor, a.steps, not a.no_loss_parallel)
        if dist.get_rank() == 0:
            print("losses: " + " ".join(f"{v:.4f}" for v in losses), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without interpreter finalization: gloo's worker threads can abort a finished process there
    # (SIGABRT after a clean run; pytorch/pytorch#179291). Not needed with NCCL.
    sys.stdout.flush()
    os._exit(0)
