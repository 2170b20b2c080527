"""Model flavors: BOOST's CoLA sizes (docs/design.md, "The model"; r = d/4) and their dense twins ``<name>_fullrank``."""

from .args import TransformerArgs

_COLA = {
    # name:      dim, layers, heads, ffn,  rank, vocab, tied
    "tiny": (64, 2, 4, 160, 16, 512, False),  # tests: fast on CPU (synthetic tokens)
    "tiny_tied": (64, 2, 4, 160, 16, 512, True),  # tests: a tied embedding / lm_head, as 1B-30B
    "debugmodel": (256, 4, 8, 768, 64, 50304, False),  # vocab covers the shipped GPT-2 tokenizer
    "60M": (512, 8, 8, 1344, 128, 32000, False),
    "1B": (2048, 24, 32, 5472, 512, 32000, True),
    "3B": (3072, 28, 24, 8192, 768, 32000, True),
    "7B": (4096, 32, 32, 11008, 1024, 32000, True),
    "13B": (5120, 40, 40, 13824, 1280, 32000, True),
    "30B": (8192, 36, 64, 22016, 2048, 32000, True),
}


_DENSE = {
    # name:                  dim, layers, heads, ffn,  vocab, tied
    # a dense model with about CoLA-60M's training FLOPs per token: the quality experiment's
    # equal-compute arm (scripts/bench/quality.py)
    "60M_flopmatch_fullrank": (384, 8, 6, 1280, 32000, False),
}


class Flavors(dict):
    """Flavor name → args; an unknown name fails with the list of known ones."""

    def __missing__(self, name):
        raise ValueError(f"unknown cola_llama flavor {name!r}; available: {', '.join(self)}")


def _flavors() -> Flavors:
    out = Flavors()
    for name, (d, layers, heads, f, r, vocab, tied) in _COLA.items():
        common = dict(dim=d, n_layers=layers, n_heads=heads, ffn_dim=f, vocab_size=vocab, tie_embeddings=tied)
        out[name] = TransformerArgs(**common, attn_rank=r, mlp_rank=r, swiglu=False)
        out[f"{name}_fullrank"] = TransformerArgs(**common, attn_rank=0, mlp_rank=0, swiglu=True)
    for name, (d, layers, heads, f, vocab, tied) in _DENSE.items():
        out[name] = TransformerArgs(dim=d, n_layers=layers, n_heads=heads, ffn_dim=f, vocab_size=vocab,
                                    tie_embeddings=tied, attn_rank=0, mlp_rank=0, swiglu=True)
    return out


FLAVORS: Flavors = _flavors()
