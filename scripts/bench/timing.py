"""Timing on the GPU: CUDA events, interleaved rounds (so clock and temperature drift fall on every
candidate alike), and the measured bf16 GEMM ceiling."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

H200_DATASHEET_BF16_TFLOPS = 989.0  # dense bf16, no sparsity



def cuda_time_ms(
    fn: Callable[[], object],
    warmup: int = 5,
    repeats: int = 20,
    use_graph: bool = False,
    device: torch.device | str | None = None,
) -> float:
    """Median wall time of ``fn()`` in milliseconds; the warm-up calls are excluded.

    On CUDA each repeat is bracketed by a pair of CUDA events. With ``use_graph=True`` the calls in
    ``fn`` are captured once into a CUDA graph and the graph is replayed, so that the time is the
    GPU's time alone (no Python/launch overhead between small kernels). ``fn`` must then be
    capturable (fixed shapes, preallocated outputs, no host syncs). On CPU (or when CUDA is absent)
    it times with ``time.perf_counter``.
    """
    return interleaved_time_ms({"fn": fn}, warmup, repeats, rounds=1, use_graph=use_graph, device=device)["fn"]


def interleaved_time_ms(
    fns: dict[str, Callable[[], object]],
    warmup: int = 5,
    repeats: int = 10,
    rounds: int = 5,
    use_graph: bool = False,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Median time (ms) of each of several functions, timed in ``rounds`` interleaved rounds.

    Each round times every function ``repeats`` times in turn, so clock and thermal drift (which
    moves an H200's GEMM throughput by several percent within a minute: docs/results/clocks_h200.md) falls on all
    of them alike instead of
    on whichever ran last. Timing as in :func:`cuda_time_ms`; graphs are captured once, up front.
    """
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    cuda = device.type == "cuda"
    runs, graphs = {}, []
    for name, fn in fns.items():
        runs[name] = fn
        if cuda and use_graph:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # warm up (cuBLAS handles, workspaces) before capture
                for _ in range(max(warmup, 1)):
                    fn()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            graphs.append(graph)
            runs[name] = graph.replay
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for run in runs.values():
        for _ in range(warmup):
            run()
    for _ in range(rounds):
        for name, run in runs.items():
            if not cuda:
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    run()
                    samples[name].append((time.perf_counter() - t0) * 1e3)
                continue
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
            for start, end in zip(starts, ends):
                start.record()
                run()
                end.record()
            torch.cuda.synchronize(device)
            samples[name] += [a.elapsed_time(b) for a, b in zip(starts, ends)]
    del graphs
    return {name: statistics.median(v) for name, v in samples.items()}


class PeakGemm:
    """The reference matmul roofline: an ``n³`` product on random data (call it to run it once).

    bf16 on CUDA (n = 8192, the reference roofline); on CPU fp32 with n capped at ``cpu_n`` (only to
    give the smoke tests a meaningful denominator). Time it alone (:func:`measured_bf16_peak_tflops`)
    or among the functions it is a ceiling for (:func:`interleaved_time_ms`), then :meth:`tflops`.
    """

    def __init__(self, device: torch.device | str = "cuda", n: int = 8192, cpu_n: int = 256):
        device = torch.device(device)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        n = n if device.type == "cuda" else min(n, cpu_n)
        self.a, self.b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        self.out = torch.empty_like(self.a)
        self.n, self.flops = n, 2 * n**3

    def __call__(self) -> torch.Tensor:
        return torch.mm(self.a, self.b, out=self.out)

    def tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e-3) / 1e12


def measured_bf16_peak_tflops(
    device: torch.device | str = "cuda", n: int = 8192, warmup: int = 5, repeats: int = 20
) -> float:
    """Measured matmul ceiling in TFLOP/s: median time of :class:`PeakGemm` timed alone."""
    peak = PeakGemm(device, n, cpu_n=1024)
    return peak.tflops(cuda_time_ms(peak, warmup, repeats, device=device))
