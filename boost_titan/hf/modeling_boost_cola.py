"""A CoLA low-rank bottleneck LLM for Hugging Face ``transformers`` (exported by boost_titan).

The model is Llama with every projection ``W x`` (q, k, v, o, gate, up, down) replaced by
``B σ(A x)``, σ = SiLU, ``A: [rank, d_in]``, ``B: [d_out, rank]``, no biases. Attention projections
use ``attn_rank``, MLP projections ``mlp_rank`` (0: that block stays dense). With
``hidden_act = "linear"`` the MLP is ``down(gate(x) ⊙ up(x))``: CoLA's SiLUs inside the bottlenecks
are its non-linearity. Weights: ``model.layers.<i>.<module>.A.weight`` and ``.B.weight`` where Llama
has ``model.layers.<i>.<module>.weight``; everything else (norms, RoPE, attention, cache,
generation) is transformers' Llama.

Load with ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``. This file needs
only torch and transformers; boost_titan copies it beside every CoLA export.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


class ColaConfig(LlamaConfig):
    model_type = "boost_cola"

    def __init__(self, attn_rank: int = 0, mlp_rank: int = 0, **kwargs):
        self.attn_rank = attn_rank
        self.mlp_rank = mlp_rank
        super().__init__(**kwargs)


class LowRankLinear(nn.Module):
    """``B σ(A x)``: the bottleneck that replaces one dense ``nn.Linear(d_in, d_out, bias=False)``."""

    def __init__(self, d_in: int, d_out: int, rank: int):
        super().__init__()
        self.A = nn.Linear(d_in, rank, bias=False)
        self.B = nn.Linear(rank, d_out, bias=False)

    def forward(self, x):
        return self.B(F.silu(self.A(x)))


class ColaForCausalLM(LlamaForCausalLM):
    config_class = ColaConfig

    def __init__(self, config: ColaConfig):
        super().__init__(config)
        for layer in self.model.layers:
            for block, names, rank in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj"), config.attn_rank),
                                       (layer.mlp, ("gate_proj", "up_proj", "down_proj"), config.mlp_rank)):
                for name in names if rank else ():
                    dense = getattr(block, name)
                    setattr(block, name, LowRankLinear(dense.in_features, dense.out_features, rank))
        self.post_init()
