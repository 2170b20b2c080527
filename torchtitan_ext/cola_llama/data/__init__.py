"""Offline tokenizers and datasets, plugged into torchtitan through its TrainSpec builder hooks."""

from torchtitan_ext.cola_llama.data.datasets import (
    build_dataloader,
    build_validation_dataloader,
    build_validator,
)
from torchtitan_ext.cola_llama.data.tokenizer import SentencePieceTokenizer, TiktokenTokenizer, build_tokenizer

__all__ = [
    "SentencePieceTokenizer",
    "TiktokenTokenizer",
    "build_dataloader",
    "build_tokenizer",
    "build_validation_dataloader",
    "build_validator",
]
