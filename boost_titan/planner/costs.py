"""What the planner knows about each tensor-parallel strategy, and the measured constants it predicts from.

:data:`COSTS` holds each registered strategy's planner parameters by name, a :class:`StrategyCosts`:
its per-rank compute rate by tp and its activation memory per token and layer. The shipped
strategies read theirs from ``measured_h200.json`` beside this file (docs/design.md, "The planner's
measured constants", says where each value comes from); a new strategy adds its own entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

MEASURED_FILE = Path(__file__).with_name("measured_h200.json")


@cache
def measured_constants() -> dict:
    """The parsed ``measured_h200.json``."""
    return json.loads(MEASURED_FILE.read_text())


def nearest_tp(by_tp: dict[int, float], tp: int) -> tuple[int, float]:
    """(the measured tp used, its value): ``tp`` itself, else the nearest measured one (the larger on a tie)."""
    used = min(by_tp, key=lambda t: (abs(t - tp), -t))
    return used, by_tp[used]


def host_per_block(kind: str, tp: int) -> float:
    """The host's seconds per block of ``kind`` (``measured_h200.json`` ``host_per_block_s``: ``fsdp``,
    ``fsdp_one_unit``, ``one_rank``, ``pipeline_pass``, ``pipeline_step``) at ``tp``, or the nearest
    measured tp."""
    return nearest_tp({int(t): v for t, v in measured_constants()["host_per_block_s"][kind].items()}, tp)[1]


@dataclass(frozen=True)
class StrategyCosts:
    """A strategy's planner parameters.

    ``tflops_by_tp``: per-rank model TFLOP/s at each measured tp (a tp not listed takes the nearest one).
    ``activation_d``: ``(A_sh, A_rep)``, activation bytes per token and layer in units of d, as
    ``A_sh / tp + A_rep`` (what the strategy shards over tp, and what it keeps whole).
    ``same_layout_at_tp1``: the strategy this one equals without tensor parallelism (its tp 1
    layouts are not listed twice).
    """

    tflops_by_tp: dict[int, float]
    activation_d: tuple[float, float]
    same_layout_at_tp1: str | None = None

    def __post_init__(self):
        if not self.tflops_by_tp or any(t < 1 or rate <= 0 for t, rate in self.tflops_by_tp.items()):
            raise ValueError(f"tflops_by_tp={self.tflops_by_tp!r} needs at least one positive rate per tp >= 1")

    def rate(self, tp: int) -> tuple[int, float]:
        """(the measured tp used, its TFLOP/s): ``tp`` itself, else the nearest (the larger on a tie)."""
        return nearest_tp(self.tflops_by_tp, tp)

    @classmethod
    def measured(cls, name: str, same_layout_at_tp1: str | None = None) -> StrategyCosts:
        """The entry ``name`` of ``measured_h200.json``."""
        entry = measured_constants()["strategies"][name]
        return cls({int(t): rate for t, rate in entry["tflops_by_tp"].items()}, tuple(entry["activation_d"]),
                   same_layout_at_tp1)


COSTS: dict[str, StrategyCosts] = {
    "btp": StrategyCosts.measured("btp"),
    "vanilla": StrategyCosts.measured("vanilla", same_layout_at_tp1="btp"),  # at tp 1 it is btp
    "fullrank": StrategyCosts.measured("fullrank"),
}
