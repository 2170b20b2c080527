"""Sample text from a trained model: a DCP checkpoint of the training loop or an exported directory.

    python scripts/generate.py outputs/debug_cpu/checkpoint/step-30 --flavor debugmodel --prompt "The Union"
    python scripts/generate.py outputs/debug_cpu/checkpoint/step-30 --prompt "The Union"   # HF export
    python scripts/generate.py DIR --temperature 0.8 --top-p 0.95 --max-new-tokens 100 --num-samples 3

Greedy by default (``--temperature 0``). Runs on the GPU when there is one (``--device`` to choose).
The tokenizer must be the one the model was trained with (``[boost] tokenizer``; default gpt2).
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import torch

from boost_titan.checkpoints import load_model
from boost_titan.generation import generate
from torchtitan_ext.cola_llama.data import build_tokenizer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a DCP step-N folder or a Hugging Face directory")
    p.add_argument("--flavor", help="the model flavor (DCP checkpoints only; an HF directory has config.json)")
    p.add_argument("--tokenizer", default="gpt2", help="gpt2 | cl100k_base | file.tiktoken | HF dir | none "
                   "(none: --prompt is space-separated token ids)")
    p.add_argument("--prompt", default="The")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args(argv)

    try:
        model = load_model(a.checkpoint, a.flavor, device=a.device, dtype=getattr(torch, a.dtype))
        tokenizer = build_tokenizer(SimpleNamespace(boost=SimpleNamespace(tokenizer=a.tokenizer)))
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"generate: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    args = model.model_args
    ids = [int(t) for t in a.prompt.split()] if tokenizer is None else tokenizer.encode(a.prompt)
    if tokenizer is not None and tokenizer.get_vocab_size() > args.vocab_size:
        print(f"generate: tokenizer {a.tokenizer!r} has {tokenizer.get_vocab_size()} tokens, the model "
              f"{args.vocab_size}: not the tokenizer it was trained with", file=sys.stderr)
        return 2
    if not ids or max(ids) >= args.vocab_size:
        print(f"generate: the prompt must encode to 1..{args.vocab_size - 1}, got {ids[:8]}", file=sys.stderr)
        return 2
    prompt = torch.tensor([ids] * a.num_samples, device=a.device)
    generator = torch.Generator(device=a.device).manual_seed(a.seed)
    start = time.perf_counter()
    out = generate(model, prompt, a.max_new_tokens, temperature=a.temperature, top_p=a.top_p,
                   max_seq_len=args.max_seq_len, generator=generator)
    seconds = time.perf_counter() - start
    for i, row in enumerate(out.tolist()):
        text = " ".join(map(str, row)) if tokenizer is None else tokenizer.decode(row)
        print(f"--- sample {i + 1} ---\n{text}")
    new = (out.shape[1] - prompt.shape[1]) * a.num_samples
    print(f"[{new} tokens in {seconds:.1f} s on {a.device}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
