"""Several nodes on one machine: two ``scripts/run_train.sh`` launchers act as 2 nodes × 2 gloo ranks,
meeting at one c10d rendezvous endpoint on localhost (NNODES=2, NODE_RANK, RDZV_ENDPOINT), as
``scripts/multinode_trainer.slurm`` starts them on a cluster.

- btp tp 2 inside each node × FSDP over the two nodes gives the losses of the same layout on one
  4-rank node: in
  tests/test_torchtitan_e2e.py (``test_two_nodes_match_one_node``), beside those one-node runs;
- killing one node's launcher ends the other node's ranks too (no rank trains on alone);
- a layout whose tp group would span two nodes, or a missing rendezvous setting, stops before any
  rank starts, with one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from test_torchtitan_e2e import COMMON, CONFIG, ROOT, RUN_TRAIN, TP2, tiny

from conftest import free_port

pytestmark = pytest.mark.e2e

TP2_FSDP2 = tiny(*TP2, "--parallelism.data_parallel_shard_degree", "2")


def _start(dump, args, ngpu: int, log_rank: int, **env) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if k not in ("COMM_MODE", "TRAIN_FILE")}
    full_env.update(NGPU=str(ngpu), LOG_RANK=str(log_rank), CONFIG_FILE=str(CONFIG), **env)
    return subprocess.Popen([str(RUN_TRAIN), *COMMON, "--job.dump_folder", str(dump), *args], cwd=ROOT,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _nodes(dump, args, nodes: int = 2, ngpu: int = 2, log_rank: int = 0) -> list[subprocess.Popen]:
    endpoint = f"127.0.0.1:{free_port()}"
    return [_start(dump, args, ngpu, log_rank, NNODES=str(nodes), NODE_RANK=str(i), RDZV_ENDPOINT=endpoint,
                   RDZV_ID="test") for i in range(nodes)]


def test_killing_one_node_ends_the_other(tmp_path):
    procs = _nodes(tmp_path, (*TP2_FSDP2, "--training.steps", "1000"))
    first, second = procs
    deadline = time.monotonic() + 240
    seen = ""
    while "step:" not in seen and time.monotonic() < deadline:  # both nodes training
        line = first.stdout.readline()
        assert line or first.poll() is None, f"node 0 ended before training:\n{seen[-3000:]}"
        seen += line
    assert "step:" in seen, seen[-3000:]
    os.kill(second.pid, signal.SIGKILL)  # node 1's launcher (run_train.sh exec'd torchrun)
    killed = time.monotonic()
    try:
        first.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(first.pid, signal.SIGKILL)
        pytest.fail("node 0 kept running for 120 s after node 1's launcher was killed")
    assert first.returncode != 0
    waited = time.monotonic() - killed
    time.sleep(2)
    leftover = subprocess.run(["pgrep", "-f", f"job.dump_folder {tmp_path}"], capture_output=True, text=True).stdout
    assert not leftover.strip(), f"ranks still alive {waited:.0f} s after the kill: {leftover}"


def test_multinode_config_errors(tmp_path):
    """Through run_train.sh once (the variables reach the preflight), then the rules in process."""
    from torchtitan_ext.runtime.preflight import problems

    proc = _start(tmp_path, tiny(), 2, 0, NNODES="2", NODE_RANK="0")
    out, _ = proc.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("config error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "NNODES=2 needs RDZV_ENDPOINT=host:port" in lines[0], out[-2000:]
    base = ["--job.config_file", str(CONFIG), *tiny()]
    endpoint = "127.0.0.1:29500"
    assert problems(base + list(TP2), 4, 2, "1", endpoint) == []
    assert problems(base, 4, 2, "", endpoint) == ["NNODES=2 needs NODE_RANK=0..1 on each node (got '')"]
    (line,) = problems(base + ["--parallelism.tensor_parallel_degree", "4"], 4, 2, "0", endpoint)
    assert line.startswith("tensor_parallel_degree=4 must divide the ranks per node NGPU=2")
