"""An α–β model of a training step's communication on one 8-GPU NVSwitch node (PREDICTED numbers).

What is counted comes from the real model (:func:`boost_titan.planner.collectives.model_collectives`:
every TP collective of forward and backward, and the rank's parameter count); what a collective
costs comes from public NCCL measurements, not from this project (no multi-GPU machine was lent):

* ``bus_bw`` 370 GB/s: NCCL's bus bandwidth on NVLink 4 (H100/H200, 450 GB/s line rate per
  direction) once protocol overhead is paid, with the ring algorithm, i.e. without NVLink SHARP
  (NVLS), which is off on the lent machines. NCCL maintainers quote ~370 GB/s for ring and for
  non-all-reduce collectives (NVIDIA/nccl-tests#212); users measure 368.8 GB/s with NVLS disabled
  (NVIDIA/nccl-tests#309).
* ``alpha_s`` 15 µs: the fixed cost of one collective launched from PyTorch without CUDA graphs
  (nccl-tests shows single-digit µs with graphs, NCCL's tuner estimates ~25 µs for tiny ring
  all-reduces on H100 nodes: NVIDIA/nccl#1453, #1984); it matters only for the small collectives.

Time of one collective over ``t`` ranks on a tensor of ``n`` bytes (the full tensor: the
all-reduce's input, the all-gather's output, the reduce-scatter's input), NCCL's bus-bandwidth
convention: all-reduce ``α + 2(t−1)/t · n / bus_bw``; all-gather, reduce-scatter ``α + (t−1)/t · n / bus_bw``;
point-to-point ``α + n / bus_bw``. Mid-size messages reach less than the peak: inside a node the bus
bandwidth follows a measured curve of NCCL's ring on 8 NVLink-4 GPUs (``NVLINK_RING_CURVE``: ≈ 240 GB/s
at 16 MiB, 300 at 32 MiB, 335 at 128 MiB, 370 from 1 GiB; nccl-tests ``all_reduce_perf`` with
``NCCL_ALGO=Ring`` on H100 nodes, e.g. IBM/pytorch-communication-benchmarks#1), interpolated in
log-size and extended below 16 MiB with its first segment's slope; the α term is charged as well.
BTP's 7B all-reduces are 32–96 MiB at b 4 and 8–24 MiB at b 1, where the curve matters.

Which time is exposed (on the critical path of the step):

* TP collectives of btp, vanilla and Megatron+SP: all of them, except what the GEMMs issued while
  a collective is in flight can hide. Every strategy's backward issues the collective of a GEMM
  input's gradient (btp: the bottleneck all-reduce; vanilla: the A input's all-reduce; Megatron:
  the column-parallel input's reduce-scatter) before that GEMM's weight-gradient GEMM and waits after
  it (``boost_titan.ops.gemm``); the recorder counts those GEMM FLOPs per collective
  (``Collective.overlap_flops``, from the code's real order). Hidden: ``min(t_collective, flops /
  OVERLAP_GEMM_FLOPS)``, an ideal overlap (NCCL's kernels take SMs from the GEMM on a real node, so
  this is a lower bound on the exposed time). Forward collectives are waited for by the next kernel.
* FSDP2's all-gathers and reduce-scatters: prefetched and overlapped with compute, phase by phase
  (``fsdp_exposed_seconds``; pipeline stages: ``pipeline_fsdp_exposed_seconds``).
* Pipeline parallelism (1F1B, ``m`` microbatches, ``p`` stages): the step takes ``m + p − 1`` stage
  slots instead of ``m`` (the bubble), plus one activation send each way per slot.

Several nodes (:class:`Cluster`): torchtitan numbers ranks with tp innermost, then dp, then pp, so a
group of ``k`` ranks ``stride`` apart (tp: stride 1; FSDP: stride tp; pipeline neighbours: stride
tp·dp) either lies inside one node (NVLink, as above) or spans nodes. Across nodes NCCL's ring enters
and leaves every node once per channel, and with one 400 Gb/s NIC per GPU (rail-optimised H100 /
H200 nodes) its channels spread over the NICs of the group's ranks on each node: the ring's bus
bandwidth is ``min(NVLink bus_bw, NICs used per node × NIC bandwidth)`` (NCCL's ring keeps every
NIC busy at once; e.g. tp 8 inside the node leaves each dp group one GPU, so one NIC, per node), at
each message size no more than NVLink's curve gives it (the ring crosses NVLink inside every node).
Its latency is the network's, measured between two nodes, and grows with the ring's length as NCCL's
own tuner charges it (``src/graph/tuning.cc``: a ring collective pays a per-step latency for each of
its inter-node steps, ``2(N−1)`` for an all-reduce over N nodes, ``N−1`` for an all-gather or a
reduce-scatter): ``hop_s`` per inter-node step beyond the two-node ring the α was measured on. An
all-reduce over many nodes may run NCCL's tree instead (latency growing with log N): there the
ring's latency is an upper bound.

* ``nic_bw`` 47 GB/s: one NDR 400 Gb/s InfiniBand NIC under NCCL ("For NDR @ 400Gbps you should see
  46-48GB/s per NIC", an NCCL maintainer, NVIDIA/nccl-tests#290); the same rule gives 100 GB/s for 8
  A100s with 4 HDR NICs, where users measure 85–96 (NVIDIA/nccl-tests#119).
* ``alpha_s`` 20 µs: an 8-byte all-reduce between two nodes (nccl-tests prints 19–20 µs, A100, HDR;
  NVIDIA/nccl-tests#150).
* ``hop_s``: NCCL's own tuner's latency per inter-node step of a ring with its Simple protocol
  (``hwLat[NCCL_HW_NET][Ring][Simple]``, NVIDIA/nccl ``src/graph/tuning.cc``), the protocol of the
  large messages (FSDP's units, BTP's all-reduces) for which a long ring's latency matters; the
  value is quoted in docs/design.md, "Communication volume".

No rail-crossing (PXN), SHARP or congestion from other jobs is modelled; pipeline sends between
nodes are point-to-point at one NIC's bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from boost_titan.planner.collectives import Collective

MiB = 2**20
# (message bytes, bus bandwidth) of NCCL's ring all-reduce on 8 NVLink-4 GPUs (see the module docstring)
NVLINK_RING_CURVE = ((16 * MiB, 240e9), (32 * MiB, 300e9), (128 * MiB, 335e9), (1024 * MiB, 370e9))


@dataclass(frozen=True)
class Interconnect:
    alpha_s: float = 15e-6
    bus_bw: float = 370e9  # the large-message asymptote
    name: str = "8x H200 SXM, NVSwitch (NVLink 4), NCCL ring, NVLink SHARP off"
    curve: tuple = ()  # (bytes, bus bandwidth) points below the asymptote; empty: bus_bw at every size
    nodes: int = 1  # the nodes a ring on this link spans
    hop_s: float = 0.0  # latency per inter-node ring step beyond a two-node ring's (alpha_s holds those)

    def alpha_at(self, kind: str) -> float:
        """The fixed cost of one ``kind`` collective on this link: ``alpha_s``, plus ``hop_s`` for each
        inter-node step of the ring beyond a two-node ring's (all-reduce 2(N−1), all-gather and
        reduce-scatter N−1, point-to-point none)."""
        if self.nodes <= 2 or kind == "p2p":
            return self.alpha_s
        steps_per_node = 2 if kind == "all_reduce" else 1
        return self.alpha_s + self.hop_s * steps_per_node * (self.nodes - 2)

    def bus_bw_at(self, nbytes: float) -> float:
        """The bus bandwidth a message of ``nbytes`` reaches: ``curve`` interpolated in log-size (its first
        segment extended below the first point), ``bus_bw`` from the last point on."""
        if not self.curve or nbytes >= self.curve[-1][0]:
            return self.bus_bw
        # the segment holding nbytes; below the curve, the first one
        (n0, b0), (n1, b1) = next((p, q) for p, q in zip(self.curve, self.curve[1:]) if nbytes < q[0])
        slope = math.log(b1 / b0) / math.log(n1 / n0)
        return min(self.bus_bw, b0 * (max(nbytes, 1.0) / n0) ** slope)


H200_NODE = Interconnect(curve=NVLINK_RING_CURVE)


@dataclass(frozen=True)
class Network:
    """Between nodes: ``nics_per_gpu`` NICs of ``nic_bw`` per GPU (0.5: one NIC per two GPUs)."""

    alpha_s: float = 20e-6
    nic_bw: float = 47e9
    nics_per_gpu: float = 1.0
    name: str = "400 Gb/s NDR InfiniBand, one NIC per GPU, NCCL ring"
    hop_s: float = 14e-6


NDR_IB = Network()

# BOOST's published setting: nodes of 4 A100 80GB SXM with NVLink 3 and one NIC per GPU. The ring's
# mid-size ramp is taken to be NVLink 4's, scaled to the A100's bus bandwidth, and a NIC gives the same
# share of its line rate as NDR does; each value's source: docs/design.md, "The planner's machines".
A100_NODE = Interconnect(bus_bw=230e9, name="4x A100 SXM, NVLink 3, NCCL ring",
                         curve=tuple((n, bw * 230 / 370) for n, bw in NVLINK_RING_CURVE))
HDR_200 = Network(nic_bw=23.5e9, name="200 Gb/s (HDR InfiniBand / Slingshot 11), one NIC per GPU, NCCL ring")


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` GPUs: NVLink inside (``node``), ``network`` between them.
    ``rate_scale``: the GPU's compute rate relative to the H200 the per-rank rates were measured on."""

    nodes: int = 1
    gpus_per_node: int = 8
    node: Interconnect = H200_NODE
    network: Network = NDR_IB
    rate_scale: float = 1.0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def nodes_spanned(self, ranks: int, stride: int) -> int:
        """How many nodes a group of ``ranks`` ranks, ``stride`` apart (from rank 0), touches."""
        return len({(i * stride) // self.gpus_per_node for i in range(ranks)})

    def link(self, ranks: int, stride: int) -> Interconnect:
        """What a collective over that group runs on: NVLink inside one node, else the NICs of its ranks."""
        spanned = self.nodes_spanned(ranks, stride)
        if spanned <= 1:
            return self.node
        per_node = ranks // spanned  # the group's ranks on each node
        cap = per_node * self.network.nics_per_gpu * self.network.nic_bw
        # the ring also crosses NVLink inside each node: no message size runs faster than it does there
        curve = tuple((n, min(bw, cap)) for n, bw in self.node.curve)
        return Interconnect(self.network.alpha_s, min(self.node.bus_bw, cap),
                            f"{spanned} nodes x {per_node} GPUs: {self.network.name}", curve, spanned,
                            self.network.hop_s)


    def p2p_link(self, stages: int, stride: int) -> Interconnect:
        """Pipeline sends between neighbouring stages ``stride`` ranks apart: one GPU's NIC(s) once any
        two neighbours sit on different nodes (1F1B's slots wait for the slowest send)."""
        if self.nodes_spanned(stages, stride) <= 1:
            return self.node
        bw = min(self.node.bus_bw, self.network.nics_per_gpu * self.network.nic_bw)
        return Interconnect(self.network.alpha_s, bw, f"pipeline sends over {self.network.name}")

    def crossing(self, tp: int, dp: int, pp: int, rep: int = 1) -> list[str]:
        """The parallel dimensions whose groups span nodes (ranks: tp innermost, then the dp shards,
        the HSDP replicas, then pp); ``dp``: the shard degree."""
        groups = {"tp": (tp, 1), "dp": (dp, tp), "rep": (rep, tp * dp), "pp": (pp, tp * dp * rep)}
        return [dim for dim, (k, stride) in groups.items() if k > 1 and self.nodes_spanned(k, stride) > 1]


ONE_NODE = Cluster()

# The machines the planner knows: GiB per GPU usable, GPUs per node, links, and the rate scale. The
# A100's is its dense bf16 peak over the H200's: the same share of peak as measured on the H200
# (docs/design.md, "The planner's machines", gives the peaks and checks the scale against BOOST's).
GPUS = {
    "h200": {"mem_gib": 139.0, "gpus_per_node": 8, "node": H200_NODE, "network": NDR_IB, "rate_scale": 1.0},
    "a100": {"mem_gib": 79.0, "gpus_per_node": 4, "node": A100_NODE, "network": HDR_200, "rate_scale": 312 / 989},
}


def cluster_of(gpu: str, nodes: int = 1, gpus_per_node: int | None = None) -> Cluster:
    """A cluster of ``nodes`` nodes of the machine ``gpu`` (a key of :data:`GPUS`)."""
    if gpu not in GPUS:
        raise ValueError(f"gpu={gpu!r} is unknown; choose one of {', '.join(GPUS)}")
    spec = GPUS[gpu]
    return Cluster(nodes, gpus_per_node or spec["gpus_per_node"], spec["node"], spec["network"], spec["rate_scale"])


# The rate of the weight-gradient GEMMs that run beside a backward collective (docs/design.md,
# "Host time", says where it was measured).
OVERLAP_GEMM_FLOPS = 600e12


def full_bytes(c: Collective) -> int:
    n = c.itemsize
    for s in c.shape:
        n *= s
    return n


def collective_seconds(kind: str, nbytes: float, ranks: int, link: Interconnect = H200_NODE) -> float:
    """α–β time of one collective over ``ranks`` ranks on a full tensor of ``nbytes``."""
    if ranks == 1:
        return 0.0
    factor = {"all_reduce": 2 * (ranks - 1) / ranks, "all_gather": (ranks - 1) / ranks,
              "reduce_scatter": (ranks - 1) / ranks, "p2p": 1.0}[kind]
    return link.alpha_at(kind) + factor * nbytes / link.bus_bw_at(nbytes)


def tp_seconds(calls: list[Collective], tp: int, link: Interconnect = H200_NODE,
               overlap_rate: float = OVERLAP_GEMM_FLOPS) -> float:
    """Exposed TP communication of one step: every collective, one after another, less what the GEMMs
    in flight beside it hide (``overlap_rate`` 0: nothing hidden)."""
    def exposed(c: Collective) -> float:
        t = collective_seconds(c.kind, full_bytes(c), tp, link)
        return t - min(t, c.overlap_flops / overlap_rate) if overlap_rate else t
    return sum(exposed(c) for c in calls)


def _fsdp_unit_seconds(local_params: int, dp: int, link: Interconnect, groups: int, param_bytes: int,
                       grad_bytes: int) -> tuple[float, float]:
    """(all-gather, reduce-scatter) seconds of one of ``groups`` equal FSDP units: each unit's message
    is read at its own size on the bandwidth curve, with its own α."""
    return (collective_seconds("all_gather", local_params * param_bytes / groups, dp, link),
            collective_seconds("reduce_scatter", local_params * grad_bytes / groups, dp, link))


def fsdp_seconds(local_params: int, dp: int, link: Interconnect = H200_NODE, groups: int = 1,
                 param_bytes: int = 2, grad_bytes: int = 4, regather_in_backward: bool = True) -> float:
    """FSDP2 traffic of one step for a rank holding ``local_params`` (its TP shards) before FSDP:
    all-gather of the bf16 parameters in forward (again in backward when resharded after forward)
    and reduce-scatter of the fp32 gradients, in ``groups`` equal FSDP units."""
    if dp == 1:
        return 0.0
    ag, rs = _fsdp_unit_seconds(local_params, dp, link, groups, param_bytes, grad_bytes)
    return groups * ((2 if regather_in_backward else 1) * ag + rs)


def fsdp_exposed_seconds(local_params: int, dp: int, compute_s: float, link: Interconnect = H200_NODE,
                         groups: int = 1, param_bytes: int = 2, grad_bytes: int = 4) -> float:
    """The part of FSDP2's traffic that compute cannot hide, phase by phase.

    One unit (``groups`` 1, the root's group kept unsharded from forward into backward) gathers before
    forward and reduce-scatters after backward: all of it is exposed. Per-block units prefetch the next
    unit while the current one computes: in forward the first all-gather cannot hide and the others
    hide under the forward (a third of the compute); in backward the re-gathers and all reduce-scatters
    but the last hide under the backward (two thirds), and the last reduce-scatter, after the last
    gradient, cannot.
    """
    if dp == 1:
        return 0.0
    if groups == 1:
        return fsdp_seconds(local_params, dp, link, 1, param_bytes, grad_bytes, regather_in_backward=False)
    ag, rs = _fsdp_unit_seconds(local_params, dp, link, groups, param_bytes, grad_bytes)
    forward = ag + max(0.0, (groups - 1) * ag - compute_s / 3)
    backward = rs + max(0.0, groups * ag + (groups - 1) * rs - 2 * compute_s / 3)
    return forward + backward


def pipeline_fsdp_exposed_seconds(local_params: int, dp: int, microbatch_compute_s: float,
                                  link: Interconnect = H200_NODE, groups: int = 1, param_bytes: int = 2,
                                  grad_bytes: int = 4) -> float:
    """FSDP2 under torch's pipelining, which turns resharding and gradient sync off between microbatches:
    each unit is gathered once, during the first microbatch's forward (all but the first gather hide
    under that forward, a third of the microbatch's compute), and the whole stage is reduce-scattered
    after the last backward, where nothing is left to hide it."""
    if dp == 1:
        return 0.0
    ag, rs = _fsdp_unit_seconds(local_params, dp, link, groups, param_bytes, grad_bytes)
    return ag + max(0.0, (groups - 1) * ag - microbatch_compute_s / 3) + groups * rs


def replica_all_reduce_seconds(shard_params: float, replicas: int, link: Interconnect, groups: int = 1,
                               grad_bytes: int = 4) -> float:
    """HSDP: every unit's fp32 gradient shard all-reduced across the replicas, one message per unit."""
    return groups * collective_seconds("all_reduce", shard_params * grad_bytes / groups, replicas, link)


def replica_all_reduce_exposed_seconds(shard_params: float, replicas: int, compute_s: float, link: Interconnect,
                                       groups: int = 1, grad_bytes: int = 4) -> float:
    """HSDP's all-reduces run on their own link (the network), beside the node's FSDP traffic: each
    follows its unit's reduce-scatter and hides under the backward (two thirds of the compute), except
    the last, which follows the last reduce-scatter."""
    per_unit = collective_seconds("all_reduce", shard_params * grad_bytes / groups, replicas, link)
    if groups == 1:
        return per_unit
    return per_unit + max(0.0, (groups - 1) * per_unit - 2 * compute_s / 3)


def pipeline_step_seconds(stage_slot_s: float, microbatches: int, stages: int, p2p_bytes: float = 0.0,
                          link: Interconnect = H200_NODE) -> float:
    """1F1B: ``m + p − 1`` slots of the slowest stage's per-microbatch time (forward + backward, with
    its TP communication), each slot also waiting for one activation (forward) and one gradient
    (backward) transfer of ``p2p_bytes``."""
    if stages == 1:
        return microbatches * stage_slot_s
    slots = microbatches + stages - 1
    return slots * (stage_slot_s + 2 * collective_seconds("p2p", p2p_bytes, 2, link))


@dataclass
class StepPrediction:
    compute_s: float  # the rank's compute (emulated: measured on one GPU with free collectives)
    tp_s: float  # exposed TP communication
    fsdp_s: float  # FSDP traffic, overlapped with compute
    step_s: float  # predicted step time

    @property
    def fsdp_exposed_s(self) -> float:
        return max(0.0, self.fsdp_s - self.compute_s)


def predict_step(compute_s: float, tp_s: float, fsdp_s: float) -> StepPrediction:
    """Without pipeline parallelism: compute + exposed TP + what of FSDP does not fit under compute."""
    return StepPrediction(compute_s, tp_s, fsdp_s, compute_s + tp_s + max(0.0, fsdp_s - compute_s))
