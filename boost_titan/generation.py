"""Sampling text from a model of the family: greedy, temperature and top-p (nucleus).

No KV cache: every new token runs the whole sequence again (the training model, unchanged). That
costs O(n²) in the length, fine for looking at samples and for tests; serve with an exported
directory (boost_titan.hf) in an inference engine.
"""

from __future__ import annotations

import torch
from torch import nn


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids ``[b]`` from last-position logits ``[b, vocab]``. ``temperature`` 0: greedy
    (argmax); otherwise softmax(logits / T) restricted to the smallest set of tokens whose
    probability reaches ``top_p`` (the most likely token always stays)."""
    if not temperature > 0:
        return logits.argmax(-1)
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the more likely tokens
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    choice = torch.multinomial(sorted_probs, 1, generator=generator)
    return order.gather(-1, choice).squeeze(-1)


@torch.no_grad()
def generate(model: nn.Module, tokens: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             top_p: float = 1.0, max_seq_len: int | None = None, generator: torch.Generator | None = None,
             eos_id: int | None = None) -> torch.Tensor:
    """Append ``max_new_tokens`` sampled tokens to ``tokens [b, s]``; returns ``[b, s + new]``.

    ``model(tokens)`` must return logits ``[b, s, vocab]``. The context is cut to its last
    ``max_seq_len`` tokens (the RoPE table's length). Stops early once every row has produced
    ``eos_id``.
    """
    if tokens.dim() != 2 or tokens.shape[1] == 0:
        raise ValueError(f"tokens must be [batch, length ≥ 1], got {tuple(tokens.shape)}")
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(max_new_tokens):
        context = tokens if max_seq_len is None else tokens[:, -max_seq_len:]
        logits = model(context)[:, -1]
        next_ids = sample_next(logits, temperature, top_p, generator)
        tokens = torch.cat([tokens, next_ids[:, None]], dim=1)
        if eos_id is not None:
            done |= next_ids == eos_id
            if bool(done.all()):
                break
    return tokens
