"""Hugging Face export and import of the family (``transformers`` is not needed to write or read)."""

from boost_titan.hf.convert import (
    args_from_hf_config,
    from_hf,
    hf_config,
    load_hf,
    save_hf,
    to_hf,
    write_hf_metadata,
)

__all__ = ["args_from_hf_config", "from_hf", "hf_config", "load_hf", "save_hf", "to_hf", "write_hf_metadata"]
