"""Counted collectives per decoder layer (fake process group, meta tensors: any tp, 7B shapes)."""

import json
import math

import pytest
import torch

from boost_titan.compat import checkpoint_wrapper
from boost_titan.models import FLAVORS
from boost_titan.planner.collectives import MiB, layer_collectives, summarize
from scripts.bench import comm_volume

from conftest import TINY

B, S = 2, 16
ARGS = TINY.replace(n_layers=1)
RA, RM, D, F = ARGS.attn_rank, ARGS.mlp_rank, ARGS.dim, ARGS.ffn_dim


def ops(calls, phase):
    """(kind, elements per token) of each collective: the backward B GEMM's all-reduce sums its
    input gradient as ``[c, b·s, r]``, forward's as ``[b, s, c·r]``, the same elements."""
    return [(c.kind, math.prod(c.shape) / (B * S)) for c in calls if c.phase == phase]


def all_reduces(*widths):
    return [("all_reduce", w) for w in widths]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_btp_online_issues_exactly_the_four_bottleneck_all_reduces(tp):
    calls = layer_collectives("btp", ARGS, tp, B, S, rmsnorm="online")
    # forward: [b,s,3r_a], [b,s,r_a], [b,s,2r_m], [b,s,r_m]; the two normed sites carry the norm's
    # statistic as 2 extra bf16 columns in the SAME all-reduce (no collective of its own)
    assert ops(calls, "forward") == all_reduces(3 * RA + 2, RA, 2 * RM + 2, RM)
    # backward: the B factors' input gradients, same sizes, in reverse order; nothing else
    assert ops(calls, "backward") == all_reduces(RM, 2 * RM, RA, 3 * RA)


@pytest.mark.parametrize("tp", [2, 4])
def test_btp_sync_adds_two_small_statistic_all_reduces_each_way(tp):
    calls = layer_collectives("btp", ARGS, tp, B, S, rmsnorm="sync")
    assert ops(calls, "forward") == all_reduces(1, 3 * RA, RA, 1, 2 * RM, RM)
    assert sorted(ops(calls, "backward")) == sorted(all_reduces(RM, 2 * RM, 1, RA, 3 * RA, 1))
    stats = [c for c in calls if c.shape[-1] == 1]
    assert all(c.itemsize == 4 for c in stats)  # the statistic stays fp32


def test_btp_fp32_packs_one_statistic_column():
    calls = layer_collectives("btp", ARGS, 2, B, S, dtype=torch.float32)
    assert ops(calls, "forward") == all_reduces(3 * RA + 1, RA, 2 * RM + 1, RM)


def test_ungrouped_issues_one_all_reduce_per_factor():
    calls = layer_collectives("btp", ARGS.replace(grouped=False), 2, B, S)
    assert ops(calls, "forward") == all_reduces(RA + 2, RA, RA, RA, RM + 2, RM, RM)  # 3 + 1 + 2 + 1
    assert len(ops(calls, "backward")) == 7


def test_vanilla_matches_boost_counts():
    """BOOST's vanilla TP (docs/design.md, "Tensor-parallel strategies"): 7 forward all-reduces of the B
    outputs, 4 backward of the A inputs."""
    calls = layer_collectives("vanilla", ARGS, 4, B, S)
    assert ops(calls, "forward") == all_reduces(D, D, D, D, F, F, D)
    assert ops(calls, "backward") == all_reduces(F, D, D, D)


def test_fullrank_is_sequence_parallel_megatron():
    calls = layer_collectives("fullrank", ARGS.replace(attn_rank=0, mlp_rank=0), 4, B, S)
    fwd = [c.kind for c in calls if c.phase == "forward"]
    assert fwd == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
    assert all(c.shape[-1] == D for c in calls if c.kind != "all_reduce")
    # backward: the mirror pairs, plus the replicated norm weights' gradient (size d) of SP
    bwd = sorted((c.kind, c.shape) for c in calls if c.phase == "backward")
    assert bwd.count(("all_reduce", (D,))) == 2 and len(bwd) == 6


def test_lowrank_checkpoint_adds_no_collective_while_full_ac_replays_them():
    plain = layer_collectives("btp", ARGS, 2, B, S)
    lowrank = layer_collectives("btp", ARGS, 2, B, S, lowrank_checkpoint=True)
    assert ops(lowrank, "forward") == ops(plain, "forward")
    assert ops(lowrank, "backward") == ops(plain, "backward")


def test_full_activation_checkpointing_would_replay_the_forward_all_reduces(monkeypatch):
    """The contrast that makes the test above meaningful: plain (full) AC recomputes the collectives."""
    from boost_titan.parallel import activation_checkpoint

    def full_ac(model, args, tensor_parallel):
        for layer_id, block in model.layers.named_children():
            model.layers.register_module(layer_id, checkpoint_wrapper(block, preserve_rng_state=False))

    monkeypatch.setattr(activation_checkpoint, "apply_lowrank_checkpoint", full_ac)
    calls = layer_collectives("btp", ARGS, 2, B, S, lowrank_checkpoint=True)
    assert len(ops(calls, "backward")) == 4 + 4


def test_7b_per_layer_volume_reproduces_boost_table(capsys, tmp_path):
    """docs/design.md, "Communication volume", 7B, b=4, s=4096, bf16, forward per layer: 256 / 1328 / 224 MiB."""
    vol = {}
    for strategy, flavor in [("fullrank", "7B_fullrank"), ("vanilla", "7B"), ("btp", "7B")]:
        s = summarize(layer_collectives(strategy, FLAVORS[flavor], 4, 4, 4096))
        vol[strategy] = (s["forward"]["payload_MiB"], s["backward"]["payload_MiB"])
    # by hand: one bf16 column of [b=4, s=4096] is 32 KiB = 1/32 MiB; d 4096, f 11008, r 1024
    col, d, f, r = 4 * 4096 * 2 / MiB, 4096, 11008, 1024
    # 2 all-gathers + 2 reduce-scatters of [b, s, d], each counted as half an all-reduce (BOOST's convention)
    assert vol["fullrank"][0] == 4 * d * col / 2 == 256
    # vanilla all-reduces every projection's output: fwd q,k,v,o,down (5d) + gate,up (2f); bwd the inputs
    # of the 4 projection groups: qkv and gate/up (d each), o (d), down (f)
    assert vol["vanilla"] == ((5 * d + 2 * f) * col, (3 * d + f) * col) == (1328, 728)
    stat_cols = 2 * 2 * col  # online norm: 2 bf16 columns at the 2 normed sites
    assert vol["btp"][0] == pytest.approx(7 * r * col + stat_cols, abs=1e-9) and vol["btp"][1] == 7 * r * col == 224
    comm_volume.main(["--tp", "4", "--out", str(tmp_path / "comm_volume")])
    print(capsys.readouterr().out)  # the per-layer byte table, shown with pytest -s
    written = json.loads((tmp_path / "comm_volume.json").read_text())
    assert written["meta"]["command"] == "python -m scripts.bench.comm_volume --tp 4 --out " + str(tmp_path / "comm_volume")
    rows = {r["strategy"]: r for r in written["rows"]}
    assert (rows["vanilla"]["fwd_count"], rows["vanilla"]["fwd_MiB"], rows["vanilla"]["bwd_MiB"]) == (7, 1328, 728)
    assert (rows["btp (online norm)"]["fwd_count"], rows["btp (online norm)"]["fwd_MiB"]) == (4, 224.125)
    assert "| btp (online norm) |" in (tmp_path / "comm_volume.md").read_text().replace("  ", "")
