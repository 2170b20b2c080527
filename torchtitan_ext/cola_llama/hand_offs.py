"""What the parts of one training run hand each other, in one object built with the TrainSpec.

torchtitan calls each TrainSpec function with its own slice of the job (the optimizer builder gets only
the ``[optimizer]`` section, the loop's gradient clipping nothing of ours), so the ``[boost]`` settings
and the objects one part builds for another travel here, explicitly, instead of as attributes parked
on the model or module globals:

============================  ==========================================  ================================
field                         written by                                  read by
============================  ==========================================  ================================
``boost``                     ``parallelize_cola`` / ``pipeline_cola``    the optimizer builder (the guard's
                              (the job's ``[boost]`` section)             ``skip_nonfinite_steps``)
``tied_embeddings``           ``pipeline_cola`` (a tied embedding /       the optimizer builder (refresh the
                              lm_head across pipeline stages)             mirror after every step)
``clipped``                   the loop's gradient clipping                the non-finite guard (its flag
                              (``HandOffs.note_clip``)                    from that norm, no extra pass)
``guards``                    the optimizer builder                       ``check_nonfinite_at_exit``
============================  ==========================================  ================================

One process trains one job at a time; :meth:`HandOffs.start` begins a new one (a second trainer in the
same process starts from nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class HandOffs:
    job: Any = None  # the JobConfig of the run these belong to
    tied_embeddings: Any = None  # boost_titan.parallel.pipeline.TiedPipelineEmbeddings, or None
    clipped: tuple | None = None  # (total norm, [(gradient, its version)]) of the last clipping
    guards: list = field(default_factory=list)  # faults.NonFiniteGuard of this run

    def start(self, job_config) -> None:
        """Called with the job's config by the first TrainSpec function of a run (idempotent within it)."""
        if self.job is not job_config:
            self.job, self.tied_embeddings, self.clipped, self.guards = job_config, None, None, []

    def note_clip(self, parameters, total_norm) -> None:
        """The total gradient norm the loop's clipping just returned (all-reduced over every rank's
        shards and stages), with the gradients it was computed from and their in-place version
        counters, so the non-finite guard can read its flag from that norm instead of another pass."""
        from boost_titan.parallel.local_shards import local_tensor

        grads = [p.grad for p in parameters if p.grad is not None]
        self.clipped = (total_norm.detach(), [(g, local_tensor(g)._version) for g in grads])

    @property
    def boost(self):
        """The job's ``[boost]`` section."""
        if self.job is None:
            raise RuntimeError("HandOffs.boost read before parallelize_cola / pipeline_cola started the run")
        return self.job.boost
