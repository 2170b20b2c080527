"""Check a cola_llama training config before any rank starts: one line per problem, exit status 2.

    python -m torchtitan_ext.preflight --job.config_file train_configs/debug_cpu.toml [--section.key value ...]

``scripts/run_train.sh`` runs it first (with ``NGPU``), so that a bad flavor, strategy, parallel layout,
tokenizer, dataset or file fails in a few seconds with one readable line instead of a traceback per
rank after start-up. Everything checked here is checked again where it is used (the same functions).
"""

from __future__ import annotations

import os
import re
import sys


def problems(argv: list[str], world_size: int, nodes: int = 1, node_rank: str = "0",
             rdzv_endpoint: str = "") -> list[str]:
    """The config's problems, in the order a run would hit them (empty: fine). ``world_size`` counts
    the ranks of all ``nodes`` (NGPU ranks each)."""
    from torchtitan.config import ConfigManager

    import torchtitan_ext  # noqa: F401  (registers the family and the [boost] section)
    from boost_titan.data.datasets import DATASETS, VALIDATION_SPLITS, check_text_dataset
    from boost_titan.models import FLAVORS
    from boost_titan.parallel import check_tp
    from torchtitan_ext.train_spec import size_vocabulary

    job = ConfigManager().parse_args(argv)
    if job.model.name != "cola_llama":
        return []  # another family: torchtitan's own checks apply
    out = []
    try:
        args = FLAVORS[job.model.flavor]
    except ValueError as e:
        return [str(e).strip("'\"")]
    par, training = job.parallelism, job.training
    tp, pp, cp, rep = (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
                       par.data_parallel_replicate_degree)
    shard = par.data_parallel_shard_degree
    out += node_problems(nodes, node_rank, rdzv_endpoint, world_size, tp)
    ranks = "NGPU" if nodes == 1 else f"NGPU·NNODES = {world_size // nodes}·{nodes}"
    if shard == -1 and world_size % (tp * pp * cp * rep):
        out.append(f"{ranks}={world_size} is not divisible by tp·pp·cp·dp_replicate = {tp * pp * cp * rep}")
    elif shard != -1 and shard * tp * pp * cp * rep != world_size:
        out.append(f"{ranks}={world_size} != dp_shard·tp·pp·cp·dp_replicate = {shard * tp * pp * cp * rep}")
    try:
        check_tp(job.boost.tp_strategy, args, tp)
    except ValueError as e:
        out.append(str(e))
    if training.seq_len % (tp * 2 * cp) and tp > 1:
        out.append(f"training.seq_len={training.seq_len} must be divisible by {tp * 2 * cp} (tp · 2 · cp)")
    import torch

    from torchtitan_ext.parallelize import cudagraphs_problem, kernel_problems
    from torchtitan_ext.step_graph import step_cudagraph_problem

    out += kernel_problems(job.boost, args, tp, pp)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the ranks' device (run_train.sh)
    out += [p for p in [cudagraphs_problem(job.boost, job.compile, device),
                        step_cudagraph_problem(job, device, pp)] if p]
    ac = job.activation_checkpoint
    if job.boost.lowrank_checkpoint and ac.mode != "none":
        out.append(f"[boost] lowrank_checkpoint=true replaces activation_checkpoint.mode="
                   f"{ac.mode!r}: set activation_checkpoint.mode = 'none'")
    if ac.mode == "memory_budget" and not (job.compile.enable and "model" in job.compile.components):
        out.append("activation_checkpoint.mode='memory_budget' chooses what to recompute inside compiled graphs: "
                   "it needs --compile.enable (with 'model' in compile.components)")
    if ac.mode == "memory_budget" and not 0.0 <= ac.memory_budget <= 1.0:
        out.append(f"activation_checkpoint.memory_budget={ac.memory_budget} must be in [0, 1] (a fraction of the "
                   "activation memory that saving everything needs)")
    for what, name, path in [("training.dataset", training.dataset, training.dataset_path),
                             *([("validation.dataset", job.validation.dataset, job.validation.dataset_path)]
                               if job.validation.enable else [])]:
        known = ["synthetic", *sorted(k for k in DATASETS if not k.endswith("_validation"))]
        if name.lower() not in known and name.lower() not in DATASETS:
            out.append(f"{what}={name!r} is unknown; choose one of {known}")
        elif (problem := check_text_dataset(VALIDATION_SPLITS.get(name.lower(), name.lower())
                                            if what.startswith("validation") else name.lower(), path)):
            out.append(problem)  # a missing, corrupt, truncated, non-UTF-8, non-JSON or empty file
    if not out:
        try:
            size_vocabulary(args.replace(), job)  # tokenizer ↔ vocabulary (a copy: FLAVORS stays as it is)
        except (ValueError, FileNotFoundError) as e:
            out.append(str(e))
    out += hf_checkpoint_problems(job, args)
    launcher = os.environ.get("BOOST_LAUNCHER_PID")  # run_train.sh's pid, which becomes torchrun's
    if not out and job.checkpoint.enable and launcher and node_rank == "0":  # one claim per run: node 0's
        from torchtitan_ext.faults import claim_checkpoint_folder

        held = claim_checkpoint_folder(os.path.join(job.job.dump_folder, job.checkpoint.folder), int(launcher))
        out += [held] if held else []
    return out


