"""Shared code of the benchmarks: timing (CUDA events, interleaved rounds), GEMM ceilings, profiler-trace
buckets, plots, and the result files (environment record, markdown tables, ``<out>.json`` + ``<out>.md``).

Every benchmark (``python -m scripts.bench.<name>``) records
:func:`env_info` (date, hardware, versions, commit, exact command) in its meta, writes through
:func:`write_results` and prints a short table last.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from boost_titan.planner.table import format_table

__all__ = ["format_table"]  # re-exported: the benchmarks' tables are the planner's


def _git_rev() -> str | None:
    """``<short sha>[-dirty]`` of the checkout; ``BOOST_GIT_REV`` wins (a run from a ``git archive``
    snapshot has no .git of its own); None when unknown."""
    if os.environ.get("BOOST_GIT_REV"):
        return os.environ["BOOST_GIT_REV"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return rev + ("-dirty" if dirty else "") if rev else None
    except (OSError, subprocess.SubprocessError):
        return None


def env_info(device: torch.device | str | None = None) -> dict:
    """Date, hardware, software versions and the exact command line of this run."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    try:
        import triton  # noqa: PLC0415

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional (absent on CPU wheels)
        triton_version = None
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": name,
        "device_type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "python": platform.python_version(),
        "git": _git_rev(),
        "command": shlex.join(["python", *sys.argv]),
    }


def print_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> None:
    print(format_table(rows, columns), end="", flush=True)


def write_results(
    out_prefix: str,
    rows: list[dict],
    meta: dict,
    title: str,
    columns: Sequence[str] | None = None,
    sections: Iterable[tuple] = (),
    notes: str = "",
) -> tuple[str, str]:
    """Write ``<out_prefix>.json`` and ``<out_prefix>.md``; returns both paths.

    ``sections`` are extra ``(heading, rows, columns)`` or ``(heading, rows, columns, note)`` tables placed
    before the full ``rows`` table (in the JSON under ``sections``, by heading; a note is markdown printed
    under its heading); ``notes`` is free markdown placed after the meta block.
    """
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    json_path, md_path = out_prefix + ".json", out_prefix + ".md"
    sections = list(sections)
    data = {"title": title, "meta": meta, "rows": rows}
    if sections:
        data["sections"] = {heading: list(sec_rows) for heading, sec_rows, *_ in sections}
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1, default=str)
    md = [f"# {title}", ""]
    md += [f"- **{k}**: `{v}`" if k == "command" else f"- **{k}**: {v}" for k, v in meta.items()]
    md.append("")
    if notes:
        md += [notes.strip(), ""]
    for heading, sec_rows, sec_cols, *sec_note in sections:
        md += [f"## {heading}", ""] + [n.strip() + "\n" for n in sec_note] + [format_table(sec_rows, sec_cols)]
    md += ["## All rows", "", format_table(rows, columns)]
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    return json_path, md_path


# ---- timing, ceilings, traces, plots ----------------------------------------------------------
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


def doc_notes(doc: str) -> str:
    """A script's docstring minus its title line and its indented usage lines: the notes of its results."""
    paragraphs = doc.strip().split("\n\n")[1:]
    return "\n\n".join(p for p in paragraphs if not p.startswith("    "))


def pyplot():
    """``matplotlib.pyplot`` with the file-only Agg backend, or None (with a note) where it is missing."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib not importable: skipping the plot", file=sys.stderr)
        return None
    return plt




KERNEL_BUCKETS = [("attention", ("fmha", "flash", "cudnn", "attention", "sdpa")),
                  ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "matmul")),
                  ("optimizer", ("adam", "multi_tensor", "foreach")),
                  ("fused elementwise (triton)", ("triton",))]


def bucket(kernel_name: str) -> str:
    """The kind of a GPU kernel, from its name: attention, gemm, optimizer, fused elementwise, other."""
    low = kernel_name.lower()
    for label, keys in KERNEL_BUCKETS:
        if any(k in low for k in keys):
            return label
    return "other"


def bucket_rows(variant: str, buckets: dict[str, float]) -> list[dict]:
    """Table rows of one variant's GPU time per bucket (largest first), then its total."""
    total = sum(buckets.values())
    rows = [{"variant": variant, "bucket": b, "ms_per_step": t, "share_pct": 100 * t / total if total else 0.0}
            for b, t in sorted(buckets.items(), key=lambda kv: -kv[1])]
    return rows + [{"variant": variant, "bucket": "TOTAL (GPU busy)", "ms_per_step": total, "share_pct": 100.0}]


def _trace_events(trace_path: str | Path) -> list[dict]:
    events = json.loads(Path(trace_path).read_text())
    return events.get("traceEvents", []) if isinstance(events, dict) else events


