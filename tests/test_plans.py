"""Plans: readable dicts of ParallelStyles, and one clear error per configuration they cannot shard."""

import pytest
from torch.distributed.tensor.parallel import ParallelStyle

from boost_titan.parallel import STRATEGIES, BottleneckParallel, DenseColwiseParallel, tp_plan

from conftest import TINY

ARGS = TINY
DENSE = ARGS.replace(attn_rank=0, mlp_rank=0)


def test_btp_plan_is_a_dict_of_styles():
    plan = tp_plan("btp", ARGS, tp=4, rmsnorm="sync")
    assert all(isinstance(v, ParallelStyle) for v in plan.values())
    assert isinstance(plan["layers.*.attention.qkv"], BottleneckParallel)
    assert plan["layers.*.attention.qkv"].rmsnorm == "sync"


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_plans_the_same_modules(strategy):
    """The registry's plans cover the same module paths: a strategy differs in styles, not in coverage."""
    args = ARGS if STRATEGIES[strategy].lowrank else DENSE
    assert set(tp_plan(strategy, args, tp=2)) == set(tp_plan("btp", ARGS, tp=2))


def test_a_style_refuses_the_other_family():
    from boost_titan.models.model import Projection

    dense = Projection(8, [8], 0, norm_eps=None, dense_std=0.02)
    with pytest.raises(ValueError, match="BottleneckParallel is for low-rank"):
        BottleneckParallel()._apply(dense, None)
    lowrank = Projection(8, [8], 2, norm_eps=None, dense_std=0.02)
    with pytest.raises(ValueError, match="DenseColwiseParallel is for dense"):
        DenseColwiseParallel()._apply(lowrank, None)


@pytest.mark.parametrize("strategy, args, tp, message", [
    ("btp", ARGS.replace(n_heads=4, n_kv_heads=2), 4, "n_kv_heads=2 is not divisible by the tensor-parallel degree 4"),
    ("btp", ARGS.replace(ffn_dim=90), 4, "ffn_dim=90 is not divisible"),
    ("btp", ARGS.replace(vocab_size=130), 4, "vocab_size=130 is not divisible"),
    ("vanilla", ARGS.replace(mlp_rank=18), 4, "mlp_rank=18 is not divisible"),
    ("btp", DENSE, 2, "tp_strategy='btp' needs a low-rank model"),
    ("fullrank", ARGS, 2, "tp_strategy='fullrank' is for the dense"),
    ("megatron", ARGS, 2, "tp_strategy='megatron' is unknown"),
])
def test_unshardable_configurations_fail_early(strategy, args, tp, message):
    with pytest.raises(ValueError, match=message):
        tp_plan(strategy, args, tp=tp)


def test_btp_does_not_need_divisible_ranks():
    tp_plan("btp", ARGS.replace(mlp_rank=18), tp=4)  # r is never sharded under btp


def test_bad_rmsnorm_choice():
    with pytest.raises(ValueError, match="rmsnorm='triton'"):
        tp_plan("btp", ARGS, tp=2, rmsnorm="triton")
