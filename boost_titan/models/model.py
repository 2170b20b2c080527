"""The CoLA / full-rank Llama decoder: model math only (parallel plans live in boost_titan.parallel).

Every projection group of a block is one :class:`Projection`: ``c`` outputs computed from one input,
each either dense (``W x``) or CoLA low-rank (``B σ(A x)``, σ = SiLU). Weights are stored stacked,
``[c, d_out, d_in]``, so that the whole family (q|k|v, gate|up) runs as one GEMM or one batched GEMM
and so that tensor parallelism can shard any of d_out / d_in without copies.
"""

from __future__ import annotations

import hashlib
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from boost_titan.ops import comm
from boost_titan.ops.attention import attention
from boost_titan.ops.gemm import gemm, gemm_each
from boost_titan.ops.precision import upcast
from boost_titan.ops.rmsnorm import rms_norm

from .args import TransformerArgs


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class BatchedLinear(nn.Module):
    """``c`` bias-free linear maps stacked in one weight ``[c, d_out, d_in]``.

    A parameter holder: the dense W's and the A factors all read one input, each B factor reads its
    own rank-r activation, and :class:`Projection` (which knows the layouts) does the math.
    ``std`` (one value, or one per map) is its init std.
    """

    def __init__(self, c: int, d_in: int, d_out: int, std: float | list[float]):
        super().__init__()
        self.init_std = std
        self.weight = nn.Parameter(torch.empty(c, d_out, d_in))


class Projection(nn.Module):
    """``c`` projections of one input, optionally RMS-normalised first (the block's pre-norm).

    Dense (``rank == 0``):  ``y_j = W_j · norm(x)``; ``b`` holds the W's.
    CoLA (``rank > 0``):    ``y_j = B_j · σ(A_j · norm(x))``; ``a`` holds A_1..A_c ``[c, r, d_in]``,
    ``b`` the B factors: one :class:`BatchedLinear` per run of equal ``d_out`` (q vs k|v in GQA).

    ``grouped=True`` runs the A's as one GEMM and each run of B's as one batched GEMM; ``False`` runs
    every factor on its own (same function, for the ablation). ``float8`` names a torchao float8
    recipe for every GEMM (boost_titan.ops.float8; "none": bf16). Every GEMM is one call of
    :func:`boost_titan.ops.gemm.gemm` (input, weight, the collective its input needs, the recipe),
    which picks the kernel.

    The pre-norm belongs to the projection because, under bottleneck-aware TP, the norm's statistic
    travels with the A factors' all-reduce (online RMSNorm): the two form one parallel site. Tensor
    parallel subclasses (boost_titan.parallel) reuse :meth:`down` / :meth:`up` on local shards.
    """

    def __init__(self, d_in: int, d_outs: list[int], rank: int, *, norm_eps: float | None,
                 dense_std: float, grouped: bool = True, float8: str = "none"):
        super().__init__()
        self.d_outs, self.rank, self.grouped, self.float8 = list(d_outs), rank, grouped, float8
        self.norm = RMSNorm(d_in, norm_eps) if norm_eps is not None else None
        runs = _runs_of_equal(d_outs)
        if rank == 0:
            self.a = None
            self.b = nn.ModuleList(
                [BatchedLinear(len(run), d_in, run[0], std=dense_std) for run in runs])
        else:
            self.a = BatchedLinear(len(d_outs), d_in, rank,
                                   std=[cola_std(rank, d_in, o) for o in d_outs])
            self.b = nn.ModuleList(
                [BatchedLinear(len(run), rank, run[0], std=cola_std(rank, d_in, run[0]))
                 for run in runs])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.norm is not None:
            x = self.norm(x)
        b_ws = [blk.weight for blk in self.b]
        if self.a is None:
            return self.dense(x, b_ws)
        return self.up([F.silu(h) for h in self.down(x, self.a.weight)], b_ws)

    # ``sync`` (tensor parallelism, boost_titan.parallel): the collective that makes the input whole
    # (comm.copy_sync / gather_sync); the GEMMs apply it (ops/gemm.py), so its backward overlaps the
    # weight gradient where one GEMM reads that input.
    def dense(self, x: torch.Tensor, ws: list[torch.Tensor], sync: comm.Sync | None = None) -> list[torch.Tensor]:
        return gemm_each(x, ws, sync, self.float8, self.grouped)

    def down(self, x: torch.Tensor, a_w: torch.Tensor, sync: comm.Sync | None = None) -> list[torch.Tensor]:
        """Pre-activations of the A factors: one ``[..., c·r]`` tensor if grouped, else c ``[..., r]``."""
        if self.grouped:
            return [gemm(x, a_w.flatten(0, 1), sync, self.float8)]
        return gemm_each(x, [a_w], sync, self.float8, grouped=False)

    def up(self, zs: list[torch.Tensor], b_ws: list[torch.Tensor], sync: comm.Sync | None = None) -> list[torch.Tensor]:
        """B factors on the activations from :meth:`down`; each run of B's is one batched GEMM.

        ``sync`` applies to every activation. Grouped, each run of B factors syncs its own slice of z
        (GQA's q and k|v: two all-reduces, together the size of one)."""
        if not self.grouped:
            ws = [w[j] for w in b_ws for j in range(w.shape[0])]
            return [gemm(t, w, sync, self.float8) for t, w in zip(zs, ws)]
        (z,) = zs  # one [..., c·r] tensor: each run of B's reads a strided view of it
        r, lead, out, i = b_ws[0].shape[-1], z.shape[:-1], [], 0
        z = z.reshape(-1, z.shape[-1])
        for w in b_ws:
            c = w.shape[0]
            zc = z[:, i * r:(i + c) * r].unflatten(-1, (c, r)).transpose(0, 1)  # [c, m, r], no copy
            y = gemm(zc, w, sync, self.float8)  # [c, m, d_out]: each output contiguous
            # unbind, not y[j]: its backward is one stack (each gradient written once), where
            # c selects backward into c zero-filled buffers that compiled code sums elementwise
            out += [t.view(*lead, -1) for t in y.unbind(0)]
            i += c
        return out


