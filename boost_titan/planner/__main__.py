"""``python -m boost_titan.planner``: the layouts of a flavor on one node or several, best first (PREDICTED).

How each number is predicted: ``python -m boost_titan.planner --help`` (:mod:`boost_titan.planner.predict`).
``python -m scripts.bench.plan ... --out <file>`` writes the same table to ``docs/results/``.
"""

from __future__ import annotations

import argparse

from boost_titan.planner import predict
from boost_titan.planner.comm_model import GPUS
from boost_titan.planner.table import format_table

COLUMNS = ["strategy", "tp", "pp", "dp", "rep", "units", "ac", "step_graph", "batch", "accum",
           "mem_gib", "step_s", "tokens_per_s_gpu",
           "tokens_per_s_gpu_tp_not_hidden", "tp_comm_s", "host_s", "bound", "crosses", "rate"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m boost_titan.planner", description=predict.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="7B")
    p.add_argument("--gpu", default="h200", choices=sorted(GPUS),
                   help="the machine: h200 (8 per node, NVLink 4, 400 Gb/s NIC per GPU; the rates were measured "
                        "on it) or a100 (BOOST's: 4 per node, NVLink 3, 200 Gb/s NIC per GPU, rates scaled by peak)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs per node (default: the machine's; --gpus-per-node "
                                                          "is the same option)")
    p.add_argument("--gpus-per-node", type=int, dest="gpus")
    p.add_argument("--nodes", type=int, default=1, help="nodes, joined by the machine's network (comm_model.GPUS)")
    p.add_argument("--gpu-mem", type=float, default=None, help="GiB per GPU (default: the machine's usable memory, "
                                                               "H200 139, A100 79)")
    p.add_argument("--batch", type=int, default=4, help="local batch: sequences per data-parallel rank")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per step over all ranks (strong scaling): each layout's local batch is "
                        "global / dp, instead of --batch")
    p.add_argument("--microbatch", type=int, default=1,
                   help="pipeline layouts: sequences per microbatch (BOOST: 4); must divide --batch")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--step-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="layouts without pipeline stages run [boost] step_cudagraph (the step replayed as one "
                        "CUDA graph: a fixed host time per step instead of one per block) / never do; "
                        "default: each is ranked both ways")
    return p


def run(p: argparse.ArgumentParser, a: argparse.Namespace) -> tuple[list[dict], str]:
    """Every layout's prediction (rounded) and the table's title; prints the fitting ones and the command
    of the first."""
    a.gpus = GPUS[a.gpu]["gpus_per_node"] if a.gpus is None else a.gpus
    a.gpu_mem = GPUS[a.gpu]["mem_gib"] if a.gpu_mem is None else a.gpu_mem
    if a.microbatch < 1 or (a.global_batch is None and a.batch % a.microbatch):
        p.error(f"--microbatch {a.microbatch} must be a positive divisor of --batch {a.batch}")
    if a.nodes < 1 or a.gpus < 1:
        p.error(f"--nodes {a.nodes} and --gpus {a.gpus} must be positive")
    if a.flavor not in predict.FLAVORS:
        p.error(f"--flavor {a.flavor!r} is unknown; choose one of {', '.join(predict.FLAVORS)}")
    rows = predict.plan(a.flavor, a.gpus, a.gpu_mem, a.batch, a.seq, a.microbatch, a.nodes, a.global_batch,
                        step_graph=a.step_graph, gpu=a.gpu)
    fitting = [r for r in rows if r["fits"]]
    pipe = f", pipeline microbatch {a.microbatch}" if a.microbatch > 1 else ""
    where = f"{a.gpus} GPUs" if a.nodes == 1 else f"{a.nodes} nodes x {a.gpus} GPUs"
    batch = f"local batch {a.batch}" if a.global_batch is None else f"global batch {a.global_batch}"
    graph = {True: ", step graph where pp = 1", False: ", no step graph", None: ""}[a.step_graph]
    title = f"{a.flavor} on {where} ({a.gpu.upper()}, {a.gpu_mem:g} GiB), {batch} x {a.seq}{pipe}{graph}"
    print(f"{title}: {len(fitting)} of {len(rows)} layouts fit; PREDICTED (see python -m boost_titan.planner --help)")
    rounded = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    print(format_table([r for r in rounded if r["fits"]][:a.top], COLUMNS), end="")
    if fitting:
        units = fitting[0]["units"] if fitting[0]["units"] != "-" else "block"
        best = predict.Layout(*(fitting[0][k] for k in ("strategy", "tp", "pp", "dp", "ac", "rep")), units,
                              fitting[0]["step_graph"])
        command = predict.train_command(a.flavor, best, fitting[0]["batch"], a.seq, a.microbatch, a.nodes,
                                        fitting[0]["accum"])
        print(f"run the first one (add a config file and the job's other settings):\n  {command}")
        if a.nodes > 1:
            print("  or: sbatch --nodes", a.nodes, "--gpus-per-task", a.gpus, "scripts/multinode_trainer.slurm <the flags>")
    return rounded, title


def main(argv=None) -> None:
    p = parser()
    run(p, p.parse_args(argv))


if __name__ == "__main__":
    main()