def _step_gpu_events(events: list[dict]) -> list[dict]:
    """The GPU events (kernels, memcpys, memsets) of the traced steps: those whose launch the trace
    recorded inside a ``ProfilerStep#N`` annotation. A loop that never waits for the GPU starts a
    step's host work while the previous step's kernels still run; the profiler records those kernels,
    but their launches came before its window opened: that step's work, not this one's. A trace
    without step annotations or launch records: all of them."""
    gpu = [e for e in events if e.get("cat") in _GPU_CATS and e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    if not steps or not launched:
        return gpu
    in_step = lambda t: t is not None and any(a <= t <= b for a, b in steps)  # noqa: E731
    return [e for e in gpu if in_step(launched.get(e.get("args", {}).get("correlation")))]


def trace_buckets(trace_path: str | Path, steps: int = 1) -> dict[str, float]:
    """GPU time per step (ms) by :func:`bucket`: kernels, memcpys and memsets of a torch profiler chrome
    trace of ``steps`` steps (host-side events are not GPU time; :func:`_step_gpu_events`)."""
    out = defaultdict(float)
    for e in _step_gpu_events(_trace_events(trace_path)):
        out[bucket(e.get("name", ""))] += e.get("dur", 0) / 1e3 / steps  # µs -> ms
    return dict(out)


def _kernels_by_name(kernels: list[dict]) -> dict[str, tuple[int, float]]:
    """name → (calls, total ms) of GPU events."""
    by_name = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        by_name[e.get("name", "")][0] += 1
        by_name[e.get("name", "")][1] += e.get("dur", 0) / 1e3
    return {name: (c, ms) for name, (c, ms) in by_name.items()}


def trace_top_kernels(trace_path: str | Path, n: int = 20) -> list[dict]:
    """The ``n`` kernels (by name) with the most GPU time in a trace: calls, total ms, bucket; and a last
    row with the GPU's busy time against the span from the first kernel's start to the last one's end
    (``idle_ms``: gaps between kernels, i.e. time the GPU waited for the host)."""
    kernels = _step_gpu_events(_trace_events(trace_path))
    by_name = _kernels_by_name(kernels)
    rows = [{"kernel": name[:90], "bucket": bucket(name), "calls": c, "ms": ms}
            for name, (c, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:n]]
    if kernels:
        busy = sum(e.get("dur", 0) for e in kernels) / 1e3
        span = (max(e["ts"] + e.get("dur", 0) for e in kernels) - min(e["ts"] for e in kernels)) / 1e3
        rows.append({"kernel": f"ALL ({len(kernels)} kernels): busy {busy:.1f} ms of a {span:.1f} ms span",
                     "bucket": "", "calls": len(kernels), "ms": busy, "idle_ms": span - busy})
    return rows


def trace_kernel_diff(base_trace: str | Path, other_trace: str | Path) -> list[dict]:
    """The same traced step in two runs, kernel name by kernel name: calls, total ms and mean µs in each,
    and ``mean_ratio`` (base / other; > 1: the kernel ran longer in the base run), largest time
    difference first. Equal calls with one common ratio across kernels points at the clock, not the code."""
    base, other = (_kernels_by_name(_step_gpu_events(_trace_events(t))) for t in (base_trace, other_trace))
    rows = []
    for name in base.keys() | other.keys():
        (bc, bms), (oc, oms) = base.get(name, (0, 0.0)), other.get(name, (0, 0.0))
        b_mean, o_mean = 1e3 * bms / bc if bc else None, 1e3 * oms / oc if oc else None
        rows.append({"kernel": name[:90], "bucket": bucket(name), "base_calls": bc, "base_ms": bms,
                     "base_mean_us": b_mean, "other_calls": oc, "other_ms": oms, "other_mean_us": o_mean,
                     "mean_ratio": b_mean / o_mean if b_mean and o_mean else None})
    return sorted(rows, key=lambda r: -abs(r["base_ms"] - r["other_ms"]))


# host calls that block until the GPU has caught up. Not cudaMemcpyAsync: it also carries every
# device-to-device copy, which blocks nothing; PyTorch's blocking copies (.item(), .to() without
# non_blocking) follow it with a cudaStreamSynchronize, which is listed.
HOST_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyDtoH")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def _enclosing(events: list[dict], queries: list[tuple[float, object]]) -> dict:
    """For each ``(time, key)`` query: the chain (outermost first) of one thread's nested host events
    open at that time. One sweep over the events in start order with a stack (a thread's events nest)."""
    out, stack, i = {}, [], 0
    for t, key in sorted(queries, key=lambda q: q[0]):
        while i < len(events) and events[i]["ts"] <= t:
            while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) < events[i]["ts"]:
                stack.pop()
            stack.append(events[i])
            i += 1
        out[key] = [e for e in stack if e["ts"] + e.get("dur", 0) >= t]
    return out


