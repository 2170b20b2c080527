"""The layout planner's arithmetic (``python -m boost_titan.planner``) against hand computations."""

import dataclasses

import pytest

from boost_titan.models import FLAVORS
from boost_titan.models.args import count_params, flops_per_token
from boost_titan.parallel import STRATEGIES, btp, check_tp
from boost_titan.parallel.base import Strategy
from boost_titan.planner import comm_model
from boost_titan.planner import predict as plan
from boost_titan.planner.costs import COSTS, StrategyCosts


@pytest.fixture
def no_host_floor(monkeypatch):
    """The hand computations below check compute and communication: the host floor set to zero."""
    from boost_titan.planner.costs import measured_constants

    zero = {"1": 0.0}  # every tp takes the nearest measured one
    monkeypatch.setitem(measured_constants(), "host_per_block_s",
                        dict.fromkeys(("fsdp", "fsdp_one_unit", "one_rank", "pipeline_pass", "pipeline_step"), zero))


def set_rates(monkeypatch, rates: dict[str, dict[int, float]]) -> None:
    """Give strategies other per-rank TFLOP/s in their planner parameters."""
    for name, by_tp in rates.items():
        monkeypatch.setitem(COSTS, name, dataclasses.replace(COSTS[name], tflops_by_tp=by_tp))

def last_of_two_stages(args) -> float:
    """FLOPs per token of the last of two pipeline stages: half the blocks and the whole lm_head (6·V·d)."""
    head = 6 * args.vocab_size * args.dim
    return (flops_per_token(args, 4096) - head) / 2 + head


TINY_FLAVOR = FLAVORS["tiny"]  # d 64, 2 layers, 4 heads, f 160, r 16, V 512, untied


def test_layouts_are_exactly_the_valid_ones():
    found = plan.layouts(TINY_FLAVOR, 8)
    for layout in found:
        assert layout.tp * layout.pp * layout.dp == 8 and TINY_FLAVOR.n_layers % layout.pp == 0
        check_tp(layout.strategy, TINY_FLAVOR, layout.tp)
    assert not any(layout.tp == 8 for layout in found)  # 4 heads: tp 8 cannot shard them
    assert not any(layout.strategy == "vanilla" and layout.tp == 1 for layout in found)  # same as btp there
    assert {layout.pp for layout in found} == {1, 2}  # 2 layers
    assert not any(layout.strategy == "fullrank" for layout in found)  # a CoLA flavor
    dense = plan.layouts(FLAVORS["tiny_fullrank"], 4)
    assert {layout.strategy for layout in dense} == {"fullrank"}
    assert {layout.ac for layout in dense} == {"none", "budget", "full"}  # no low-rank checkpointing without ranks
    assert {layout.ac for layout in found} == {"none", "budget", "lowrank", "full"}


@pytest.mark.parametrize("flavor", ["tiny", "tiny_tied", "1B", "7B_fullrank"])
def test_stage_params_at_tp1_pp1_is_the_whole_model(flavor):
    args = FLAVORS[flavor]
    assert plan.stage_params(args, 1, 1) == count_params(args)


def test_memory_by_hand():
    args = FLAVORS["7B"]  # d 4096, 32 layers, tied
    layout = plan.Layout("btp", tp=4, pp=1, dp=1, ac="none")
    got = plan.memory(args, layout, batch=4, seq=4096)
    params = (32 * (args.dim * 8 * 1024 + 3 * 1024 * (4096 + 11008) + 2 * 4096) + 32000 * 4096 + 4096) // 4
    assert got["params"] == params
    # dp 1: the 1-rank wrapper's bf16 weights (2 B) and its end-of-backward gradient reduction (2 + 2 + 4 B)
    assert got["states_bytes"] == 16 * params + (2 + 8) * params
    acts = (41.2 / 4 + 7.0) * 4096 * (4 * 4096) * 32
    assert got["activation_bytes"] == pytest.approx(acts)
    assert got["total_bytes"] / plan.GiB == pytest.approx(51.36, rel=0.01)  # measured (c489d66: emulate_fig5_before_overlap)
    piped = plan.memory(args, plan.Layout("btp", 4, 2, 1, "lowrank"), batch=4, seq=4096)
    assert piped["activation_bytes"] == pytest.approx(0.2 * (41.2 / 4 + 7.0) * 4096 * 4096 * 16 * 2)  # 2 in flight


@pytest.mark.parametrize("flavor, strategy, measured_gib", [("3B", "btp", 50.91), ("3B", "vanilla", 71.75),
                                                             ("3B_fullrank", "fullrank", 71.60)])
def test_memory_model_predicts_rows_it_was_not_fitted_to(flavor, strategy, measured_gib):
    """3B tp 2, dp 1, b 4 x 4096, compiled (c489d66: emulate_fig5_before_overlap): not used for the activation constants."""
    got = plan.memory(FLAVORS[flavor], plan.Layout(strategy, 2, 1, 1, "none"), batch=4, seq=4096)
    assert got["total_bytes"] / plan.GiB == pytest.approx(measured_gib, rel=0.08)


