"""The trainer of ``test_step_graph_runs_the_plain_step``: every step goes through
:class:`torchtitan_ext.runtime.step_graph.StepGraph` — its static device buffers, its device learning rates, the
trainer's ``device_step`` — run eagerly (``capture=False``: no CUDA graph on a CPU), launched by
``scripts/run_train.sh`` as ``TRAIN_FILE=tests.step_graph_trainer``.

``device_step`` is what a CUDA graph captures (this process's third step on a GPU, after two eager
ones), so from then on it must not read a tensor's value on the host: a capture fails on any such read.
Here every op it dispatches from the third step on is watched, and a host read
(``.item()``, ``bool(t)``, ``.tolist()``: ``aten._local_scalar_dense``) or an op whose output shape
depends on values (``nonzero``, ``masked_select``, ``unique``) fails the run with the op's name."""

from torch.utils._python_dispatch import TorchDispatchMode

from torchtitan_ext.runtime.step_graph import WARMUP_STEPS, StepGraph
from torchtitan_ext.runtime.train import Trainer, main_then_exit

HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive"}


class NoHostReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS:
            raise RuntimeError(f"device_step read a tensor on the host (aten.{name}): a CUDA graph cannot capture that")
        return func(*args, **(kwargs or {}))


class EagerStepGraphTrainer(Trainer):
    def __init__(self, job_config):
        super().__init__(job_config)
        self.step_graph = StepGraph(self, capture=False)

    def device_step(self, microbatches):
        if self.step_graph.eager_steps <= WARMUP_STEPS:  # the steps a GPU runs eagerly before its capture
            return super().device_step(microbatches)
        with NoHostReads():
            return super().device_step(microbatches)


if __name__ == "__main__":
    main_then_exit(EagerStepGraphTrainer)
