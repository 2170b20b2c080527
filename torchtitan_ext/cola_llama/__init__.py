"""The ``cola_llama`` model family for torchtitan, laid out like torchtitan's ``models/llama3``:
the TrainSpec (:mod:`.spec`), parallelize (:mod:`.parallelize`: TP plans, FSDP2, compile,
checkpointing) and pipeline stages, the state-dict adapter (:mod:`.state_dict_adapter`), the data
(:mod:`.data`: offline tokenizers and datasets), and :mod:`.job_config`: the ``[boost]`` section and
every rule a job must follow, the one place that checks a job. :mod:`.peers` registers torchtitan's
llama3 at our dense shapes as a reference. The model math itself is the library's (``boost_titan.models``).
"""