def test_step_time_by_hand(monkeypatch, no_host_floor):
    """Compute at the measured rate, TP collectives per layer, the 1F1B bubble, FSDP overlap."""
    args = FLAVORS["7B"]
    set_rates(monkeypatch, {"btp": {1: 500.0, 4: 400.0}})
    calls = [comm_model.Collective("forward", "all_reduce", (1, 4096, 3072), 2)]
    monkeypatch.setattr(plan, "_layer_tp_calls", lambda *a: calls)
    per_layer = comm_model.tp_seconds(calls, 4)
    flops_mb = flops_per_token(args, 4096) * 4096  # one sequence

    t = plan.step_time(args, plan.Layout("btp", 4, 2, 1, "none"), batch=4, seq=4096)
    slot = last_of_two_stages(args) * 4096 / 4 / 400e12 + 16 * per_layer  # the last stage sets the pace
    p2p = 2 * 4096 * 1024  # one sequence of the d-sharded stream in bf16
    assert t["step_s"] == pytest.approx(comm_model.pipeline_step_seconds(slot, 4, 2, p2p))
    assert t["rate"] == "tp4"

    t8 = plan.step_time(args, plan.Layout("btp", 8, 1, 1, "full"), batch=4, seq=4096)
    assert t8["rate"] == "tp4 (nearest)"
    t13 = plan.step_time(FLAVORS["13B"], plan.Layout("btp", 4, 1, 1, "none"), batch=4, seq=4096)
    assert t13["rate"] == "tp4 (measured at 3B/7B)"  # d 5120: a rate measured on smaller models
    assert t8["compute_s"] == pytest.approx(4 * flops_mb / 8 / 400e12 * 4 / 3)
    # tp 8: the same collectives over 8 ranks; dp 1: no FSDP traffic
    assert t8["step_s"] == pytest.approx(t8["compute_s"] + 32 * comm_model.tp_seconds(calls, 8))


