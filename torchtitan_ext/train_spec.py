"""The ``cola_llama`` TrainSpec: our model, plans and data; torchtitan's optimizers, loss and loop."""

from __future__ import annotations

import torch
from torchtitan.components.loss import build_cross_entropy_loss, cross_entropy_loss
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.components.optimizer import build_optimizers
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.protocols.train_spec import TrainSpec, get_train_spec, register_train_spec
from torchtitan.tools.logging import logger

from boost_titan.data import build_dataloader, build_tokenizer, build_validator
from boost_titan.models import FLAVORS, Transformer

from .parallelize import parallelize_cola

NAME = "cola_llama"


def pipeline_cola(model, parallel_dims, job_config, device, model_args, parallelize_fn, loss_fn):
    if model_args.tie_embeddings:
        raise ValueError("pipeline parallelism needs untied embeddings: the embedding and the lm_head sit on "
                         "different stages (set tie_embeddings=False, e.g. a flavor without tying)")
    return pipeline_llm(model, parallel_dims, job_config, device, model_args, parallelize_fn, loss_fn)


def build_loss(job_config, parallel_dims=None, **kwargs):
    """torchtitan's cross-entropy (sum), compiled as torchtitan does, except that under loss-parallel TP
    the compiled loss bypasses inductor's FX graph cache.

    loss_parallel bakes the rank's vocabulary offset into the traced graph, but the cache key does not
    include the rank: ranks sharing a cache directory load each other's graphs and compute a wrong loss
    and gradient, silently (TP2, CPU, torch 2.13: 6.55 instead of 6.27 at step 1; same class as
    pytorch#188332).
    """
    compile_cfg = job_config.compile
    loss_parallel = (parallel_dims is not None and parallel_dims.tp_enabled
                     and not job_config.parallelism.disable_loss_parallel)
    if not (compile_cfg.enable and "loss" in compile_cfg.components and loss_parallel
            and compile_cfg.backend == "inductor"):
        return build_cross_entropy_loss(job_config, parallel_dims=parallel_dims, **kwargs)
    logger.info("Compiling the loss function with torch.compile (loss-parallel: no FX graph cache)")
    return torch.compile(cross_entropy_loss, backend="inductor", options={"fx_graph_cache": False})


def train_spec() -> TrainSpec:
    return TrainSpec(
        model_cls=Transformer,
        model_args=FLAVORS,
        parallelize_fn=parallelize_cola,
        pipelining_fn=pipeline_cola,
        build_optimizers_fn=build_optimizers,
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=build_dataloader,
        build_tokenizer_fn=build_tokenizer,
        build_loss_fn=build_loss,
        build_validator_fn=build_validator,
    )


def register() -> None:
    """Idempotent: torchtitan raises if a name is registered twice."""
    try:
        get_train_spec(NAME)
    except ValueError:
        register_train_spec(NAME, train_spec())
