"""Mixed precision in every layout: the family's ``parallelize_fn`` on gloo ranks, as torchtitan calls it.

torchtitan 0.2.2 disables mixed precision for TP or PP without FSDP; ``parallelize_cola`` gives those
layouts FSDP2's MixedPrecisionPolicy on the 1-rank shard mesh. Observed here directly: the dtype the
projections compute in, the dtype of the master weights and of their gradients, and that the bf16
forward really differs from the fp32 one (the end-to-end loss curves are in test_torchtitan_e2e).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from conftest import TINY, run_distributed

CONFIG = "train_configs/debug_cpu.toml"


def _job_config(*overrides: str):
    from torchtitan.config import ConfigManager

    import torchtitan_ext  # noqa: F401  (registers the family and, on CPU, the shim)

    return ConfigManager().parse_args(["--job.config_file", CONFIG, *overrides])


def _forward_dtypes(rank, world_size, layout: dict, precision: str, out, *overrides: str):
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed import ParallelDims

    from boost_titan.models import Transformer
    from torchtitan_ext.cola_llama.parallelize import parallelize_cola

    job = _job_config("--training.mixed_precision_param", precision,
                      "--parallelism.tensor_parallel_degree", str(layout.get("tp", 1)),
                      "--parallelism.data_parallel_shard_degree", str(layout.get("dp_shard", 1)), *overrides)
    dims = ParallelDims(dp_replicate=1, dp_shard=layout.get("dp_shard", 1), cp=1, tp=layout.get("tp", 1), pp=1,
                        ep=1, etp=1, world_size=world_size)
    dims.build_mesh()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(TINY)
    parallelize_cola(model, dims, job)
    model.to_empty(device="cpu")
    model.init_weights()

    seen = {}
    qkv = model.layers["0"].attention.qkv

    def record(module, inputs, outputs):
        seen.setdefault("qkv_out", outputs[0].dtype)

    qkv.register_forward_hook(record)
    tokens = torch.randint(0, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        logits = model(tokens)
        with loss_parallel() if isinstance(logits, DTensor) else torch.enable_grad():
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
            loss.backward()
    # FSDP2 names each unit's all-gather (and its copy-out, not counted) in profiler annotations
    all_gathers = sum(e.name.startswith("FSDP::all_gather") and "copy" not in e.name for e in prof.events())
    batched_grads = sum(e.name == "boost::one_rank_grads" for e in prof.events())  # one_rank_fsdp's gradient cast
    params = list(model.parameters())
    grads = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in params]  # a collective: all ranks
    if rank == 0:
        out.update(qkv_out=str(seen["qkv_out"]), logits=str(logits.dtype), loss=loss.item(),
                   param_dtypes=sorted({str(p.dtype) for p in params}),
                   grad_dtypes=sorted({str(p.grad.dtype) for p in params}),
                   fsdp_groups=sum(isinstance(m, FSDPModule) for m in model.modules()),
                   all_gathers=all_gathers, batched_grads=batched_grads, grads=grads)


def _run(rank, world_size, layout, path):
    results = {}
    for precision in ("float32", "bfloat16"):
        results[precision] = {}
        _forward_dtypes(rank, world_size, layout, precision, results[precision])
    if rank == 0:
        torch.save(results, path)


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "dp_shard": 2}], ids=["tp2", "fsdp2_tp2"])
def test_projections_compute_in_bf16_with_fp32_master_weights(layout, tmp_path):
    world = layout.get("tp", 1) * layout.get("dp_shard", 1)
    run_distributed(_run, world, layout, str(tmp_path / "r.pt"))
    res = torch.load(tmp_path / "r.pt")
    fp32, bf16 = res["float32"], res["bfloat16"]
    assert fp32["qkv_out"] == "torch.float32" and fp32["logits"] == "torch.float32"
    assert bf16["qkv_out"] == "torch.bfloat16" and bf16["logits"] == "torch.bfloat16"
    for r in (fp32, bf16):  # master weights and their gradients stay fp32 in both
        assert r["param_dtypes"] == ["torch.float32"] and r["grad_dtypes"] == ["torch.float32"], r
    # same weights, same tokens: bf16 rounding moves the loss, but only by bf16's resolution
    rel = abs(bf16["loss"] - fp32["loss"]) / fp32["loss"]
    assert 1e-6 < rel < 2e-2, (fp32["loss"], bf16["loss"])


def _groups(rank, world_size, path):
    results = {}
    for groups in (1, 2):
        results[groups] = {}
        _forward_dtypes(rank, world_size, {"tp": 2}, "bfloat16", results[groups], "--boost.one_rank_fsdp_groups",
                        str(groups))
    try:
        _forward_dtypes(rank, world_size, {"tp": 2}, "bfloat16", {}, "--boost.one_rank_fsdp_groups", "3")
    except ValueError as e:
        results["error"] = str(e)
    # both ranks past the failing build before either leaves: a rank that exits while the other is still
    # connecting one of that build's gloo groups resets the connection (seen once on torch 2.14.1)
    torch.distributed.barrier()
    if rank == 0:
        torch.save(results, path)


def test_one_rank_wrapper_groups_change_the_wrapping_not_the_numbers(tmp_path):
    """tp 2 without data parallelism: the 1-rank mixed-precision wrapper as one group (the default) or one
    group per block (TINY has 2) gives the same bf16 loss and fp32 gradients; more groups than blocks fail."""
    run_distributed(_groups, 2, str(tmp_path / "r.pt"))
    res = torch.load(tmp_path / "r.pt")
    one, two = res[1], res[2]
    assert (one["fsdp_groups"], two["fsdp_groups"]) == (1, 3)  # the root / the root and two block groups
    assert one["qkv_out"] == two["qkv_out"] == "torch.bfloat16" and one["grad_dtypes"] == ["torch.float32"]
    assert one["loss"] == two["loss"]
    for a, b in zip(one["grads"], two["grads"]):
        assert torch.equal(a, b)
    assert "[boost] one_rank_fsdp_groups=3 must be between 1 and the 2 blocks" in res["error"]


def _units(rank, world_size, path):
    results = {}
    for per_unit in (1, 2):
        results[per_unit] = {}
        _forward_dtypes(rank, world_size, {"tp": 2, "dp_shard": 2}, "bfloat16", results[per_unit],
                        "--boost.fsdp_blocks_per_unit", str(per_unit))
    try:
        _forward_dtypes(rank, world_size, {"tp": 2, "dp_shard": 2}, "bfloat16", {}, "--boost.fsdp_blocks_per_unit", "0")
    except ValueError as e:
        results["error"] = str(e)
    torch.distributed.barrier()  # as in _groups: no rank leaves while another still builds
    if rank == 0:
        torch.save(results, path)


def test_fsdp_units_of_several_blocks_change_the_wrapping_not_the_numbers(tmp_path):
    """tp 2 × FSDP 2: ``[boost] fsdp_blocks_per_unit = 2`` (TINY has two blocks: the whole model in one
    unit, the root's) gives the per-block wrapping's bf16 loss and fp32 gradients exactly; 0 fails.
    The one unit is all-gathered once per step: the root is not resharded after forward, since backward
    starts with it (a second all-gather of the whole stage would follow at once)."""
    run_distributed(_units, 4, str(tmp_path / "r.pt"))
    res = torch.load(tmp_path / "r.pt")
    per_block, grouped = res[1], res[2]
    assert (per_block["fsdp_groups"], grouped["fsdp_groups"]) == (6, 1)  # emb, 2 blocks, norm, head, root / root
    assert grouped["all_gathers"] == 1, grouped["all_gathers"]
    # per block: the embedding, both blocks and norm+head in forward; backward gathers again the units
    # that were resharded (the blocks and the embedding; norm+head is kept, as torchtitan does)
    assert per_block["all_gathers"] == 4 + 3, per_block["all_gathers"]
    assert per_block["loss"] == grouped["loss"]
    for a, b in zip(per_block["grads"], grouped["grads"]):
        assert torch.equal(a, b)
    assert "[boost] fsdp_blocks_per_unit=0 must be at least 1" in res["error"]


def _batched_cast(rank, world_size, path):
    import torchtitan_ext.cola_llama.parallelize as parallelize

    results = {}
    for batched in (False, True):
        results[batched] = {}
        if not batched:  # the reference: FSDP2's own cast, 1-rank reduction and copy-in (fsdp::chunk_cat)
            real = parallelize.batch_one_rank_fsdp, parallelize._use_foreach_copy_in
            parallelize.batch_one_rank_fsdp, parallelize._use_foreach_copy_in = (lambda model: 0), (lambda: None)
        try:
            _forward_dtypes(rank, world_size, {"tp": 2}, "bfloat16", results[batched])
        finally:
            if not batched:
                parallelize.batch_one_rank_fsdp, parallelize._use_foreach_copy_in = real
    if rank == 0:
        torch.save(results, path)


def test_one_rank_wrapper_batched_cast_gives_fsdps_numbers(tmp_path):
    """tp 2, no data parallelism: the 1-rank wrapper's one-foreach weight and gradient casts
    (one_rank_fsdp, with torchtitan's divide factor 1.0) and FSDP2's per-parameter cast and 1-rank
    reduction give bit-equal bf16 losses and fp32 tp-sharded gradients."""
    run_distributed(_batched_cast, 2, str(tmp_path / "r.pt"))
    res = torch.load(tmp_path / "r.pt")
    stock, batched = res[False], res[True]
    assert batched["qkv_out"] == "torch.bfloat16" and batched["grad_dtypes"] == ["torch.float32"]
    assert (stock["batched_grads"], batched["batched_grads"]) == (0, 1)  # one group: one batched cast
    assert stock["loss"] == batched["loss"]
    for a, b in zip(stock["grads"], batched["grads"], strict=True):
        assert torch.equal(a, b)


def _plain_fsdp_steps(rank, world_size, path, device="cpu"):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from boost_titan.parallel.one_rank_fsdp import batch_one_rank_fsdp

    from conftest import DispatchedOps as Ops

    out = {}
    # (batched, FSDP's gradient divide factor): 1.0 is torchtitan's; 4.0 must keep FSDP's own reduction
    for arm in ((False, 1.0), (True, 1.0), (False, 4.0), (True, 4.0)):
        batched, factor = arm
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(16, 16, bias=False) for _ in range(5)]).to(device)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                      cast_forward_inputs=False)
        fully_shard(model, mesh=init_device_mesh(device, (1,)), mp_policy=policy, reshard_after_forward=False)
        model.set_gradient_divide_factor(factor)
        groups = batch_one_rank_fsdp(model) if batched else 0
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(3):  # the cast after each optimizer step must see the new fp32 weights
            forward_ops, backward_ops = Ops(), Ops()
            for micro in range(2):  # the second backward adds to the gradients of the first
                x = torch.randn(4, 16, generator=torch.Generator().manual_seed(10 * step + micro)).bfloat16().to(device)
                with forward_ops:
                    y = model(x)
                loss = y.float().pow(2).sum()
                with backward_ops:
                    loss.backward()
                losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        out[arm] = {"groups": groups, "losses": losses, "forward_ops": forward_ops.names,
                    "backward_ops": backward_ops.names,
                    "params": [p.detach().full_tensor().cpu() for p in model.parameters()]}
    torch.save(out, path)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the CUDA kernels of the foreach casts need a GPU"), pytest.mark.gpu])])
def test_batched_casts_are_one_foreach_each_and_exact(device, tmp_path):
    """FSDP2 on a 1-rank mesh (plain module, 2 microbatches per step): the batched unshard issues one
    ``_foreach_copy_`` where FSDP2 casts and copies each of the 5 weights; the batched gradient cast
    one ``_foreach_copy_`` (first microbatch) and one ``_foreach_add_`` (second) where FSDP2 packs
    (``fsdp::chunk_cat``) and copies; 3 SGD steps end bit-equal. With a divide factor other than 1 the
    gradients keep FSDP's reduction (and its numbers)."""
    run_distributed(_plain_fsdp_steps, 1, str(tmp_path / "r.pt"), device, cuda=device == "cuda")
    res = torch.load(tmp_path / "r.pt")
    for factor in (1.0, 4.0):
        stock, batched = res[(False, factor)], res[(True, factor)]
        assert batched["groups"] == 1
        assert stock["forward_ops"].count("copy_") == 10 and "_foreach_copy_" not in stock["forward_ops"]
        assert batched["forward_ops"].count("_foreach_copy_") == 2 and "copy_" not in batched["forward_ops"]
        assert stock["backward_ops"].count("chunk_cat") == 2 and "_foreach_copy_" not in stock["backward_ops"]
        assert stock["losses"] == batched["losses"]
        for a, b in zip(stock["params"], batched["params"], strict=True):
            assert torch.equal(a, b)
    one, four = res[(True, 1.0)]["backward_ops"], res[(True, 4.0)]["backward_ops"]
    assert "chunk_cat" not in one and one.count("_foreach_copy_") == 1 and one.count("_foreach_add_") == 1
    assert four.count("chunk_cat") == 2 and "_foreach_copy_" not in four  # FSDP's own path
    assert res[(True, 1.0)]["params"][0].ne(res[(True, 4.0)]["params"][0]).any()  # the factor mattered
