"""Dropping torchtitan's log lines that do not apply to this project's runs (shared by the family and
the runtime: torchtitan logs through the root logger)."""

import logging

# torchtitan's verdict on TP/PP without FSDP, wrong once parallelize_cola gave the layout mixed precision
TORCHTITAN_AMP_OFF = ("Mixed precision training with TP or PP is only supported", "Mixed precision training is disabled")


class DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record):
        return not record.getMessage().startswith(self.prefixes)


def drop(prefixes: tuple[str, ...]) -> None:
    """Drop root-logger messages starting with any of ``prefixes`` from now on (this process)."""
    logging.getLogger().addFilter(DropMessages(prefixes))
