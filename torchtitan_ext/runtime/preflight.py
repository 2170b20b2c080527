"""Check a cola_llama training config before any rank starts: one line per problem, exit status 2.

    python -m torchtitan_ext.runtime.preflight --job.config_file train_configs/debug_cpu.toml [--section.key value ...]

``scripts/run_train.sh`` runs it first (with ``NGPU``), so that a bad flavor, strategy, parallel layout,
tokenizer, dataset or file fails in a few seconds with one readable line instead of a traceback per
rank after start-up. The rules are the family's (``cola_llama/job_config.py``); parallelize and the trainer check them again.
"""

from __future__ import annotations

import os
import sys


def problems(argv: list[str], world_size: int, nodes: int = 1, node_rank: str = "0",
             rdzv_endpoint: str = "") -> list[str]:
    """The config's problems (the family's rules, :func:`~torchtitan_ext.cola_llama.job_config.job_problems`),
    then the claim on the checkpoint folder (empty: fine). ``world_size`` counts the ranks of all
    ``nodes`` (NGPU ranks each)."""
    import torch
    from torchtitan.config import ConfigManager

    import torchtitan_ext  # noqa: F401  (registers the family and the [boost] section)
    from torchtitan_ext.cola_llama.job_config import job_problems

    job = ConfigManager().parse_args(argv)
    if job.model.name != "cola_llama":
        return []  # another family: torchtitan's own checks apply
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the ranks' device (run_train.sh)
    out = job_problems(job, world_size, device, nodes, node_rank, rdzv_endpoint)
    launcher = os.environ.get("BOOST_LAUNCHER_PID")  # run_train.sh's pid, which becomes torchrun's
    if not out and job.checkpoint.enable and launcher and node_rank == "0":  # one claim per run: node 0's
        from torchtitan_ext.runtime.faults import claim_checkpoint_folder

        held = claim_checkpoint_folder(os.path.join(job.job.dump_folder, job.checkpoint.folder), int(launcher))
        out += [held] if held else []
    return out


def main() -> int:
    from torchtitan.tools.logging import init_logger

    init_logger()
    nodes = int(os.environ.get("NNODES") or 1)
    world_size = int(os.environ.get("NGPU", "1")) * nodes
    try:
        found = problems(sys.argv[1:], world_size, nodes, os.environ.get("NODE_RANK", "0"),
                         os.environ.get("RDZV_ENDPOINT", ""))
    except (ValueError, FileNotFoundError, SystemExit) as e:  # a config that does not even parse
        found = [str(e) or "the command line could not be parsed (see above)"]
    for problem in found:
        print(f"config error: {problem}", file=sys.stderr)
    return 2 if found else 0


if __name__ == "__main__":
    sys.exit(main())
