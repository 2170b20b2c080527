"""The α–β communication model against hand computations, and the whole-model collective count."""

import math

import pytest

from boost_titan.models import FLAVORS
from boost_titan.planner import comm_model
from boost_titan.planner.collectives import Collective, model_collectives
from boost_titan.planner.comm_model import Interconnect, collective_seconds

LINK = Interconnect(alpha_s=10e-6, bus_bw=100e9)


def test_collective_times_by_hand():
    n = 1e9  # bytes of the full tensor
    # all-reduce on 4 ranks: α + 2·3/4 · 1 GB / 100 GB/s = 10 µs + 15 ms
    assert collective_seconds("all_reduce", n, 4, LINK) == pytest.approx(10e-6 + 0.015)
    # all-gather / reduce-scatter on 4 ranks: α + 3/4 · 10 ms
    assert collective_seconds("all_gather", n, 4, LINK) == pytest.approx(10e-6 + 0.0075)
    assert collective_seconds("reduce_scatter", n, 2, LINK) == pytest.approx(10e-6 + 0.005)
    assert collective_seconds("p2p", n, 2, LINK) == pytest.approx(10e-6 + 0.01)
    assert collective_seconds("all_reduce", n, 1, LINK) == 0.0  # one rank: nothing to do


def test_tp_seconds_sums_every_collective():
    calls = [Collective("forward", "all_reduce", (4, 1000), 2), Collective("backward", "all_gather", (8, 1000), 4)]
    expected = (10e-6 + 2 * 1 / 2 * 8000 / 100e9) + (10e-6 + 1 / 2 * 32000 / 100e9)
    assert comm_model.tp_seconds(calls, 2, LINK) == pytest.approx(expected)


def test_tp_seconds_hides_what_the_gemms_in_flight_cover():
    t = 10e-6 + 2 * 1 / 2 * 8e6 / 100e9  # the all-reduce of 8 MB alone: 90 µs
    partly = Collective("backward", "all_reduce", (4, 10**6), 2, overlap_flops=int(4e10))  # 40 µs at 1 PFLOP/s
    assert comm_model.tp_seconds([partly], 2, LINK, overlap_rate=1e15) == pytest.approx(t - 40e-6)
    fully = Collective("backward", "all_reduce", (4, 10**6), 2, overlap_flops=int(1e12))
    assert comm_model.tp_seconds([fully], 2, LINK, overlap_rate=1e15) == 0.0
    assert comm_model.tp_seconds([fully], 2, LINK, overlap_rate=0) == pytest.approx(t)


