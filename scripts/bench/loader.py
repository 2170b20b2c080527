"""Host-side data loading speed: torchtitan's text loader vs boost_titan's pre-tokenised PackedText.

The training loop fetches each batch in the training process, between GPU steps: a loader slower
than the GPU's tokens/s sets the pace of small models. This times batch fetching alone (no model),
with the config's batch size, sequence length, dataset and tokenizer, on this machine's CPU.
PackedText tokenises the whole split when it is built: that start-up time is reported separately.

    python -m scripts.bench.loader --config train_configs/quality_60m.toml --out docs/results/loader_cpu
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.config import ConfigManager
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

from scripts.bench.results import doc_notes, env_info, print_table, write_results
from scripts.bench.timing import cuda_time_ms
from torchtitan_ext.cola_llama.data import build_tokenizer
from torchtitan_ext.cola_llama.data.datasets import PackedText


def tokens_per_s(loader, batches: int, skip: int) -> float:
    """Tokens per second of fetching one batch (median over ``batches`` fetches, ``skip`` untimed first)."""
    it = iter(loader)
    tokens = []
    ms = cuda_time_ms(lambda: tokens.append(next(it)[0]["input"].numel()), warmup=skip, repeats=batches,
                      device="cpu")
    return tokens[-1] / ms * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="train_configs/quality_60m.toml")
    p.add_argument("--batches", type=int, default=200, help="timed batch fetches (median)")
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--out", default="docs/results/loader_cpu")
    a = p.parse_args()
    cfg = ConfigManager().parse_args(["--job.config_file", a.config])
    t = cfg.training
    tokenizer = build_tokenizer(cfg)
    kwargs = {**asdict(t.dataloader), "batch_size": t.local_batch_size}
    rows = []
    for name, make in (
        ("torchtitan HuggingFaceTextDataset", lambda: HuggingFaceTextDataset(
            t.dataset, t.dataset_path, tokenizer, t.seq_len, 0, 1, infinite=True)),
        ("boost_titan PackedText", lambda: PackedText(t.dataset, t.dataset_path, tokenizer, t.seq_len, 0, 1, True)),
    ):
        start = time.perf_counter()
        loader = ParallelAwareDataloader(make(), dp_rank=0, dp_world_size=1, **kwargs)
        build_s = time.perf_counter() - start
        rate = tokens_per_s(loader, a.batches, a.skip)
        rows.append({"loader": name, "dataset": t.dataset, "batch": f"{t.local_batch_size} x {t.seq_len}",
                     "build_s": build_s, "tokens_per_s": rate})
        print(rows[-1], flush=True)
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    write_results(a.out, rows, env_info("cpu"), "Data loading speed (host only, one process)",
                  notes=doc_notes(__doc__))
    print_table(rows)


if __name__ == "__main__":
    main()