def _op_label(chain: list[dict]) -> str:
    """``outer > inner`` names of the host ops in a chain, leaving out profiler steps and CUDA calls."""
    names = [e["name"] for e in chain if e.get("cat") in ("cpu_op", "user_annotation")
             and not e["name"].startswith("ProfilerStep")]
    if not names:
        return "(no host op)"
    return names[0] if len(names) == 1 else f"{names[0]} > {names[-1]}"


def trace_gaps(trace_path: str | Path, min_us: float = 10.0, n: int = 12) -> list[dict]:
    """Where the GPU waited for the host in a torch profiler trace, grouped by host cause.

    A gap is an interval between two kernels (all streams merged) in which nothing ran on the GPU, of
    at least ``min_us``. The kernel that ends it was launched by some host op (found through the
    launch's correlation id): ``launched_by`` names the outermost and innermost ops around that launch.
    ``after_sync`` names the host op around a blocking call (``HOST_SYNCS``) that returned during the
    gap or just before it: the host had waited for the GPU to drain, so the gap is the host's time from
    there to the next launch. Rows (largest idle time first, at most ``n``, then a total): gaps, idle
    ms, the largest gap.
    """
    events = _trace_events(trace_path)
    gpu = sorted(_step_gpu_events(events), key=lambda e: e["ts"])
    launches, threads = {}, defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in _HOST_CATS:
            continue
        threads[(e.get("pid"), e.get("tid"))].append(e)
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e
    gaps, end = [], None
    for e in gpu:
        if end is not None and e["ts"] - end >= min_us:
            gaps.append((end, e))
        end = e["ts"] + e.get("dur", 0) if end is None else max(end, e["ts"] + e.get("dur", 0))
    syncs = sorted((e for ev in threads.values() for e in ev
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in HOST_SYNCS),
                   key=lambda e: e["ts"] + e.get("dur", 0))
    queries = defaultdict(list)  # thread -> [(time, key)]
    found = []
    for k, (start, kernel) in enumerate(gaps):
        launch = launches.get(kernel.get("args", {}).get("correlation"))
        if launch is not None:
            queries[(launch.get("pid"), launch.get("tid"))].append((launch["ts"], ("launch", k)))
        stop = kernel["ts"] if launch is None else min(kernel["ts"], launch["ts"])
        sync = next((s for s in reversed(syncs) if start - 5 <= s["ts"] + s.get("dur", 0) <= stop), None)
        if sync is not None:
            queries[(sync.get("pid"), sync.get("tid"))].append((sync["ts"], ("sync", k)))
        found.append((start, kernel, launch, sync))
    chains = {}
    for thread, qs in queries.items():
        ordered = sorted(threads[thread], key=lambda e: (e["ts"], -e.get("dur", 0)))
        chains.update(_enclosing(ordered, qs))
    groups = defaultdict(lambda: [0, 0.0, 0.0])
    for k, (start, kernel, launch, sync) in enumerate(found):
        key = (_op_label(chains[("sync", k)]) if sync is not None else "",
               _op_label(chains[("launch", k)]) if launch is not None else "(launch not traced)")
        idle = (kernel["ts"] - start) / 1e3
        groups[key][0] += 1
        groups[key][1] += idle
        groups[key][2] = max(groups[key][2], idle)
    rows = [{"after_sync": s, "launched_by": launcher, "gaps": c, "idle_ms": ms, "max_ms": mx}
            for (s, launcher), (c, ms, mx) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:n]]
    total = sum(g[1] for g in groups.values())
    return rows + [{"after_sync": "", "launched_by": f"ALL gaps >= {min_us:g} us", "gaps": len(found),
                    "idle_ms": total, "max_ms": max((g[2] for g in groups.values()), default=0.0)}]


# Host-side kinds of work in a torch profiler trace, by event name (first match wins). An event's own
# time (its duration less its children's) counts for the kind of the nearest event, itself included,
# that has one: a kernel launch inside a compiled graph counts as "compiled graphs".
HOST_KINDS = (
    ("compiled graphs (inductor code: kernel launches)", ("## Call CompiledFxGraph",)),
    ("compiled-region wrappers (dynamo guards, AOTAutograd)",
     ("Torch-Compiled Region", "CompiledFunction", "TorchDynamo Cache Lookup", "AOTDispatcher", "Pregraph bytecode")),
    ("FSDP2 hooks, copy-in/out, collectives", ("FSDP::", "RegisterPostBackwardFunction", "PostBackwardFunction",
                                              "PreBackwardFunction")),
    ("gradient accumulation (AccumulateGrad)", ("torch::autograd::AccumulateGrad",)),
    ("optimizer step", ("Optimizer.step", "Optimizer.zero_grad")),
    ("gradient clipping", ("boost::clip_grad_norm",)),
    ("DTensor redistribute", ("Redistribute",)),
)
_UNKINDED = "other ops (eager ops outside compiled regions, autograd engine)"


