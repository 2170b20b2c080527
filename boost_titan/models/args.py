"""Model hyper-parameters of the CoLA / full-rank Llama family and their closed-form counts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from boost_titan.ops.attention import BACKENDS
from boost_titan.ops.float8 import RECIPES as FLOAT8_RECIPES


@dataclass
class TransformerArgs:
    """A Llama-style decoder in which every projection is dense or CoLA low-rank.

    ``attn_rank`` / ``mlp_rank`` = 0 make q,k,v,o / gate,up,down dense; a positive rank r replaces
    each dense ``W`` of that block by ``B · SiLU(A · x)`` with ``A: [r, d_in]``, ``B: [d_out, r]``.
    """

    dim: int = 256
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int | None = None  # None: multi-head attention (n_kv_heads = n_heads)
    ffn_dim: int = 768
    vocab_size: int = 2048
    attn_rank: int = 64
    mlp_rank: int = 64
    swiglu: bool = False  # MLP = SiLU(g) ⊙ u (Llama) instead of CoLA's plain g ⊙ u
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    init_std: float = 0.025  # embedding / lm_head / dense projections (BOOST configs: 0.025)
    init_seed: int = 0
    grouped: bool = True  # run the A (and B) factors that share an input as one GEMM (see Projection)
    attention: str = "sdpa"  # attention kernel: "sdpa" | "flash" (boost_titan.ops.attention)
    float8: str = "none"  # projection GEMMs: "none" (bf16) or a torchao float8 recipe (boost_titan.ops.float8)
    # forward returns HeadInput (final hidden states, lm_head weight) instead of logits, for a loss that
    # applies the head itself and never materialises the logits ([boost] fused_cross_entropy)
    defer_lm_head: bool = False

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def gemm_dims(self) -> dict[str, int]:
        """The projections' GEMM dimensions (inputs, outputs, ranks) by name; a rank of 0 (dense) is left out."""
        dims = {"dim": self.dim, "ffn_dim": self.ffn_dim, "n_kv_heads*head_dim": self.kv_heads * self.head_dim,
                "attn_rank": self.attn_rank, "mlp_rank": self.mlp_rank}
        return {k: v for k, v in dims.items() if v}

    def validate(self) -> None:
        """Fail early, one message per bad value, naming the rule."""
        checks = [
            (self.dim % self.n_heads == 0, f"dim={self.dim} must be divisible by n_heads={self.n_heads}"),
            (self.n_heads % self.kv_heads == 0,
             f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.kv_heads}"),
            ((self.dim // self.n_heads) % 2 == 0, f"head_dim={self.dim // self.n_heads} must be even (RoPE)"),
            (0 <= self.attn_rank < self.dim,
             f"attn_rank={self.attn_rank} must be 0 (dense) or in [1, dim={self.dim})"),
            (0 <= self.mlp_rank < min(self.dim, self.ffn_dim),
             f"mlp_rank={self.mlp_rank} must be 0 (dense) or in [1, min(dim, ffn_dim)={min(self.dim, self.ffn_dim)})"),
            (self.vocab_size > 0 and self.n_layers > 0, "vocab_size and n_layers must be positive"),
            (self.attention in BACKENDS, f"attention={self.attention!r} must be {' or '.join(map(repr, BACKENDS))}"),
            (self.float8 in FLOAT8_RECIPES, f"float8={self.float8!r} must be one of {FLOAT8_RECIPES}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"invalid model args: {msg}")

    def replace(self, **changes) -> TransformerArgs:
        return dataclasses.replace(self, **changes)


# ---- closed-form counts (tested against the model and a hand count) ----------------------------
def linear_params_per_layer(args: TransformerArgs) -> int:
    """Weights of the seven projections of one block (dense or low-rank)."""
    d, f, kvd = args.dim, args.ffn_dim, args.kv_heads * args.head_dim
    ra, rm = args.attn_rank, args.mlp_rank
    # (d_in, d_out) of q, k, v, o and of gate, up, down
    attn = [(d, d), (d, kvd), (d, kvd), (d, d)]
    mlp = [(d, f), (d, f), (f, d)]
    count = lambda shapes, r: sum(r * (i + o) if r else i * o for i, o in shapes)  # noqa: E731
    return count(attn, ra) + count(mlp, rm)


def count_params(args: TransformerArgs) -> int:
    """Unique parameters: L·(linear + 2 norms) + embedding (+ untied lm_head) + final norm."""
    per_layer = linear_params_per_layer(args) + 2 * args.dim
    embed = args.vocab_size * args.dim * (1 if args.tie_embeddings else 2)
    return args.n_layers * per_layer + embed + args.dim


def flops_per_token(args: TransformerArgs, seq_len: int) -> int:
    """Training FLOPs per token: 6 × (projection + lm_head weights) + attention scores.

    Same convention as torchtitan's llama3 (``6·N + 12·L·d·s``; causal masking not discounted), so
    MFU of the CoLA and full-rank families is comparable. The lm_head is counted even when tied
    (its GEMM runs either way); the embedding lookup is not.
    """
    matmul_params = args.n_layers * linear_params_per_layer(args) + args.vocab_size * args.dim
    attention = 12 * args.n_layers * args.n_heads * args.head_dim * seq_len
    return 6 * matmul_params + attention
