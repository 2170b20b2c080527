"""An exported Hugging Face directory on a device: our model vs transformers, and generation (MEASURED).

    python -m scripts.bench.hf_export_check DIR [--device cuda] [--out docs/results/hf_export_h200]

Loads DIR twice on the device — with boost_titan (``checkpoints.load_model``) and with transformers
(``AutoModelForCausalLM``, ``trust_remote_code``) — and reports: the logits' largest difference on a
fixed batch (fp32), greedy tokens of ``generate`` on the device vs on the CPU and vs transformers'
``generate``, and the time of sampling 64 tokens (no KV cache in ours; transformers' with its cache).
"""

from __future__ import annotations

import argparse
import time

import torch

from boost_titan.checkpoints import load_model
from boost_titan.generation import generate
from scripts.bench.results import env_info, print_table, write_results


def _seconds(fn) -> tuple[object, float]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from transformers import AutoModelForCausalLM

    ours = load_model(a.export, device=a.device)
    theirs = AutoModelForCausalLM.from_pretrained(a.export, trust_remote_code=True, dtype=torch.float32).to(a.device)
    args = ours.model_args
    seq = min(256, args.max_seq_len)
    new = min(a.new_tokens, args.max_seq_len - 8)  # within the RoPE table (ours crops, transformers would not)
    tokens = torch.randint(0, args.vocab_size, (4, seq), generator=torch.Generator().manual_seed(0)).to(a.device)
    with torch.no_grad():
        mine, ref = ours(tokens), theirs(tokens).logits
    prompt = tokens[:2, :8]
    (greedy, t_ours) = _seconds(lambda: generate(ours, prompt, new))
    (hf_greedy, t_hf) = _seconds(lambda: theirs.generate(prompt, attention_mask=torch.ones_like(prompt),
                                                         max_new_tokens=new, do_sample=False,
                                                         pad_token_id=0))
    cpu = generate(load_model(a.export, device="cpu"), prompt.cpu(), new)
    rows = [{"check": f"logits, max |ours − transformers| / max |logits| (fp32, 4 x {seq})",
             "value": f"{((mine - ref).abs().max() / ref.abs().max()).item():.2e}"},
            {"check": f"greedy {new} tokens x 2: {a.device} == cpu", "value": bool(torch.equal(greedy.cpu(), cpu))},
            {"check": f"greedy {new} tokens x 2: ours == transformers.generate",
             "value": bool(torch.equal(greedy, hf_greedy))},
            {"check": f"seconds for {new} tokens x 2, ours (no KV cache)", "value": round(t_ours, 3)},
            {"check": f"seconds for {new} tokens x 2, transformers (KV cache)", "value": round(t_hf, 3)}]
    print_table(rows)
    if a.out:
        write_results(a.out, rows, {**env_info(a.device), "export": a.export, "model": type(theirs).__name__},
                      f"MEASURED: Hugging Face export of {type(theirs).__name__} on {a.device}",
                      notes="One run, wall-clock seconds after a CUDA synchronize (includes the first calls' "
                            "warm-up: a check, not a benchmark).")


if __name__ == "__main__":
    main()