def test_pipeline_microbatch_by_hand(monkeypatch, no_host_floor):
    """``microbatch`` sequences per pipeline microbatch: batch / microbatch slots' worth of work, each
    slot and each send ``microbatch`` times larger, ``min(pp, m)`` microbatches in flight; pp 1 ignores it."""
    args = FLAVORS["13B"]
    set_rates(monkeypatch, {"btp": {4: 400.0}})
    calls = [comm_model.Collective("forward", "all_reduce", (4, 4096, 3840), 2)]
    monkeypatch.setattr(plan, "_layer_tp_calls", lambda strategy, a, tp, mb, seq: calls if mb == 4 else None)
    layout = plan.Layout("btp", 4, 2, 1, "none")
    t = plan.step_time(args, layout, batch=16, seq=4096, microbatch=4)
    # by hand, with comm_model's constants (α 15 µs, the NVLink bus bandwidth at each message size): one
    # all-reduce of [4, 4096, 3840] bf16 on 4 ranks per layer, 20 layers per stage; 1F1B: 4 + 2 − 1 slots,
    # each with two sends of the stream
    bw = comm_model.H200_NODE.bus_bw_at
    ar_bytes = 4 * 4096 * 3840 * 2
    all_reduce = 15e-6 + 2 * 3 / 4 * ar_bytes / bw(ar_bytes)
    slot = last_of_two_stages(args) * 4 * 4096 / 4 / 400e12 + 20 * all_reduce
    p2p = 2 * 4 * 4096 * (5120 // 4)  # four sequences of the d-sharded stream in bf16
    assert t["step_s"] == pytest.approx(5 * (slot + 2 * (15e-6 + p2p / bw(p2p))))
    mem = plan.memory(args, layout, batch=16, seq=4096, microbatch=4)
    assert mem["activation_bytes"] == pytest.approx((41.2 / 4 + 7.0) * 5120 * 4 * 4096 * 20 * 2)  # 2 in flight
    assert plan.memory(args, plan.Layout("btp", 4, 1, 2, "none"), 16, 4096, microbatch=4) == \
        plan.memory(args, plan.Layout("btp", 4, 1, 2, "none"), 16, 4096)
    with pytest.raises(ValueError, match="microbatch=3 must be a positive divisor of the local batch 16"):
        plan.step_time(args, layout, batch=16, seq=4096, microbatch=3)


def test_plan_lists_fitting_layouts_first_by_throughput():
    rows = plan.plan("tiny", 4, gpu_mem_gib=139, batch=2, seq=64)
    assert rows and all(r["fits"] for r in rows)
    speeds = [r["tokens_per_s_gpu"] for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    nothing = plan.plan("tiny", 4, gpu_mem_gib=1e-6, batch=2, seq=64)
    assert not any(r["fits"] for r in nothing)


def test_memory_budget_layout_by_hand(monkeypatch):
    """ac = "budget" keeps 0.71 (CoLA) / 0.68 (full rank) of the activations and costs 1.027× / 1.011×
    compute (1B, b 4, measured: 1b_pair_h200.md); model states unchanged."""
    monkeypatch.setattr(plan, "_layer_tp_calls", lambda *a: [])
    set_rates(monkeypatch, {"btp": {2: 500.0}, "fullrank": {2: 600.0}})
    for flavor, strategy, keep, time in [("7B", "btp", 0.71, 1.027), ("7B_fullrank", "fullrank", 0.68, 1.011)]:
        args = FLAVORS[flavor]
        none, budget = (plan.Layout(strategy, 2, 1, 4, ac) for ac in ("none", "budget"))
        m0, m1 = plan.memory(args, none, 4, 4096), plan.memory(args, budget, 4, 4096)
        assert m1["states_bytes"] == m0["states_bytes"]
        a_sh, a_rep = COSTS[strategy].activation_d
        assert m1["activation_bytes"] == pytest.approx(keep * (a_sh / 2 + a_rep) * args.dim * 4 * 4096 * 32)
        rate = COSTS[strategy].tflops_by_tp[2] * 1e12
        t1 = plan.step_time(args, budget, 4, 4096)
        assert t1["compute_s"] == pytest.approx(flops_per_token(args, 4096) * 4 * 4096 / 2 / rate * time)


def test_train_command_runs_the_layout():
    cmd = plan.train_command("13B", plan.Layout("btp", 4, 2, 1, "budget"), batch=16, seq=4096, microbatch=4)
    assert cmd == ("NGPU=8 ./scripts/run_train.sh --model.flavor 13B --boost.tp_strategy btp "
                   "--parallelism.tensor_parallel_degree 4 --parallelism.pipeline_parallel_degree 2 "
                   "--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 16 --training.seq_len 4096 "
                   "--compile.enable --activation_checkpoint.mode memory_budget --activation_checkpoint.memory_budget 0.9 "
                   "--parallelism.pipeline_parallel_microbatch_size 4")
    from torchtitan_ext.runtime.preflight import problems

    flags = plan.train_command("debugmodel", plan.Layout("btp", 2, 1, 1, "budget"), batch=2, seq=64).split()[2:]
    assert problems(["--job.config_file", "train_configs/debug_cpu.toml", *flags], 2) == []


# ---- several nodes -------------------------------------------------------------------------------
def test_cluster_links_by_hand():
    """Ranks tp-innermost, then dp, then pp: a group inside a node runs on NVLink; across nodes on the
    NICs of its ranks on each node (47 GB/s each, α 20 µs), never above NVLink's bus bandwidth."""
    two = comm_model.Cluster(nodes=2, gpus_per_node=8)
    assert two.link(8, 1) is comm_model.H200_NODE  # tp 8 inside a node
    assert two.link(2, 4) is comm_model.H200_NODE  # dp 2 at stride 4: ranks 0 and 4, one node
    one_nic = two.link(2, 8)  # dp 2 at stride 8 (tp 8): one GPU, so one NIC, per node
    assert (one_nic.alpha_s, one_nic.bus_bw) == (20e-6, 47e9)
    assert two.link(4, 4).bus_bw == 2 * 47e9  # dp 4 at stride 4: ranks 0, 4 | 8, 12: two per node
    assert two.link(16, 1).bus_bw == 370e9  # all 16: 8 NICs a node (376 GB/s) > NVLink's 370
    # mid-size messages: no faster across nodes than NVLink's curve gives them inside a node
    assert two.link(16, 1).bus_bw_at(16 * 2**20) == pytest.approx(240e9)
    assert one_nic.bus_bw_at(16 * 2**20) == 47e9  # one NIC is below NVLink's curve at every size
    assert two.crossing(tp=8, dp=2, pp=1) == ["dp"]
    assert two.crossing(tp=4, dp=2, pp=1) == []
    assert comm_model.Cluster(nodes=2, gpus_per_node=4).crossing(tp=4, dp=1, pp=2) == ["pp"]
    half = comm_model.Cluster(2, 8, network=comm_model.Network(nics_per_gpu=0.5))  # one NIC per two GPUs
    assert half.link(2, 8).bus_bw == 0.5 * 47e9


def test_ring_latency_grows_with_the_nodes_it_spans():
    """α across nodes is the two-node ring's (20 µs); NCCL's ring adds 14 µs per further inter-node step:
    an all-reduce takes 2(N−1) steps, an all-gather or a reduce-scatter N−1, a send none."""
    small = 8.0  # bytes: α is the whole cost
    for nodes in (2, 3, 16, 128):
        link = comm_model.Cluster(nodes=nodes, gpus_per_node=8).link(nodes, 8)  # one rank per node
        assert link.nodes == nodes
        extra = max(0, nodes - 2) * 14e-6
        for kind, steps_per_node in [("all_gather", 1), ("reduce_scatter", 1), ("all_reduce", 2)]:
            bandwidth = (2 if kind == "all_reduce" else 1) * (nodes - 1) / nodes * small / link.bus_bw_at(small)
            assert comm_model.collective_seconds(kind, small, nodes, link) == pytest.approx(
                20e-6 + steps_per_node * extra + bandwidth)
    assert comm_model.H200_NODE.alpha_at("all_reduce") == 15e-6  # inside a node: as measured, any length
    far = comm_model.Cluster(nodes=16).link(16, 8)
    assert far.alpha_at("p2p") == 20e-6


def test_a100_machine_by_hand():
    """``gpu="a100"`` (BOOST's nodes): 4 GPUs and 79 GiB per node by default, NVLink 3's 230 GB/s, a
    200 Gb/s NIC per GPU, and the H200's per-rank rates times 312 / 989 (compute and the dW GEMMs that
    hide collectives alike)."""
    a100, h200 = comm_model.cluster_of("a100", nodes=2), comm_model.cluster_of("h200", nodes=2)
    assert (a100.gpus_per_node, a100.node.bus_bw, a100.network.nic_bw) == (4, 230e9, 23.5e9)
    assert a100.link(2, 4).bus_bw == 23.5e9  # dp 2 at stride 4: one NIC per node
    args, layout = FLAVORS["7B"], plan.Layout("btp", 4, 1, 2, "none")
    ta = plan.step_time(args, layout, 4, 4096, cluster=a100)
    th = plan.step_time(args, layout, 4, 4096, cluster=h200)
    assert ta["compute_s"] == pytest.approx(th["compute_s"] * 989 / 312)
    rows = plan.plan("7B", 4, gpu="a100", nodes=1, batch=4)
    assert {r["dp"] * r["tp"] * r["pp"] for r in rows} == {4}
    fitting = [r for r in rows if r["fits"]]
    headroom = comm_model.GPUS["a100"]["mem_gib"] * plan.measured_constants()["memory_headroom"]["value"]
    assert comm_model.GPUS["a100"]["mem_gib"] == 79.0 and fitting and all(r["mem_gib"] <= headroom for r in fitting)
    with pytest.raises(ValueError, match="gpu='b200' is unknown; choose one of h200, a100"):
        comm_model.cluster_of("b200")


def test_multinode_step_time_by_hand(monkeypatch, no_host_floor):
    """FSDP across two nodes pays the network (exposed beyond compute); a pipeline whose stages sit on
    two nodes sends its activations over one NIC."""
    args = FLAVORS["7B"]
    set_rates(monkeypatch, {"btp": {8: 400.0, 4: 400.0}})
    monkeypatch.setattr(plan, "_layer_tp_calls", lambda *a: [])
    two = comm_model.Cluster(nodes=2, gpus_per_node=8)
    t = plan.step_time(args, plan.Layout("btp", 8, 1, 2, "none"), batch=1, seq=4096, cluster=two)
    params = plan.stage_params(args, 8, 1)
    ag = 1 / 2 * params * 2 / 47e9  # all-gather of bf16 weights over 2 ranks, one NIC each
    rs = 1 / 2 * params * 4 / 47e9  # reduce-scatter of fp32 gradients
    fsdp = 2 * ag + rs + 3 * (32 + 2) * 20e-6  # gathered again in backward; one α per unit and collective
    assert t["fsdp_s"] == pytest.approx(fsdp)
    compute = flops_per_token(args, 4096) * 4096 / 8 / 400e12
    # per phase, 34 units: forward hides all but the first all-gather under a third of the compute,
    # backward the re-gathers and all but the last reduce-scatter under two thirds
    ag_unit, rs_unit = ag / 34 + 20e-6, rs / 34 + 20e-6
    forward = ag_unit + max(0.0, 33 * ag_unit - compute / 3)
    backward = rs_unit + max(0.0, 34 * ag_unit + 33 * rs_unit - 2 * compute / 3)
    assert t["step_s"] == pytest.approx(compute + forward + backward)

    nodes4 = comm_model.Cluster(nodes=2, gpus_per_node=4)
    t = plan.step_time(args, plan.Layout("btp", 4, 2, 1, "none"), batch=4, seq=4096, cluster=nodes4)
    slot = last_of_two_stages(args) * 4096 / 4 / 400e12
    p2p = 2 * 4096 * 1024  # one sequence of the d-sharded stream in bf16
    assert t["step_s"] == pytest.approx(5 * (slot + 2 * (20e-6 + p2p / 47e9)))


def test_multinode_plan_rows_and_command():
    rows = plan.plan("7B", gpus=8, nodes=2, global_batch=32)
    assert {r["tp"] * r["pp"] * r["dp"] for r in rows} == {16}
    # strong scaling: global / dp sequences per rank, in accum passes of batch
    assert all(r["tp"] <= 8 and r["batch"] * r["accum"] * r["dp"] == 32 for r in rows)
    assert {r["crosses"] for r in rows if r["tp"] == 8 and r["pp"] == 1} == {"dp"}
    assert {r["crosses"] for r in rows if r["tp"] == 8 and r["pp"] == 2} == {"pp"}
    layout = plan.Layout("btp", 4, 1, 4, "none")
    cmd = plan.train_command("7B", layout, batch=8, seq=4096, nodes=2)
    assert cmd.startswith("NNODES=2 NODE_RANK=<0..1> RDZV_ENDPOINT=<node 0>:29500 NGPU=8 ./scripts/run_train.sh ")
    assert "--parallelism.data_parallel_shard_degree 4" in cmd
    # one node: the same numbers as before (no network)
    single = plan.plan("7B", gpus=8)
    assert single[0]["crosses"] == "-"


def test_hsdp_by_hand(monkeypatch):
    """HSDP across nodes: FSDP inside each node (NVLink), the fp32 gradient shard all-reduced across the
    replicas (one GPU per node in each replica group: one NIC); model states sharded over the node only."""
    args = FLAVORS["7B"]
    set_rates(monkeypatch, {"btp": {2: 400.0}})
    monkeypatch.setattr(plan, "_layer_tp_calls", lambda *a: [])
    two = comm_model.Cluster(nodes=2, gpus_per_node=8)
    hsdp = plan.Layout("btp", 2, 1, 8, "none", rep=2)  # tp 2 x shard 4 inside a node, 2 replicas
    assert hsdp in plan.layouts(args, 16, gpus_per_node=8)
    params = plan.stage_params(args, 2, 1)
    t = plan.step_time(args, hsdp, batch=4, seq=4096, cluster=two)
    nvlink = comm_model.fsdp_seconds(params, 4, comm_model.H200_NODE, groups=34)
    all_reduce = 34 * 20e-6 + 2 * 1 / 2 * (4 * params / 4) / 47e9  # one per unit, on the network
    assert t["fsdp_s"] == pytest.approx(nvlink + all_reduce)
    # the network's all-reduces hide under the backward beside NVLink's traffic, all but the last
    compute = flops_per_token(args, 4096) * 4 * 4096 / 2 / 400e12
    nvlink_exposed = comm_model.fsdp_exposed_seconds(params, 4, compute, comm_model.H200_NODE, groups=34)
    ar_unit = all_reduce / 34
    assert t["fsdp_exposed_s"] == pytest.approx(nvlink_exposed + ar_unit + max(0.0, 33 * ar_unit - 2 * compute / 3))
    assert plan.memory(args, hsdp, 4, 4096)["states_bytes"] == 16 * params / 4
    assert two.crossing(tp=2, dp=4, pp=1, rep=2) == ["rep"]
    cmd = plan.train_command("7B", hsdp, batch=4, seq=4096, nodes=2)
    assert "--parallelism.data_parallel_shard_degree 4 --parallelism.data_parallel_replicate_degree 2" in cmd


def test_a_new_strategy_is_planned_from_its_own_parameters(monkeypatch):
    """A strategy added to the registry (here btp's plan under another name) with its own entry in
    ``COSTS`` is planned from those parameters; without an entry the planner says what to add."""
    toy = Strategy("toy", lowrank=True, stream=btp.STREAM, plan=btp.plan)
    monkeypatch.setitem(STRATEGIES, "toy", toy)
    monkeypatch.setitem(COSTS, "toy", StrategyCosts({2: 100.0}, (30.0, 2.0)))
    rows = [r for r in plan.plan("7B", gpus=4) if r["strategy"] == "toy"]
    assert {(r["tp"], r["ac"]) for r in rows if r["pp"] == 1} >= {(1, "none"), (2, "none"), (4, "none")}
    args = FLAVORS["7B"]
    row = next(r for r in rows if (r["tp"], r["pp"], r["ac"]) == (4, 1, "none"))
    assert row["rate"] == "tp2 (nearest)"
    assert row["compute_s"] == pytest.approx(flops_per_token(args, 4096) * 4 * 4096 / 4 / 100e12)
    mem = plan.memory(args, plan.Layout("toy", 4, 1, 1, "none"), 4, 4096)
    assert mem["activation_bytes"] == pytest.approx((30.0 / 4 + 2.0) * args.dim * 4 * 4096 * args.n_layers)
    monkeypatch.delitem(COSTS, "toy")
    with pytest.raises(ValueError, match=r"tp_strategy='toy' has no planner parameters: add COSTS\['toy'\]"):
        plan.plan("7B", gpus=4)


def test_no_layout_is_predicted_faster_than_its_host(monkeypatch):
    """The host floor bounds every step: a host-bound layout takes its host time, a GPU-bound one is
    unchanged; the no-overlap bound is never faster than ideal overlap."""
    from boost_titan.planner.costs import measured_constants

    per_block = {kind: by_tp["4"] for kind, by_tp in measured_constants()["host_per_block_s"].items()}
    args = FLAVORS["7B"]  # 32 blocks
    for layout, batch, host in [
            (plan.Layout("btp", 4, 1, 2, "none"), 1, 32 * per_block["fsdp"]),
            (plan.Layout("btp", 4, 1, 1, "none"), 1, 32 * per_block["one_rank"]),
            # two stages of 16 blocks, microbatch 1: 4 passes
            (plan.Layout("btp", 4, 2, 1, "none"), 4, 16 * (per_block["pipeline_step"] + 4 * per_block["pipeline_pass"]))]:
        t = plan.step_time(args, layout, batch, 4096)
        assert t["host_s"] == pytest.approx(host)
        assert t["step_s"] >= t["host_s"] and t["step_no_overlap_s"] >= t["step_s"]
        if layout.pp == 1:  # host and GPU work side by side: the larger of the two, not their sum
            gpu_s = t["compute_s"] + t["tp_comm_s"] + t["fsdp_exposed_s"]
            assert t["step_s"] == pytest.approx(max(t["host_s"], gpu_s))
            if t["bound"] == "host" and t["host_s"] > gpu_s:
                assert t["step_s"] == t["host_s"]
    gpu = plan.step_time(args, plan.Layout("btp", 1, 1, 8, "none"), 4, 4096)
    assert gpu["bound"] == "gpu" and gpu["step_s"] == pytest.approx(gpu["compute_s"] + gpu["fsdp_exposed_s"])


def test_one_fsdp_unit_per_stage(no_host_floor):
    """``units="stage"`` (``[boost] fsdp_blocks_per_unit`` = the stage's blocks): the host floor measured
    for one unit, all of FSDP's traffic exposed (one unit gathers once, before forward, and reduce-scatters
    after backward: nothing overlaps it; per-block units expose only what exceeds compute), the whole stage's
    bf16 weights and gradients held, and the run command that asks for it. Layouts without FSDP across
    ranks have no such variant."""
    from boost_titan.planner.costs import measured_constants

    args, wrapper = FLAVORS["7B"], measured_constants()["one_rank_wrapper_bytes_per_param"]["value"]
    block, stage = plan.Layout("btp", 4, 1, 2, "none"), plan.Layout("btp", 4, 1, 2, "none", units="stage")
    tb, ts = plan.step_time(args, block, 4, 4096), plan.step_time(args, stage, 4, 4096)
    assert ts["fsdp_s"] > 0 and ts["compute_s"] == tb["compute_s"]
    # one unit (the root's group) is all-gathered once: forward only; per-block units again in backward
    params = plan.stage_params(args, 4, 1)
    assert ts["fsdp_s"] == pytest.approx(comm_model.fsdp_seconds(params, 2, groups=1, regather_in_backward=False))
    assert tb["fsdp_s"] == pytest.approx(comm_model.fsdp_seconds(params, 2, groups=34))
    assert ts["step_s"] == pytest.approx(tb["compute_s"] + tb["tp_comm_s"] + ts["fsdp_s"])
    # per-block units, phase by phase: each unit's message at its own size on the bandwidth curve
    ag = comm_model.collective_seconds("all_gather", params * 2 / 34, 2)
    rs = comm_model.collective_seconds("reduce_scatter", params * 4 / 34, 2)
    c = tb["compute_s"]
    exposed = ag + max(0.0, 33 * ag - c / 3) + rs + max(0.0, 34 * ag + 33 * rs - 2 * c / 3)
    assert tb["step_s"] == pytest.approx(c + tb["tp_comm_s"] + exposed)
    extra = plan.memory(args, stage, 4, 4096)["total_bytes"] - plan.memory(args, block, 4, 4096)["total_bytes"]
    assert extra == pytest.approx(wrapper * plan.stage_params(args, 4, 1))
    assert plan.train_command("7B", stage, 4, 4096).endswith("--compile.enable --boost.fsdp_blocks_per_unit 32")
    assert "fsdp_blocks_per_unit" not in plan.train_command("7B", block, 4, 4096)
    units = {(lay.tp, lay.dp, lay.units) for lay in plan.layouts(args, 8) if lay.strategy == "btp" and lay.pp == 1}
    assert (4, 2, "stage") in units and (8, 1, "block") in units and (8, 1, "stage") not in units


def test_host_floor_per_layout_kind_and_tp_by_hand():
    """The host's time per step from the measured constants: per block and pass by kind at the layout's
    tp (tp 8 takes tp 4's, the nearest measured); a pipeline stage pays a fixed part per block and a
    part per block and microbatch."""
    from boost_titan.planner.costs import measured_constants

    per_block = {kind: {int(t): v for t, v in by_tp.items()}
                 for kind, by_tp in measured_constants()["host_per_block_s"].items()}
    args = FLAVORS["7B"]  # 32 blocks
    for tp in (1, 2, 4, 8):
        measured = min(per_block["fsdp"], key=lambda t: abs(t - tp))
        for layout, kind in [(plan.Layout("btp", tp, 1, 2, "none"), "fsdp"),
                             (plan.Layout("btp", tp, 1, 2, "none", units="stage"), "fsdp_one_unit"),
                             (plan.Layout("btp", tp, 1, 1, "none"), "one_rank"),
                             (plan.Layout("btp", tp, 1, 1, "none", units="stage"), "one_rank")]:  # no FSDP across ranks
            assert plan.host_seconds(args, layout) == pytest.approx(32 * per_block[kind][measured])
            assert plan.host_seconds(args, layout, 3) == pytest.approx(3 * 32 * per_block[kind][measured])
        pipeline = plan.Layout("btp", tp, 2, 1, "none")
        assert plan.host_seconds(args, pipeline, 8) == pytest.approx(
            16 * (per_block["pipeline_step"][measured] + 8 * per_block["pipeline_pass"][measured]))


def test_host_constants_are_the_measured_rows():
    """``host_per_block_s`` is what ``docs/results/host_floor_emulated.json`` measured: each kind's step
    over its blocks, and the pipeline's parts from its runs at 2 and 4 microbatches."""
    import json
    from pathlib import Path

    from boost_titan.planner.costs import measured_constants

    rows = json.loads((Path(__file__).parents[1] / "docs/results/host_floor_emulated.json").read_text())["rows"]
    step = {(r["kind"], r["tp"], r["passes"]): r["step_s"] for r in rows if r["ok"]}
    constants = measured_constants()["host_per_block_s"]
    for tp in (1, 2, 4):
        for kind in ("fsdp", "fsdp_one_unit", "one_rank"):
            assert constants[kind][str(tp)] == pytest.approx(step[kind, tp, 1] / 32, rel=2e-3)
        m2, m4 = step["pipeline", tp, 2], step["pipeline", tp, 4]  # 16 blocks per stage
        assert constants["pipeline_pass"][str(tp)] == pytest.approx((m4 - m2) / (2 * 16), rel=2e-3)
        assert constants["pipeline_step"][str(tp)] == pytest.approx((2 * m2 - m4) / 16, rel=2e-3)


def test_step_graph_replaces_the_per_block_host_floor():
    """``--step-graph`` (``[boost] step_cudagraph``): a layout without pipeline stages pays the measured
    fixed host time per step instead of one per block, and the graph's memory pool; a host-bound layout
    becomes GPU-bound and faster, a GPU-bound one keeps its step; pipeline layouts are left as they are."""
    from boost_titan.planner.costs import measured_constants

    graph = measured_constants()["step_graph"]
    args = FLAVORS["7B"]
    layout = plan.Layout("btp", 4, 1, 2, "none", units="stage")
    captured = dataclasses.replace(layout, step_graph=True)
    assert plan.host_seconds(args, captured) == graph["host_s"] < plan.host_seconds(args, layout)
    extra = plan.memory(args, captured, 1, 4096)["total_bytes"] - plan.memory(args, layout, 1, 4096)["total_bytes"]
    assert extra == pytest.approx(graph["pool_gib"] * plan.GiB)
    assert plan.train_command("7B", captured, 1, 4096).endswith("--boost.step_cudagraph")

    def rows(step_graph, batch):
        return {(r["strategy"], r["tp"], r["pp"], r["dp"], r["units"], r["ac"]): r
                for r in plan.plan("7B", 8, batch=batch, step_graph=step_graph)}

    for batch in (1, 4):
        plain, graphed = rows(False, batch), rows(True, batch)
        assert plain.keys() == graphed.keys()
        for key, r in graphed.items():
            p = plain[key]
            if key[2] > 1:  # pipeline stages: no step graph
                assert not r["step_graph"] and r["step_s"] == p["step_s"] and r["host_s"] == p["host_s"]
                continue
            assert r["step_graph"] and r["host_s"] == graph["host_s"] and r["step_s"] <= p["step_s"]
            if p["bound"] == "gpu":
                assert r["step_s"] == pytest.approx(p["step_s"])
    b1 = rows(True, 1)[("btp", 4, 1, 2, "stage", "none")]
    assert rows(False, 1)[("btp", 4, 1, 2, "stage", "none")]["bound"] == "host" and b1["bound"] == "gpu"


def test_gradient_accumulation_by_hand(monkeypatch, no_host_floor):
    """``accum`` passes of ``batch`` sequences: compute, TP collectives and host time per pass add up,
    FSDP gathers and reduce-scatters again in every pass (torchtitan keeps gradient sync on), and the
    activations are those of one pass."""
    args = FLAVORS["7B"]
    set_rates(monkeypatch, {"btp": {1: 500.0}})
    monkeypatch.setattr(plan, "_layer_tp_calls", lambda *a: [])
    layout = plan.Layout("btp", 1, 1, 8, "none")
    one, four = plan.step_time(args, layout, 4, 4096), plan.step_time(args, layout, 1, 4096, accum=4)
    assert four["compute_s"] == pytest.approx(one["compute_s"])  # the same tokens
    compute_pass = flops_per_token(args, 4096) * 4096 / 500e12
    params = plan.stage_params(args, 1, 1)
    exposed_pass = comm_model.fsdp_exposed_seconds(params, 8, compute_pass, groups=34)
    assert four["fsdp_s"] == pytest.approx(4 * comm_model.fsdp_seconds(params, 8, groups=34))
    assert four["step_s"] == pytest.approx(4 * (compute_pass + exposed_pass))
    per_pass = plan.memory(args, layout, 1, 4096)
    assert per_pass["activation_bytes"] == pytest.approx(plan.memory(args, layout, 4, 4096)["activation_bytes"] / 4)
    assert plan.train_command("7B", layout, 1, 4096, accum=4).endswith("--training.global_batch_size 32")


def test_plan_accumulates_when_one_pass_does_not_fit():
    """At a global batch whose per-rank share does not fit in one pass, the plan runs it accumulated
    (fitting), where the single pass would not fit; the 7B on 8 GPUs at 128 sequences: 16 per rank."""
    rows = plan.plan("7B", gpus=8, global_batch=128)
    tp1 = next(r for r in rows if (r["strategy"], r["tp"], r["pp"], r["ac"], r["units"]) == ("btp", 1, 1, "none", "block"))
    assert tp1["fits"] and tp1["accum"] > 1 and tp1["batch"] * tp1["accum"] == 16
    single = plan.memory(FLAVORS["7B"], plan.Layout("btp", 1, 1, 8, "none"), 16, 4096)["total_bytes"]
    assert single > 139 * plan.GiB


def test_pipeline_with_fsdp_as_torch_runs_it(monkeypatch, no_host_floor):
    """pp 2 x FSDP 2: torch's pipelining gathers each unit once (during the first microbatch's forward)
    and reduce-scatters the whole stage after the last backward (exposed); the stage's bf16 weights and
    fp32 gradients stay unsharded for the step (6 B per stage parameter)."""
    args = FLAVORS["7B"]
    set_rates(monkeypatch, {"btp": {2: 400.0}})
    monkeypatch.setattr(plan, "_layer_tp_calls", lambda *a: [])
    layout = plan.Layout("btp", 2, 2, 2, "none")
    t = plan.step_time(args, layout, batch=4, seq=4096)
    params, groups = plan.stage_params(args, 2, 2), 16 + 2
    ag = comm_model.collective_seconds("all_gather", params * 2 / groups, 2)
    rs = comm_model.collective_seconds("reduce_scatter", params * 4 / groups, 2)
    assert t["fsdp_s"] == pytest.approx(groups * (ag + rs))  # no re-gather in backward
    slot = last_of_two_stages(args) * 4096 / 2 / 400e12
    exposed = ag + max(0.0, (groups - 1) * ag - slot / 3) + groups * rs
    p2p = 2 * 4096 * 2048  # one sequence of the d-sharded stream (tp 2) in bf16
    assert t["step_s"] == pytest.approx(comm_model.pipeline_step_seconds(slot, 4, 2, p2p) + exposed)
    unsharded = plan.memory(args, layout, 4, 4096)["states_bytes"] - 16 * params / 2
    assert unsharded == pytest.approx(6 * params)


def test_the_step_graph_is_ranked_where_it_applies():
    """By default every layout without pipeline stages is ranked as it is and with the step graph;
    pipeline layouts only without it; the graph variant is never slower, and costs its pool."""
    rows = plan.plan("7B", 8, batch=1)
    key = lambda r: (r["strategy"], r["tp"], r["pp"], r["dp"], r["ac"], r["units"])  # noqa: E731
    flat = {(key(r), r["step_graph"]): r for r in rows}
    for (k, graph), r in flat.items():
        if k[2] == 1:
            assert (k, not graph) in flat
            if graph:
                plain = flat[(k, False)]
                assert r["step_s"] <= plain["step_s"] and r["mem_gib"] > plain["mem_gib"]
        else:
            assert not graph
    assert any(r["step_graph"] for r in rows) and len(rows) > len(plan.plan("7B", 8, batch=1, step_graph=False))


def test_planner_command_line_takes_the_machine(capsys):
    """``python -m boost_titan.planner --gpu a100``: the A100 node's GPUs and memory unless given."""
    from boost_titan.planner.__main__ import main

    main(["--gpu", "a100", "--flavor", "1B", "--top", "2"])
    out = capsys.readouterr().out
    assert "1B on 4 GPUs (A100, 79 GiB), local batch 4 x 4096" in out and "NGPU=4 ./scripts/run_train.sh" in out
    main(["--flavor", "1B", "--gpus", "2", "--gpu-mem", "40", "--top", "1"])
    assert "1B on 2 GPUs (H200, 40 GiB)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--gpu", "b200"])
    assert "invalid choice: 'b200'" in capsys.readouterr().err


def test_equal_predictions_rank_the_simpler_layout_first():
    """A checkpointing mode that changes nothing predicts the same time as none; the last bit of that time
    may differ between Python versions (3.12's compensated ``sum``), which must not change the ranking."""
    rows = [r for r in plan.plan("13B", 4, nodes=64, global_batch=64, gpu="a100")
            if r["fits"] and r["strategy"] == "btp" and (r["tp"], r["pp"], r["units"], r["step_graph"]) == (4, 1, "block", False)]
    # host-bound: every checkpointing mode takes the host's time (to the last bit or so, by Python version)
    assert [r["ac"] for r in rows] == ["none", "budget", "lowrank", "full"]
    assert rows[0]["tokens_per_s_gpu"] == pytest.approx(rows[-1]["tokens_per_s_gpu"], rel=1e-15)
    one_bit_slower = [dict(r, tokens_per_s_gpu=r["tokens_per_s_gpu"] * (1 - 2**-52)) if r["ac"] == "none" else r
                      for r in rows]
    assert sorted(one_bit_slower, key=plan.ranking)[0]["ac"] == "none"
