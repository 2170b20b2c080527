"""torchtitan ``parallelize_fn`` for the cola_llama family: TP → activation checkpointing → compile → FSDP2.

Same order and knobs as torchtitan's llama3; the TP plan comes from ``[boost] tp_strategy``.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list, apply_ddp
from torchtitan.tools.logging import logger

from boost_titan.ops.attention import check_backend, save_for_backward_ops
from boost_titan.ops.cross_entropy import implementation_name
from boost_titan.ops.float8 import check_float8
from boost_titan.parallel import apply_tp, stream_shape
from boost_titan.parallel.activation_checkpoint import apply_lowrank_checkpoint
from boost_titan.parallel.compile import compile_blocks, compile_on_local_shards
from boost_titan.parallel.fsdp_copy_in import foreach_copy_in
from boost_titan.parallel.one_rank_fsdp import batch_one_rank_fsdp
from torchtitan_ext import patches
from torchtitan_ext.cola_llama.job_config import fail_on, layout_problems
from torchtitan_ext.log_filter import TORCHTITAN_AMP_OFF, drop


def parallelize_cola(model: nn.Module, parallel_dims, job_config) -> nn.Module:
    boost, args = job_config.boost, model.model_args
    tp = parallel_dims.tp if parallel_dims.tp_enabled else 1
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    fail_on(layout_problems(job_config, args, device))
    logger.info(f"Attention: {check_backend(boost.attention, device)}")
    logger.info(f"Projection GEMMs: {check_float8(boost.float8, args.gemm_dims(), tp, device)}")
    if boost.fused_cross_entropy:  # the model args defer the lm_head (update_from_config); build_loss applies it
        logger.info(f"lm_head + loss: {implementation_name(device.type)} (no logits materialised)")

    if parallel_dims.tp_enabled:
        apply_tp(model, parallel_dims.get_mesh("tp"), boost.tp_strategy, args, rmsnorm=boost.rmsnorm,
                 loss_parallel=not job_config.parallelism.disable_loss_parallel)
        logger.info(f"Applied tensor parallelism: tp_strategy={boost.tp_strategy} tp={tp} rmsnorm={boost.rmsnorm}")

    compile_model = job_config.compile.enable and "model" in job_config.compile.components
    ac_mode = job_config.activation_checkpoint.mode
    if boost.lowrank_checkpoint:
        apply_lowrank_checkpoint(model, args, tensor_parallel=parallel_dims.tp_enabled)
        logger.info("Applied low-rank activation checkpointing (saves the bottleneck all-reduce outputs)")
    elif ac_mode != "none":
        apply_ac(model, job_config.activation_checkpoint, model_compile_enabled=compile_model,
                 op_sac_save_list=_op_sac_save_list | save_for_backward_ops(), base_folder=job_config.job.dump_folder)

    if compile_model and parallel_dims.tp_enabled and (boost.lowrank_checkpoint or ac_mode != "none"):
        # torch.compile(block) of a checkpointed block with tp DTensor parameters fails in AOTAutograd
        # on torch 2.13 (CPU: the RNG state of the recomputed SDPA is saved after the DTensors'
        # DeviceMesh and the runtime then takes the mesh for a tensor); the compiled region is given
        # the local shards instead (same math, see LocalShardCompiled).
        compile_on_local_shards(model, backend=job_config.compile.backend, cudagraphs=boost.cudagraphs)
        logger.info("Compiling each TransformerBlock with torch.compile (on the local shards of its tp parameters)"
                    + _CUDAGRAPHS_NOTE * boost.cudagraphs)
    elif compile_model:
        compile_blocks(model, backend=job_config.compile.backend, cudagraphs=boost.cudagraphs)
        logger.info("Compiling each TransformerBlock with torch.compile" + _CUDAGRAPHS_NOTE * boost.cudagraphs)

    fsdp = dict(param_dtype=TORCH_DTYPE_MAP[job_config.training.mixed_precision_param],
                reduce_dtype=TORCH_DTYPE_MAP[job_config.training.mixed_precision_reduce],
                pp_enabled=parallel_dims.pp_enabled, cpu_offload=job_config.training.enable_cpu_offload,
                reshard_after_forward_policy=job_config.parallelism.fsdp_reshard_after_forward)
    if parallel_dims.fsdp_enabled:
        names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
        per_unit = boost.fsdp_blocks_per_unit
        blocks = len(model.layers)
        units = None if per_unit == 1 else max(1, -(-blocks // per_unit))  # None: torchtitan's per-block wrapping
        apply_fsdp(model, parallel_dims.get_mesh(names), **fsdp, groups=units)
        logger.info("Applied FSDP2 to the model")
        _log_precision(job_config, "FSDP2's MixedPrecisionPolicy")
    elif (parallel_dims.tp_enabled or parallel_dims.pp_enabled) and fsdp["param_dtype"] != torch.float32:
        # torchtitan 0.2.2 runs TP/PP layouts without FSDP in fp32: its autocast path is for DDP and
        # single-device runs only (distributed/utils.py maybe_enable_amp). FSDP2 on the 1-rank shard
        # mesh that ParallelDims builds anyway gives them FSDP's own mixed precision: bf16 compute
        # copies of the fp32 master weights, fp32 gradients; FSDP2 issues no collective on a 1-rank
        # mesh. With dp_replicate > 1 the same wrapping is HSDP with shard size 1 (fp32 all-reduce).
        names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
        # Nothing is sharded, so resharding after forward would only cast every weight again for
        # backward: the bf16 copies are kept until backward is done. [boost] one_rank_fsdp_groups
        # (default 1, the whole model): FSDP's hooks around every block kept the host behind the GPU
        # at tp 4 (docs/design.md, "Host time"). The price of one group: the weight casts and the
        # gradient reduction do not overlap compute, and all bf16 gradients are held until backward ends.
        apply_fsdp(model, _dense_mesh(parallel_dims, names), **{**fsdp, "reshard_after_forward_policy": "never"},
                   groups=boost.one_rank_fsdp_groups)
        # FSDP2 casts each weight with its own two kernels on a 1-rank mesh, and packs, copies and views
        # out the gradients for a 1-rank reduction: one foreach copy each way instead
        batched = batch_one_rank_fsdp(model)
        logger.info(f"1-rank FSDP groups with the batched weight and gradient casts: {batched} of "
                    f"{sum(isinstance(m, FSDPModule) for m in model.modules())}")
        _log_precision(job_config, "FSDP2's MixedPrecisionPolicy on a 1-rank shard mesh, no data sharding")
        drop(TORCHTITAN_AMP_OFF)  # torchtitan's verdict, printed next, is about its own autocast path
    elif parallel_dims.dp_replicate_enabled:
        apply_ddp(model, parallel_dims.get_mesh("dp_replicate"), enable_compile=compile_model)
    return model


_CUDAGRAPHS_NOTE = ", replayed as CUDA graphs (cudagraph trees)"


def _dense_mesh(parallel_dims, names: list[str]):
    """``parallel_dims.get_mesh(names)`` also where a dim has size 1 (``get_mesh`` refuses those).

    torchtitan 0.2.2 builds every dim of its dense ``(pp, dp_replicate, fsdp, tp)`` mesh, size-1 ones
    included (on a fake 1-rank backend); ``_global_meshes`` is where it keeps that mesh.
    """
    parallel_dims.get_optional_mesh("tp")  # builds the meshes if nobody has yet
    return parallel_dims._global_meshes["dense"][tuple(names)] if len(names) > 1 else parallel_dims._meshes[names[0]]


def _log_precision(job_config, mechanism: str) -> None:
    t = job_config.training
    logger.info(f"Mixed precision: compute in {t.mixed_precision_param}, fp32 master weights, gradients reduced "
                f"in {t.mixed_precision_reduce} (by {mechanism})")


def apply_fsdp(model, dp_mesh, param_dtype, reduce_dtype, pp_enabled, cpu_offload=False,
               reshard_after_forward_policy="default", groups: int | None = None) -> None:
    """torchtitan's FSDP2 wrapping (embedding, each block, norm+head, root), tied-embedding aware;
    ``groups=N`` instead (for a mesh that shards nothing): N groups of consecutive blocks, the rest in
    the root's group; N = 1: the root's group holds every parameter.

    A tied embedding/lm_head is one parameter, so it must live in one FSDP group: the root's; so does
    the lm_head of a model that defers it to the loss (``defer_lm_head``).
    """
    # cast_forward_inputs off: a block's floating inputs are the stream, already in param_dtype (the
    # embedding's weights are), and the fp32 RoPE table, which FSDP would round to bf16 for per-block
    # groups only (so the model's numerics would depend on the wrapping; autocast keeps it fp32 too)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False)
    config = {"mesh": dp_mesh, "mp_policy": policy}
    if cpu_offload:
        config["offload_policy"] = CPUOffloadPolicy()
    reshard = {"always": True, "never": False, "default": not pp_enabled}.get(reshard_after_forward_policy)
    if reshard is None:
        raise ValueError(f"parallelism.fsdp_reshard_after_forward={reshard_after_forward_policy!r} is invalid")
    if groups is None:
        _wrap_per_block(model, config, reshard, reshard_after_forward_policy == "always")
    else:
        blocks = list(model.layers.values())
        if groups > max(1, len(blocks)):  # a pipeline stage shorter than n_layers // pp
            raise ValueError(f"groups={groups}: this model part has only {len(blocks)} blocks")
        if groups > 1:
            bounds = [round(i * len(blocks) / groups) for i in range(groups + 1)]
            for start, end in zip(bounds, bounds[1:]):
                fully_shard(blocks[start:end], **config, reshard_after_forward=reshard)
        _shard_root(model, config)
    gloo = dp_mesh.device_type == "cpu"
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # the trainer divides by the global token count
            if gloo:
                module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    _use_foreach_copy_in()


def _use_foreach_copy_in() -> None:
    """FSDP2's reduce-scatter copy-in as one foreach copy (``boost_titan/parallel/fsdp_copy_in.py``), once
    per process: for every FSDP2 module in it, ours included (the dense twin's and vanilla's the same)."""
    owner, name = patches.PATCHES["fsdp_foreach_copy_in"].owner_and_name()
    fsdp_own = getattr(owner, name)
    if getattr(fsdp_own, "func", None) is not foreach_copy_in:
        patches.apply("fsdp_foreach_copy_in", functools.partial(foreach_copy_in, fallback=fsdp_own))
        logger.info("FSDP2's reduce-scatter copy-in: one foreach copy (instead of fsdp::chunk_cat)")


def _wrap_per_block(model, config: dict, reshard: bool, reshard_head: bool) -> None:
    tied = model.model_args.tie_embeddings
    if model.tok_embeddings is not None and not tied:
        fully_shard(model.tok_embeddings, **config, reshard_after_forward=reshard)
    for block in model.layers.values():
        fully_shard(block, **config, reshard_after_forward=reshard)
    # A deferred lm_head (fused cross-entropy) has its weight read in forward and used by the loss after
    # it: the root group keeps its parameters unsharded from forward to backward and reduces their
    # gradients at the end of backward, so the head stays in it.
    if model.norm is not None and model.output is not None and not tied and not model.defer_lm_head:
        fully_shard([model.norm, model.output], **config, reshard_after_forward=reshard_head)
    _shard_root(model, config)


def _shard_root(model, config: dict) -> None:
    """The root's group is not resharded after forward, whatever the policy: backward starts with it
    (the head, and with one unit every block), so resharding would only all-gather it again at once.
    FSDP2 does so by itself when ``reshard_after_forward`` is left unset; it is explicit here because an
    explicit value turns that off, and the one-unit layout used to pass one: a second all-gather of
    the whole stage per step (its host work and, on a real mesh, its traffic)."""
    fully_shard(model, **config, reshard_after_forward=False)


def stage_input(job_config, dim: int) -> torch.Tensor:
    """The meta tensor a later pipeline stage of a cola_llama model receives: the residual stream of
    one microbatch, ``[microbatch, seq, dim]`` in the compute dtype, sharded as the tp strategy's
    stream is (btp: ``Shard(-1)``, d; fullrank: ``Shard(1)``, the sequence; vanilla: replicated)."""
    par, training = job_config.parallelism, job_config.training
    shape = stream_shape(job_config.boost.tp_strategy, par.pipeline_parallel_microbatch_size, training.seq_len, dim,
                         par.tensor_parallel_degree)
    return torch.empty(shape, dtype=TORCH_DTYPE_MAP[training.mixed_precision_param], device="meta")