def _runs_of_equal(sizes: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for s in sizes:
        if runs and runs[-1][0] == s:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def cola_std(rank: int, d_in: int, d_out: int) -> float:
    """CoLA init for both factors: Var[(BA)_ij] = r·σ⁴ = 1/(d_in + d_out), Xavier-like."""
    return rank ** -0.25 * (d_in + d_out) ** -0.25


def rope_cos_sin(head_dim: int, max_seq_len: int, theta: float, device=None) -> torch.Tensor:
    """Non-interleaved RoPE table ``[max_seq_len, head_dim]``: cos in the first half, sin in the second."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x: [b, s, heads, head_dim]; rotate pairs (i, i + head_dim/2) (GPT-NeoX / flash-attn layout)."""
    cos, sin = rope[: x.shape[1]].unsqueeze(1).chunk(2, dim=-1)  # [s, 1, hd/2]
    x1, x2 = upcast(x).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        d, hd = args.dim, args.head_dim
        self.head_dim, self.backend = hd, args.attention
        depth_std = args.init_std / math.sqrt(2 * args.n_layers)  # residual-branch outputs (dense)
        self.qkv = Projection(d, [args.n_heads * hd, args.kv_heads * hd, args.kv_heads * hd], args.attn_rank,
                              norm_eps=args.norm_eps, dense_std=args.init_std, grouped=args.grouped, float8=args.float8)
        self.o = Projection(args.n_heads * hd, [d], args.attn_rank, norm_eps=None, dense_std=depth_std,
                            grouped=args.grouped, float8=args.float8)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        b, s = q.shape[:2]  # not x's: under sequence parallelism x holds a sequence shard
        q, k, v = (t.view(b, s, -1, self.head_dim) for t in (q, k, v))  # local heads under TP
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = attention(q, k, v, self.backend)  # [b, s, heads, head_dim]
        (y,) = self.o(out.reshape(b, s, -1))
        return y


class FeedForward(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        d, f = args.dim, args.ffn_dim
        self.swiglu = args.swiglu
        self.gate_up = Projection(d, [f, f], args.mlp_rank, norm_eps=args.norm_eps, dense_std=args.init_std,
                                  grouped=args.grouped, float8=args.float8)
        self.down = Projection(f, [d], args.mlp_rank, norm_eps=None,
                               dense_std=args.init_std / math.sqrt(2 * args.n_layers), grouped=args.grouped, float8=args.float8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x)
        # CoLA: the SiLUs inside the bottlenecks are the non-linearity, so no extra SiLU on g.
        (y,) = self.down(F.silu(g) * u if self.swiglu else g * u)
        return y


class TransformerBlock(nn.Module):
    """Pre-norm block; the two pre-norms live in ``attention.qkv.norm`` and ``feed_forward.gate_up.norm``."""

    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x, rope)
        return x + self.feed_forward(x)


class HeadInput(NamedTuple):
    """What :class:`Transformer` returns when the loss applies the lm_head itself (fused linear +
    cross-entropy, ``defer_lm_head``): the final hidden states and the lm_head weight, as read
    inside the forward (under FSDP2: the unsharded, compute-dtype parameter)."""

    hidden: torch.Tensor
    weight: torch.Tensor


class Transformer(nn.Module):
    """Top-level names follow torchtitan's ``pipeline_llm``: tok_embeddings, layers, norm, output.

    Any of them may be None (a pipeline stage); forward and init_weights skip what is missing.
    ``args.defer_lm_head`` (the ``defer_lm_head`` attribute) makes forward return :class:`HeadInput`
    instead of logits, for a loss that fuses the lm_head GEMM with the cross-entropy and never
    materialises the logits.
    """

    def __init__(self, args: TransformerArgs):
        super().__init__()
        args.validate()
        self.model_args = args
        self.defer_lm_head = args.defer_lm_head
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer("rope", rope_cos_sin(args.head_dim, args.max_seq_len, args.rope_theta),
                             persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor, attention_masks=None, positions=None) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        h = self.norm(h) if self.norm is not None else h
        if self.output is None:
            return h
        return HeadInput(h, self.output.weight) if self.defer_lm_head else self.output(h)

    def tie_weights(self) -> None:
        """Point the lm_head at the embedding's parameter again when ``tie_embeddings`` is set.

        Two things replace parameters module by module and so silently untie a shared weight:
        ``nn.Module.to_empty`` (torchtitan materialises its meta-device model with it) and
        ``parallelize_module``. Both ends are ``[vocab, dim]`` with the same layout, so re-tying is
        exact; call it before an optimizer sees the parameters (``init_weights`` does).
        """
        if not (self.model_args.tie_embeddings and self.tok_embeddings is not None and self.output is not None):
            return
        emb, head = self.tok_embeddings.weight, self.output.weight
        if head is emb:
            return
        layout = lambda t: (type(t), t.shape, getattr(t, "placements", None), getattr(t, "device_mesh", None))  # noqa: E731
        if layout(emb) != layout(head):
            raise ValueError(f"tie_embeddings=True but the embedding and the lm_head differ in shape or distribution "
                             f"({tuple(emb.shape)} {layout(emb)[2]} vs {tuple(head.shape)} {layout(head)[2]}), so "
                             "they cannot share one parameter: "
                             "shard both on the vocabulary (boost_titan.parallel.apply_tp does)")
        self.output.weight = emb

    def get_attention_masks(self, input_batch, tokenizer, extra_inputs=None):
        """Plain causal SDPA over packed documents (as torchtitan's sdpa path): no mask object."""
        return None

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Initialise every parameter from (init_seed, parameter name) alone.

        Each rank draws the *full* tensor of a parameter from a generator seeded by its name and keeps
        its own shard, so the full weights never depend on the tp/pp/dp layout.
        """
        self.tie_weights()
        device = buffer_device or next(iter(self.buffers())).device
        self.rope = rope_cos_sin(self.model_args.head_dim, self.model_args.max_seq_len, self.model_args.rope_theta, device)
        seen = set()
        for mod_name, module in self.named_modules():
            for p_name, param in module.named_parameters(recurse=False):
                if id(param) in seen:  # the tied lm_head: drawn once, as tok_embeddings.weight
                    continue
                seen.add(id(param))
                std = None if isinstance(module, RMSNorm) else getattr(module, "init_std", self.model_args.init_std)
                name = canonical_name(f"{mod_name}.{p_name}")
                if name == "output.weight" and self.model_args.tie_embeddings:
                    name = "tok_embeddings.weight"  # a pipeline stage's lm_head mirrors the first stage's embedding
                init_parameter(param, name, std, self.model_args.init_seed)


def canonical_name(name: str) -> str:
    """Parameter FQN without the wrappers that torch.compile / activation checkpointing insert."""
    for wrapper in ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module."):
        name = name.replace(wrapper, "")
    return name


def name_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**31 - 1)


def init_parameter(param: torch.Tensor, name: str, std, seed: int) -> None:
    """``std=None`` means ones (norm weights); otherwise N(0, std²) drawn from the name's seed.

    ``std`` may be a list, one value per slice of dim 0 (the stacked A factors of q|k|v in GQA).
    """
    local = param.to_local() if hasattr(param, "to_local") else param
    if std is None:
        local.fill_(1.0)
        return
    gen = torch.Generator(device=local.device).manual_seed(name_seed(seed, name))
    full = torch.randn(param.shape, generator=gen, device=local.device, dtype=torch.float32)
    full *= torch.tensor(std, device=full.device).view(-1, *[1] * (full.dim() - 1)) if isinstance(std, list) else std
    if local is not param:  # DTensor (TP and/or FSDP): keep this rank's shard, no communication
        from torch.distributed.tensor import distribute_tensor

        full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
    local.copy_(full)
