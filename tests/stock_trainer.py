"""The reference of ``test_train_step_matches_torchtitans``: the project's trainer with torchtitan
0.2.2's own ``Trainer.train_step`` (the one torchtitan_ext/runtime/train.py replaces), launched by
``scripts/run_train.sh`` as ``TRAIN_FILE=tests.stock_trainer``."""

from torchtitan import train as titan_train

from torchtitan_ext.runtime.train import Trainer, main_then_exit


class StockStepTrainer(Trainer):
    train_step = titan_train.Trainer.train_step


if __name__ == "__main__":
    main_then_exit(StockStepTrainer)
