"""On a GPU machine the CPU tests stay on the CPU (tests/conftest.py): the processes a test starts see
no GPU unless the test is marked ``gpu``."""

import subprocess
import sys

import pytest
import torch

from conftest import VISIBLE_AT_START

SHOW = [sys.executable, "-c", "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"]


def _seen() -> str:
    return subprocess.run(SHOW, capture_output=True, text=True, check=True).stdout.strip()


def test_a_started_process_sees_no_gpu():
    assert _seen() == "''"


@pytest.mark.gpu
def test_a_gpu_test_keeps_the_machines_gpus():
    assert _seen() == repr(VISIBLE_AT_START)


@pytest.mark.gpu
def test_a_gpu_test_counts_the_machines_gpus():
    """torch's device count reads CUDA_VISIBLE_DEVICES until CUDA is initialised: a gpu test sees the
    GPUs that ``is_available`` found when the test process started."""
    assert (torch.cuda.device_count() > 0) == torch.cuda.is_available()