def test_backward_collectives_are_issued_before_the_weight_gradient_gemm():
    """The recorder reads, from the real code's order, which GEMMs run while each collective is in
    flight: per 7B tp 4 layer at b 1 × 256, btp's four backward all-reduces each overlap their B
    factors' dW GEMM (2·tokens·r·d_out/t per factor), full rank's two reduce-scatters the
    column-parallel dW GEMMs; forward collectives overlap nothing."""
    from boost_titan.planner.collectives import layer_collectives

    T, tp = 256, 4
    args, dense = FLAVORS["7B"], FLAVORS["7B_fullrank"]
    d, r, f = args.dim, args.attn_rank, args.ffn_dim
    btp = [c for c in layer_collectives("btp", args, tp, 1, T) if c.phase == "backward"]
    assert [c.overlap_flops for c in btp] == [2 * T * r * d // tp, 2 * T * r * 2 * f // tp,  # down, gate|up
                                              2 * T * r * d // tp, 2 * T * r * 3 * d // tp]  # o, q|k|v
    fr = layer_collectives("fullrank", dense, tp, 1, T)
    assert all(c.overlap_flops == 0 for c in fr if c.phase == "forward")
    hidden = sorted(c.overlap_flops for c in fr if c.kind == "reduce_scatter" and c.phase == "backward")
    assert hidden == [2 * T * d * 3 * d // tp, 2 * T * d * 2 * dense.ffn_dim // tp]


def test_fsdp_seconds_by_hand():
    # 1e9 parameters, dp 4: two bf16 all-gathers (2 GB each) and one fp32 reduce-scatter (4 GB), 3/4 of each
    # over 100 GB/s, plus α per unit and collective (3 collectives × 5 units)
    got = comm_model.fsdp_seconds(10**9, 4, LINK, groups=5)
    assert got == pytest.approx(2 * 0.75 * 2e9 / 100e9 + 0.75 * 4e9 / 100e9 + 15 * 10e-6)
    assert comm_model.fsdp_seconds(10**9, 1, LINK) == 0.0


def test_pipeline_step_by_hand():
    # 1F1B, 4 microbatches, 2 stages: 5 slots of (slot + two 1 MB transfers)
    got = comm_model.pipeline_step_seconds(0.1, 4, 2, 1e6, LINK)
    assert got == pytest.approx(5 * (0.1 + 2 * (10e-6 + 1e6 / 100e9)))
    assert comm_model.pipeline_step_seconds(0.1, 4, 1) == pytest.approx(0.4)


def test_fsdp_overlaps_compute_until_it_exceeds_it():
    assert comm_model.predict_step(1.0, 0.2, 0.5).step_s == pytest.approx(1.2)
    assert comm_model.predict_step(1.0, 0.2, 1.5).step_s == pytest.approx(1.7)


def test_whole_model_btp_collectives_are_the_layers_plus_embedding_and_final_gather():
    """7B btp tp 4, counted on meta tensors: 4 + 4 all-reduces per layer, and the embedding's
    reduce-scatter / the final norm's all-gather of the [b, s, d] stream (with their backward mirrors)."""
    args = FLAVORS["7B"]
    calls, local = model_collectives("btp", args, 4, 1, 256)
    kinds = [c.kind for c in calls]
    assert kinds.count("all_reduce") == 8 * args.n_layers
    assert kinds.count("all_gather") == 2 and kinds.count("reduce_scatter") == 2
    gathered = [c for c in calls if c.kind != "all_reduce"]
    assert all(comm_model.full_bytes(c) == 1 * 256 * args.dim * 2 for c in gathered)  # the full bf16 stream
    # the rank holds a quarter of every sharded weight; norms' γ are d-sharded too, r is never sharded
    from boost_titan.models.args import count_params
    assert local == pytest.approx(count_params(args) / 4, rel=1e-3)


def test_nvlink_bus_bandwidth_follows_the_measured_curve():
    """Inside a node the bus bandwidth depends on the message size: the curve's points exactly, log-size
    interpolation between them (monotone), its first slope below, the asymptote from the last point."""
    from boost_titan.planner.comm_model import H200_NODE, NVLINK_RING_CURVE, MiB

    for nbytes, bw in NVLINK_RING_CURVE:
        assert H200_NODE.bus_bw_at(nbytes) == pytest.approx(bw)
    sizes = [2**k for k in range(16, 34)]
    bws = [H200_NODE.bus_bw_at(n) for n in sizes]
    assert all(a <= b for a, b in zip(bws, bws[1:])) and bws[-1] == H200_NODE.bus_bw == 370e9
    assert H200_NODE.bus_bw_at(24 * MiB) == pytest.approx(240e9 * (300 / 240) ** (math.log(1.5) / math.log(2)))
    assert H200_NODE.bus_bw_at(8 * MiB) == pytest.approx(240e9 * (240 / 300))  # one halving below 16 MiB
    # a 32 MiB all-reduce over 4 ranks: alpha + 2·3/4 · n / 300 GB/s
    assert collective_seconds("all_reduce", 32 * MiB, 4, H200_NODE) == pytest.approx(15e-6 + 1.5 * 32 * MiB / 300e9)
    assert LINK.bus_bw_at(1) == LINK.bus_bw  # no curve: one bandwidth
