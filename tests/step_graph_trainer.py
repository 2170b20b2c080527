"""The trainer of ``test_step_graph_runs_the_plain_step``: every step goes through
:class:`torchtitan_ext.step_graph.StepGraph` — its static device buffers, its tensor learning rate, the
trainer's ``device_step`` — run eagerly (``capture=False``: no CUDA graph on a CPU), launched by
``scripts/run_train.sh`` as ``TRAIN_FILE=tests.step_graph_trainer``."""

from torchtitan_ext.step_graph import StepGraph
from torchtitan_ext.train import Trainer, main_then_exit


class EagerStepGraphTrainer(Trainer):
    def __init__(self, job_config):
        super().__init__(job_config)
        self.step_graph = StepGraph(self, capture=False)


if __name__ == "__main__":
    main_then_exit(EagerStepGraphTrainer)
