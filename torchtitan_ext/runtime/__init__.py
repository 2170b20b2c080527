"""What boost_titan adds to torchtitan's trainer around the family: the train step (:mod:`.train`,
gradient accumulation with one sync, the step replayed as a CUDA graph in :mod:`.step_graph`), the
non-finite guard and fault handling (:mod:`.faults`), the configuration check before any rank
starts (:mod:`.preflight`), log lines (:mod:`.logs`), the CPU device shim (:mod:`.cpu_shim`) and
the one-GPU emulation of a multi-GPU layout (:mod:`.emulate`)."""
