"""The ``cola_llama`` TrainSpec: our model, plans and data; torchtitan's optimizers, loss and loop."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import torch
from torchtitan.components.loss import build_cross_entropy_loss, cross_entropy_loss
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.components.optimizer import build_optimizers
from torchtitan.distributed import utils as dist_utils
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.protocols.model import BaseModelArgs
from torchtitan.protocols.train_spec import TrainSpec, get_train_spec, register_train_spec
from torchtitan.tools.logging import logger

from boost_titan.models import FLAVORS, Transformer, TransformerArgs, count_params, flops_per_token
from boost_titan.models.flavors import Flavors
from boost_titan.models.model import HeadInput
from boost_titan.ops.cross_entropy import linear_cross_entropy_sum
from boost_titan.parallel import local_shards
from boost_titan.parallel.pipeline import TiedPipelineEmbeddings
from torchtitan_ext import patches
from torchtitan_ext.cola_llama.data import build_dataloader, build_tokenizer, build_validator
from torchtitan_ext.cola_llama.data.datasets import DataError
from torchtitan_ext.cola_llama.hand_offs import HandOffs
from torchtitan_ext.cola_llama.job_config import size_vocabulary
from torchtitan_ext.cola_llama.parallelize import parallelize_cola
from torchtitan_ext.cola_llama.state_dict_adapter import ColaStateDictAdapter

NAME = "cola_llama"


@dataclasses.dataclass
class JobModelArgs(TransformerArgs, BaseModelArgs):
    """The flavors as torchtitan's trainer uses them (its ``BaseModelArgs`` protocol)."""

    def update_from_config(self, job_config, **kwargs) -> None:
        """The job's choices that change the model: sequence length, grouping, attention kernel, float8,
        the lm_head deferred to a fused loss, the vocabulary sized from the tokenizer."""
        self.max_seq_len = job_config.training.seq_len
        boost = job_config.boost
        self.grouped, self.attention, self.float8 = boost.grouped, boost.attention, boost.float8
        self.defer_lm_head = boost.fused_cross_entropy
        size_vocabulary(self, job_config)

    def get_nparams_and_flops(self, model, seq_len: int) -> tuple[int, int]:
        return count_params(self), flops_per_token(self, seq_len)


JOB_FLAVORS = Flavors({name: JobModelArgs(**dataclasses.asdict(args)) for name, args in FLAVORS.items()})


def pipeline_cola(model, parallel_dims, job_config, device, model_args, parallelize_fn, loss_fn, *,
                  hand_offs: HandOffs):
    """torchtitan's ``pipeline_llm``; a tied embedding / lm_head is kept tied across the stages.

    The first stage's embedding owns the matrix, the last stage's lm_head mirrors it
    (:class:`~boost_titan.parallel.pipeline.TiedPipelineEmbeddings`): the schedule's ``step`` is
    wrapped to fold the mirror's gradient into the owner's after the train step's last backward (the
    loop calls ``step`` once per gradient-accumulation microbatch), and :func:`build_optimizers_cola`
    (handed the mirror through ``hand_offs``) refreshes it after every optimizer step.
    """
    hand_offs.start(job_config)
    schedule, parts, has_first, has_last = pipeline_llm(model, parallel_dims, job_config, device, model_args,
                                                       parallelize_fn, loss_fn)
    if model_args.tie_embeddings:
        tied = TiedPipelineEmbeddings(parts, parallel_dims.get_mesh("pp"))
        training = job_config.training
        batch = training.local_batch_size * parallel_dims.dp_replicate * parallel_dims.dp_shard
        accumulation = max(training.global_batch_size, batch) // batch  # as torchtitan's Trainer computes it
        step, calls = schedule.step, itertools.count(1)

        def step_then_reduce_tied_grads(*args, **kwargs):
            out = step(*args, **kwargs)
            if next(calls) % accumulation == 0:
                tied.reduce_grads()
            return out

        patches.apply("schedule_step_reduces_tied_grads", step_then_reduce_tied_grads, owner=schedule)
        hand_offs.tied_embeddings = tied
        logger.info("Tied embedding / lm_head across pipeline stages: the last stage mirrors the first "
                    "stage's matrix (gradients summed once per step, weights copied after each optimizer step)")
    return schedule, parts, has_first, has_last


def build_optimizers_cola(model_parts, optimizer_config, parallel_dims, ft_manager=None, *, hand_offs: HandOffs):
    """torchtitan's optimizers, stepping on the local shards of DTensor parameters (and the loop's
    gradient clipping with them: :mod:`boost_titan.parallel.local_shards`); with a tied matrix split
    across pipeline stages, its mirror is refreshed after every step (see :func:`pipeline_cola`). The
    runtime adds its non-finite guard around this builder (``torchtitan_ext.runtime.around_family``)."""
    optimizers = build_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager)
    if all(local_shards.step_on_local_shards(opt) for opt in getattr(optimizers, "optimizers", [])):
        logger.info("Optimizer step and gradient clipping on the local shards of the parameters")
    clip_on_local_shards(hand_offs)
    tied = hand_offs.tied_embeddings
    if tied is not None:
        optimizers.register_step_post_hook(lambda *args, **kwargs: tied.copy_weight())
    return optimizers


