"""A tied embedding / lm_head across pipeline stages (Megatron's "embedding group").

With ``tie_embeddings`` one ``[vocab, dim]`` matrix is both the token embedding (first stage) and the
lm_head (last stage). Under pipeline parallelism those stages sit on different ranks, so each holds
its own copy. The first stage's embedding *owns* the matrix; the last stage's lm_head is a mirror:

* after the step's last backward, :meth:`TiedPipelineEmbeddings.reduce_grads` adds the mirror's
  gradient to the owner's (one all-reduce between the two stages' ranks) and drops the mirror's, so
  gradient clipping, the optimizer and weight decay see the matrix exactly once, as at pp 1;
* after the optimizer step, :meth:`TiedPipelineEmbeddings.copy_weight` gives the mirror the updated
  matrix (one broadcast), so every checkpoint holds equal copies under both names.

Both copies start equal because ``Transformer.init_weights`` draws a tied lm_head from the
embedding's name. Both are sharded alike by every strategy (vocab-parallel under TP, dim 0 under
FSDP), so the two ranks of a pair exchange same-shaped local shards.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from .base import local


def _grad_like_param(param: torch.Tensor) -> torch.Tensor:
    """The parameter's gradient, laid out like the parameter. A vocab-parallel embedding's gradient
    comes back replicated (DTensor's embedding backward); taking this rank's rows is local."""
    grad = param.grad
    if isinstance(grad, DTensor) and grad.placements != param.placements:
        grad = param.grad = grad.redistribute(param.device_mesh, param.placements)
    return grad


class TiedPipelineEmbeddings:
    """The owner (first stage's embedding) and mirror (last stage's lm_head) of one tied matrix.

    ``model_parts``: this rank's pipeline stages. ``pp_mesh``: this rank's pipeline group, in stage
    order (torchtitan's ``parallel_dims.get_mesh("pp")``); pp is the outermost dim of the world, so
    the pipeline groups are ``{r, r + s, …}`` with stride ``s = world / pp``. The first and last
    ranks of every group form a pair; creating the pairs' process groups is collective (every rank
    calls this constructor), middle stages belong to none.
    """

    def __init__(self, model_parts: list[nn.Module], pp_mesh: DeviceMesh):
        # the modules, not their parameters: torchtitan materialises the meta-device stages afterwards
        # (``to_empty`` registers new parameter objects)
        self.owner_module = next((m.tok_embeddings for m in model_parts if m.tok_embeddings is not None), None)
        self.mirror_module = next((m.output for m in model_parts if m.output is not None), None)
        ranks, pp = pp_mesh.mesh.flatten().tolist(), pp_mesh.size()
        self.same_rank = self.owner_module is not None and self.mirror_module is not None  # V-shaped schedules
        if pp == 2:
            self.group = pp_mesh.get_group()
        else:
            stride = dist.get_world_size() // pp
            if ranks != [ranks[0] + k * stride for k in range(pp)]:
                raise ValueError(f"unexpected pipeline group {ranks}: pp must be the outermost mesh dim")
            pairs = [[r, r + (pp - 1) * stride] for r in range(stride)]
            self.group, _ = dist.new_subgroups_by_enumeration(pairs)

    @property
    def owner(self) -> torch.Tensor | None:
        return self.owner_module.weight if self.owner_module is not None else None

    @property
    def mirror(self) -> torch.Tensor | None:
        return self.mirror_module.weight if self.mirror_module is not None else None

    @torch.no_grad()
    def reduce_grads(self) -> None:
        """Owner's gradient += mirror's; the mirror's is dropped. Call once per step, after backward."""
        if self.same_rank:
            _grad_like_param(self.owner).add_(_grad_like_param(self.mirror))
        elif self.owner is not None or self.mirror is not None:
            dist.all_reduce(local(_grad_like_param(self.owner if self.owner is not None else self.mirror)),
                            group=self.group)
        if self.mirror is not None:
            self.mirror.grad = None

    @torch.no_grad()
    def copy_weight(self) -> None:
        """Mirror ← owner. Call after every optimizer step (and before the first forward)."""
        if self.same_rank:
            local(self.mirror).copy_(local(self.owner))
        elif self.owner is not None or self.mirror is not None:
            weight = self.owner if self.owner is not None else self.mirror
            dist.broadcast(local(weight), group=self.group, group_src=0)
