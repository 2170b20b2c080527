"""The emulating trainer (``torchtitan_ext.runtime.emulate``) with torchtitan 0.2.2's own train step instead of
the project's sync-free one (``torchtitan_ext/runtime/train.py``): the baseline arm of
``python -m scripts.bench.e2e --emulate --torchtitan-step ...``."""

from torchtitan import train as titan_train

from torchtitan_ext.runtime.emulate import EmulatedTrainer
from torchtitan_ext.runtime.train import main_then_exit


class TorchtitanStepTrainer(EmulatedTrainer):
    train_step = titan_train.Trainer.train_step


if __name__ == "__main__":
    main_then_exit(TorchtitanStepTrainer)