def clip_on_local_shards(hand_offs: HandOffs) -> None:
    """The loop clips through ``torchtitan.distributed.utils.clip_grad_norm_`` (looked up at each call):
    point it at the local-shard version, which hands whatever it does not cover back to the original,
    and hand the norm it returns on (:meth:`HandOffs.note_clip`, which the non-finite guard reads)."""
    original = dist_utils.clip_grad_norm_
    if getattr(original, "on_local_shards", False):
        original = original.original  # a later run's hand-offs replace the earlier one's

    def clip_grad_norm_(parameters, *args, **kwargs):
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        total_norm = local_shards.clip_grad_norm_(parameters, *args, fallback=original, **kwargs)
        hand_offs.note_clip(parameters, total_norm)
        return total_norm

    clip_grad_norm_.on_local_shards, clip_grad_norm_.original = True, original
    patches.apply("clip_grad_norm_on_local_shards", clip_grad_norm_)


def fused_linear_cross_entropy_loss(pred: HeadInput, labels: torch.Tensor) -> torch.Tensor:
    """The loss for ``[boost] fused_cross_entropy``: the model returned (hidden, lm_head weight)."""
    if not isinstance(pred, HeadInput):
        raise TypeError(f"fused_cross_entropy: the model returned {type(pred).__name__}, not HeadInput "
                        "(were the model args updated from the job, which sets defer_lm_head?)")
    return linear_cross_entropy_sum(pred.hidden, pred.weight, labels)


def build_loss(job_config, parallel_dims=None, **kwargs):
    """torchtitan's cross-entropy (sum), compiled as torchtitan does, except that under loss-parallel TP
    the compiled loss bypasses inductor's FX graph cache. With ``[boost] fused_cross_entropy`` the
    lm_head and the loss are one op instead (:func:`fused_linear_cross_entropy_loss`, not compiled:
    its chunk loop and liger's Triton kernels are what runs).

    loss_parallel bakes the rank's vocabulary offset into the traced graph, but the cache key does not
    include the rank: ranks sharing a cache directory load each other's graphs and compute a wrong loss
    and gradient, silently (TP2, CPU, torch 2.13: 6.55 instead of 6.27 at step 1; same class as
    pytorch#188332).
    """
    if job_config.boost.fused_cross_entropy:
        return fused_linear_cross_entropy_loss
    compile_cfg = job_config.compile
    loss_parallel = (parallel_dims is not None and parallel_dims.tp_enabled
                     and not job_config.parallelism.disable_loss_parallel)
    if not (compile_cfg.enable and "loss" in compile_cfg.components and loss_parallel
            and compile_cfg.backend == "inductor"):
        return build_cross_entropy_loss(job_config, parallel_dims=parallel_dims, **kwargs)
    logger.info("Compiling the loss function with torch.compile (loss-parallel: no FX graph cache)")
    compiled = torch.compile(cross_entropy_loss, backend="inductor", options={"fx_graph_cache": False})

    def loss(pred, labels):
        # activation_checkpoint.mode = "memory_budget" sets one budget for every graph compiled in the
        # process; the loss has nothing to recompute, and under loss-parallel its graph holds a process-group
        # object that the budget partitioner cannot size ("Cannot compute the size of FakeScriptObject",
        # torch 2.13): it is compiled with the default partitioning
        with torch._functorch.config.patch(activation_memory_budget=1.0):
            return compiled(pred, labels)

    return loss


def _data_errors_as_one_line(build):
    """A dataset that cannot be trained on (:class:`~torchtitan_ext.cola_llama.data.datasets.DataError`: the file and
    line, or the rank and its token count) ends the rank with that one line instead of a traceback."""

    @functools.wraps(build)
    def wrapped(*args, **kwargs):
        try:
            return build(*args, **kwargs)
        except DataError as e:
            raise SystemExit(f"data error: {e}") from None

    return wrapped


@dataclasses.dataclass
class ColaTrainSpec(TrainSpec):
    """torchtitan's TrainSpec plus the run's :class:`HandOffs`, which its functions share."""

    hand_offs: HandOffs = dataclasses.field(default_factory=HandOffs)


def train_spec() -> ColaTrainSpec:
    hand_offs = HandOffs()

    def parallelize(model, parallel_dims, job_config):
        hand_offs.start(job_config)
        return parallelize_cola(model, parallel_dims, job_config)

    return ColaTrainSpec(
        hand_offs=hand_offs,
        model_cls=Transformer,
        model_args=JOB_FLAVORS,
        parallelize_fn=parallelize,
        pipelining_fn=functools.partial(pipeline_cola, hand_offs=hand_offs),
        build_optimizers_fn=functools.partial(build_optimizers_cola, hand_offs=hand_offs),
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=_data_errors_as_one_line(build_dataloader),
        build_tokenizer_fn=build_tokenizer,
        build_loss_fn=build_loss,
        build_validator_fn=_data_errors_as_one_line(build_validator),
        state_dict_adapter=ColaStateDictAdapter,
    )


def register(around=lambda spec: spec) -> None:
    """Register ``around(train_spec())``: ``around`` adds what the runtime hooks into the spec
    (``torchtitan_ext.runtime.around_family``). Idempotent: torchtitan raises if a name is registered twice."""
    try:
        get_train_spec(NAME)
    except ValueError:
        register_train_spec(NAME, around(train_spec()))


def registered_hand_offs() -> HandOffs:
    """The hand-offs of the registered family's spec (the run in this process)."""
    return get_train_spec(NAME).hand_offs
