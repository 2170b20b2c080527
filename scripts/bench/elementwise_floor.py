"""The least HBM traffic a block's non-GEMM work needs, read from its compiled graphs (CPU, no GPU).

Every tensor that crosses between a GEMM or attention op and the rest of the block has to go through
memory at least once in that direction, whatever kernels do the elementwise work, unless it is fused
into the GEMM itself (an epilogue or prologue):

* made by elementwise code and read by a GEMM / attention, or saved for backward: written once;
* made by a GEMM / attention and read by elementwise code: read once;
* a block input (the residual stream, a saved activation, an incoming gradient) read by elementwise code:
  read once.

Everything else — elementwise producer and elementwise consumers only — could live in one fused
kernel and is free here. Views are followed to what they view. The forward and backward graphs are the
ones AOTAutograd hands Inductor (its min-cut partitioner decides what is saved); bytes scale with the
tokens, so a short sequence on the CPU gives the bytes per token, and ``× tokens / bandwidth`` the
milliseconds per step that the elementwise kernels cannot go below. Compare with the profiled
"fused elementwise" bucket (``e2e.py --profile``).

    python -m scripts.bench.elementwise_floor --flavors 1B,1B_fullrank --out docs/results/1b_elementwise_floor_predicted
"""

from __future__ import annotations

import argparse
import functools
import operator

import torch

from boost_titan.models import FLAVORS
from boost_titan.models.model import TransformerBlock, rope_cos_sin
from scripts.bench.results import env_info, print_table, write_results

aten = torch.ops.aten
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
         aten.transpose.int, aten.t.default, aten.expand.default, aten.slice.Tensor, aten.select.int,
         aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.alias.default,
         aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.as_strided.default,
         aten.detach.default, aten.unflatten.int, operator.getitem}


def _is_gemm(target) -> bool:
    name = str(target)
    return target in {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default} or \
        "scaled_dot_product" in name or "flash_attn" in name or "matmul_nt" in name


def _bytes(node) -> int:
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return sum(v.numel() * v.element_size() for v in vals if isinstance(v, torch.Tensor))


def boundary_bytes(graph: torch.fx.Graph) -> dict[str, int]:
    """Bytes the elementwise side must write (GEMM inputs, saved or returned tensors it makes) and read
    (GEMM outputs, graph inputs it consumes), each tensor counted once per direction; of the reads, those
    of GEMM / attention outputs (what fusing the elementwise consumers into GEMM epilogues could hide)."""

    def root(node):
        while node.op == "call_function" and node.target in VIEWS and node.target is not operator.getitem:
            node = node.args[0]
        return node

    def kind(node):  # of the op that made a (root) value
        if node.op == "placeholder":
            return "input"
        if node.target is operator.getitem:
            return kind(root(node.args[0]))
        return "gemm" if _is_gemm(node.target) else "elementwise"

    consumers: dict = {}  # root value -> set of consumer kinds ("gemm" | "elementwise" | "output")

    def use(value, by):
        if isinstance(value, torch.fx.Node):
            consumers.setdefault(root(value), set()).add(by)
        elif isinstance(value, (list, tuple)):
            for v in value:
                use(v, by)

    for node in graph.nodes:
        if node.op == "output":
            use(node.args, "output")
        elif node.op == "call_function" and node.target not in VIEWS:
            for arg in (*node.args, *node.kwargs.values()):
                use(arg, "gemm" if _is_gemm(node.target) else "elementwise")
    out = {"written": 0, "read": 0, "read_of_gemm_outputs": 0}
    for value, by in consumers.items():
        made_by, size = kind(value), _bytes(value)
        if made_by == "elementwise" and ({"gemm", "output"} & by):
            out["written"] += size
        elif made_by in ("gemm", "input") and "elementwise" in by:
            out["read"] += size
            out["read_of_gemm_outputs"] += size if made_by == "gemm" else 0
    return out


def block_graphs(flavor: str, seq: int) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The forward and backward graphs of one bf16 block of ``flavor`` (one sequence of ``seq`` tokens)
    as AOTAutograd partitions them for Inductor."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    args = FLAVORS[flavor].replace(max_seq_len=seq)
    torch.manual_seed(0)
    block = TransformerBlock(args).to(torch.bfloat16)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    graphs = {}

    def keep(phase):
        def compiler(gm, example_inputs):
            graphs[phase] = gm
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                           partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"))
    torch._dynamo.reset()
    x = torch.randn(1, seq, args.dim, dtype=torch.bfloat16, requires_grad=True)
    torch.compile(block, backend=backend)(x, rope_cos_sin(args.head_dim, seq, args.rope_theta)).sum().backward()
    return graphs["forward"], graphs["backward"]


def floor_rows(flavor: str, seq: int, tokens: int, bandwidth_tb_s: float) -> list[dict]:
    args = FLAVORS[flavor]
    rows = []
    fw, bw = block_graphs(flavor, seq)
    for phase, gm in (("forward", fw), ("backward", bw)):
        b = boundary_bytes(gm.graph)
        per_token = (b["written"] + b["read"]) / seq
        step_bytes = per_token * tokens * args.n_layers
        ms = 1e3 * tokens * args.n_layers / seq / (bandwidth_tb_s * 1e12)  # per byte traced
        rows.append({"flavor": flavor, "phase": phase, "written_b_per_token_layer": b["written"] / seq,
                     "read_b_per_token_layer": b["read"] / seq, "gb_per_step": step_bytes / 1e9,
                     "floor_ms_per_step": step_bytes / (bandwidth_tb_s * 1e12) * 1e3,
                     "of_which_gemm_output_reads_ms": b["read_of_gemm_outputs"] * ms})
    total = {"flavor": flavor, "phase": "total", **{k: sum(r[k] for r in rows) for k in
             ("gb_per_step", "floor_ms_per_step", "of_which_gemm_output_reads_ms")}}
    return rows + [total]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavors", default="1B,1B_fullrank")
    p.add_argument("--seq", type=int, default=256, help="tokens traced on the CPU (bytes scale with them)")
    p.add_argument("--tokens", type=int, default=4 * 4096, help="tokens per step to scale to (b 4 x 4096)")
    p.add_argument("--bandwidth", type=float, default=4.27,
                   help="TB/s the elementwise kernels could stream at (4.27: the H200 device-to-device copy rate "
                        "as the GPU box's notes give it; not measured by this project)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    rows = [r for f in a.flavors.split(",") for r in floor_rows(f, a.seq, a.tokens, a.bandwidth)]
    cols = ["flavor", "phase", "written_b_per_token_layer", "read_b_per_token_layer", "gb_per_step",
            "floor_ms_per_step", "of_which_gemm_output_reads_ms"]
    if a.out:
        import shlex
        import sys

        meta = {**env_info("cpu"), "command": shlex.join(["python", "-m", "scripts.bench.elementwise_floor",
                                                           *(sys.argv[1:] if argv is None else argv)])}
        notes = "\n\n".join(__doc__.split("\n\n")[1:4]) + (
            f"\n\nBandwidth {a.bandwidth} TB/s, {a.tokens} tokens per step, all layers; traced at {a.seq} tokens "
            "in bf16. The graphs come from AOTAutograd with Inductor's min-cut partitioning but without its "
            "decompositions (an op such as the fused RMSNorm stays one node; what crosses a GEMM boundary is "
            "the same) and with the CPU's attention op (same inputs and outputs as the GPU kernels).")
        write_results(a.out, rows, meta, "Least HBM traffic of the blocks' non-GEMM work (from the compiled graphs)",
                      columns=cols, notes=notes)
    print_table(rows, cols)


if __name__ == "__main__":
    main()