def node_problems(nodes: int, node_rank: str, rdzv_endpoint: str, world_size: int, tp: int) -> list[str]:
    """Several nodes: the rendezvous settings every node needs, and no tp group across two nodes."""
    if nodes < 1:
        return [f"NNODES={nodes} must be at least 1"]
    if nodes == 1:
        return []
    out = []
    per_node = world_size // nodes
    if not (node_rank.isdigit() and int(node_rank) < nodes):
        out.append(f"NNODES={nodes} needs NODE_RANK=0..{nodes - 1} on each node (got {node_rank!r})")
    if not re.fullmatch(r"[^:\s]+:\d+", rdzv_endpoint):
        out.append(f"NNODES={nodes} needs RDZV_ENDPOINT=host:port, node 0's address and a free port, the same on "
                   f"every node (got {rdzv_endpoint!r})")
    if per_node % tp:
        out.append(f"tensor_parallel_degree={tp} must divide the ranks per node NGPU={per_node}: a tp group "
                   "would span nodes, and every TP collective would cross the network")
    return out


def hf_checkpoint_problems(job, args) -> list[str]:
    """Hugging Face saves and loads: the model-only rule torchtitan asserts, and an import directory
    that exists and describes this flavor (names, per mismatching size, what differs)."""
    ckpt, out = job.checkpoint, []
    if ckpt.enable and ckpt.last_save_in_hf and not ckpt.last_save_model_only:
        out.append("checkpoint.last_save_in_hf=true saves weights only: add --checkpoint.last_save_model_only")
    resuming = os.path.isdir(os.path.join(job.job.dump_folder, ckpt.folder))
    if not (ckpt.enable and ckpt.initial_load_in_hf) or resuming:
        return out  # torchtitan resumes from the folder's own checkpoints and ignores the import
    if not ckpt.initial_load_model_only:
        out.append("checkpoint.initial_load_in_hf=true loads weights only: drop --checkpoint.no_initial_load_model_only")
    source = ckpt.initial_load_path or job.model.hf_assets_path
    config = os.path.join(source or "", "config.json")
    if not os.path.isfile(config):
        return out + [f"checkpoint.initial_load_in_hf=true: {source!r} (checkpoint.initial_load_path, else "
                      "model.hf_assets_path) has no config.json: not a Hugging Face model directory"]
    import json

    from boost_titan.hf import args_from_hf_config
    from torchtitan_ext.train_spec import size_vocabulary

    try:
        theirs = args_from_hf_config(json.load(open(config)))
    except (ValueError, KeyError) as e:
        return out + [f"{config}: {e}"]
    ours = args.replace()
    try:
        size_vocabulary(ours, job)
    except (ValueError, FileNotFoundError):
        pass  # reported above
    fields = ["dim", "n_layers", "n_heads", "kv_heads", "ffn_dim", "vocab_size", "attn_rank", "mlp_rank",
              "swiglu", "tie_embeddings"]
    diff = [f"{f} {getattr(theirs, f)} vs {getattr(ours, f)}" for f in fields if getattr(theirs, f) != getattr(ours, f)]
    if diff:
        out.append(f"{config} does not describe flavor {job.model.flavor!r} ({', '.join(diff)}; the directory's vs "
                   "the flavor's)")
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
