"""On a GPU machine the CPU tests stay on the CPU (tests/conftest.py): the processes a test starts see
no GPU unless the test is marked ``gpu``, which sees the machine's GPUs, also under pytest-xdist."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import MACHINE_GPUS_VAR, ROOT

SHOW = [sys.executable, "-c", "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"]


def _seen() -> str:
    return subprocess.run(SHOW, capture_output=True, text=True, check=True).stdout.strip()


def test_a_started_process_sees_no_gpu():
    assert _seen() == "''"


@pytest.mark.gpu
def test_a_gpu_test_counts_the_machines_gpus():
    """torch's device count reads CUDA_VISIBLE_DEVICES until CUDA is initialised: a gpu test sees the
    GPUs that ``is_available`` found when the test process started."""
    assert (torch.cuda.device_count() > 0) == torch.cuda.is_available()


INNER_TESTS = '''
import os, subprocess, sys
import pytest

SHOW = {show!r}

def seen():
    return subprocess.run(SHOW, capture_output=True, text=True, check=True).stdout.strip()

@pytest.mark.gpu
def test_gpu_test_sees_the_machines_gpus():
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == {visible!r}
    assert seen() == repr({visible!r})

def test_cpu_test_sees_none():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and seen() == "''"
'''


@pytest.mark.parametrize("visible, parallel", [("0", ["-n", "2"]), (None, ["-p", "no:xdist"])],
                         ids=["xdist_workers", "one_process_no_variable"])
def test_a_pytest_run_gives_gpu_tests_the_machines_gpus(tmp_path, visible, parallel):
    """A pytest run of this conftest, started with CUDA_VISIBLE_DEVICES=0 (or unset): its gpu test sees
    exactly that, its other test sees no GPU. Under xdist the workers start after the main process hid
    the GPUs, so they must learn the machine's GPUs from it."""
    if parallel[0] == "-n":
        pytest.importorskip("xdist")
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: uses the GPU\n")
    (tmp_path / "test_inner.py").write_text(INNER_TESTS.format(show=SHOW, visible=visible))
    env = {k: v for k, v in os.environ.items() if k not in (MACHINE_GPUS_VAR, "CUDA_VISIBLE_DEVICES")}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *parallel, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
