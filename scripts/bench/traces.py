"""Profiler traces of one step: GPU time by kernel class, the top kernels, the host causes of GPU
idle time, host time by kind, and the bounds of removing a kernel class."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

# ---- tracing one step of torchtitan's loop ------------------------------------------------------


def trace_step_overrides(step: int) -> list[str]:
    """torchtitan's overrides that trace step ``step`` (one warm-up step before it) into the run's
    ``traces`` folder (:func:`step_trace` finds it)."""
    return ["--profiling.enable_profiling", "--profiling.profile_freq", str(step), "--profiling.profiler_warmup", "1",
            "--profiling.profiler_active", "1", "--profiling.save_traces_folder", "traces"]


def step_trace(dump: str | Path, step: int) -> Path:
    """Rank 0's trace of step ``step`` in the run whose ``job.dump_folder`` is ``dump``."""
    return Path(dump) / "traces" / f"iteration_{step}" / "rank0_trace.json"


# ---- timing, ceilings, traces, plots ----------------------------------------------------------


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
