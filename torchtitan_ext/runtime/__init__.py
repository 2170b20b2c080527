"""What boost_titan adds to torchtitan's trainer around the family: the train step (:mod:`.train`,
gradient accumulation with one sync, the step replayed as a CUDA graph in :mod:`.step_graph`), the
non-finite guard and fault handling (:mod:`.faults`), the configuration check before any rank
starts (:mod:`.preflight`), log lines (:mod:`.logs`), the CPU device shim (:mod:`.cpu_shim`) and
the one-GPU emulation of a multi-GPU layout (:mod:`.emulate`)."""

import dataclasses


def around_family(spec):
    """The family's TrainSpec with what the runtime hooks into it: the non-finite guard around the
    optimizer builder (:func:`.faults.with_nonfinite_guard`) and the progress metrics processor
    (:func:`.logs.build_metrics_processor`). The runtime loads the family, never the reverse."""
    from torchtitan_ext.runtime.faults import with_nonfinite_guard
    from torchtitan_ext.runtime.logs import build_metrics_processor

    return dataclasses.replace(spec, build_optimizers_fn=with_nonfinite_guard(spec.build_optimizers_fn, spec.hand_offs),
                               build_metrics_processor_fn=build_metrics_processor)