def _host_kind(name: str) -> str | None:
    return next((kind for kind, prefixes in HOST_KINDS if name.startswith(prefixes)), None)


def _close_host_event(stack: list, own: dict) -> None:
    """Pop the innermost open event: its own time to its kind, its whole time to its parent's children."""
    e, kind, children = stack.pop()
    own[kind or _UNKINDED] += max(0.0, e.get("dur", 0) - children)
    if stack:
        stack[-1][2] += e.get("dur", 0)


def trace_host(trace_path: str | Path) -> list[dict]:
    """Where the host's time goes in the profiled step(s) of a torch profiler trace, by :data:`HOST_KINDS`.

    Every host thread's ops and annotations nest; an event's own time (less its children's) is
    charged to the nearest kind among itself and its ancestors, or to "other ops". Time a thread spends
    outside any op (Python between ops, waiting for another thread) is not counted; the CUDA runtime
    calls inside an op (launches) count for that op. Rows: kind, host ms, events of that kind, share;
    then the total with the number of launch calls (CUDA runtime/driver: kernels and CUDA graph
    replays) and their ms, and how many of them replay a CUDA graph and how many graphs were captured
    (instantiated) inside the traced step: ``[boost] cudagraphs`` should replay, not capture, once warm.
    """
    events = _trace_events(trace_path)
    threads = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in _HOST_CATS and not e["name"].startswith("ProfilerStep"):
            threads[(e.get("pid"), e.get("tid"))].append(e)
    own, count = defaultdict(float), defaultdict(int)
    launches, launch_us, graph_replays, graph_captures = 0, 0.0, 0, 0
    for evs in threads.values():
        evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack = []  # (event, kind, children's time)
        for e in evs:
            while stack and stack[-1][0]["ts"] + stack[-1][0].get("dur", 0) <= e["ts"]:
                _close_host_event(stack, own)
            kind = _host_kind(e["name"])
            if kind is not None and not any(k == kind for _, k, _ in stack):
                count[kind] += 1
            stack.append([e, kind or (stack[-1][1] if stack else None), 0.0])
            if e.get("cat") in ("cuda_runtime", "cuda_driver"):
                if "aunch" in e["name"]:
                    launches, launch_us = launches + 1, launch_us + e.get("dur", 0)
                    graph_replays += "GraphLaunch" in e["name"]
                graph_captures += "GraphInstantiate" in e["name"]
        while stack:
            _close_host_event(stack, own)
    total = sum(own.values())
    order = [k for k, _ in HOST_KINDS] + [_UNKINDED]
    rows = [{"kind": k, "host_ms": own[k] / 1e3, "events": count.get(k, 0), "share_pct": 100 * own[k] / total}
            for k in order if own.get(k)]
    graphs = f", {graph_replays} CUDA graph replays, {graph_captures} captures" if graph_replays or graph_captures else ""
    return rows + [{"kind": f"ALL (of which {launches} launch calls: {launch_us / 1e3:.1f} ms{graphs})",
                    "host_ms": total / 1e3, "events": sum(count.values()), "share_pct": 100.0 if total else 0.0}]


def removal_bounds(cola: dict[str, float], dense: dict[str, float]) -> list[dict]:
    """GPU-busy ratio dense/CoLA if kinds of kernel cost nothing, from two :func:`trace_buckets` dicts.

    Rows: as measured; each bucket removed from both models; every bucket but GEMM and attention
    removed from both (what the ratio can reach while GEMMs and attention run as they do now); and
    CoLA's attention at the dense model's time (both run the same attention; a gap there is clocks).
    """
    def row(what: str, c: float, d: float) -> dict:
        return {"scenario": what, "cola_ms": c, "dense_ms": d, "ratio": d / c}

    tc, td = sum(cola.values()), sum(dense.values())
    rows = [row("as measured", tc, td)]
    for b in sorted(set(cola) | set(dense), key=lambda k: -cola.get(k, 0.0)):
        rows.append(row(f"no {b} (both)", tc - cola.get(b, 0.0), td - dense.get(b, 0.0)))
    core = ("gemm", "attention")
    rows.append(row("only gemm + attention left (both)", sum(cola.get(b, 0.0) for b in core),
                    sum(dense.get(b, 0.0) for b in core)))
    if "attention" in cola and "attention" in dense:
        rows.append(row("CoLA attention at the dense time", tc - cola["attention"] + dense["attention"], td))
    return rows
