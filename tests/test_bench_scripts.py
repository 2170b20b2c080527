"""The arithmetic inside the benchmark scripts (scripts/bench), checked against hand computations."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts.bench import emulate, quality
from scripts.bench.e2e import variant
from scripts.bench.loss_match import compare
from scripts.bench.profile_step import ceiling_rows, gemm_tflop_per_step
from scripts.bench.quality import _time_to_reach, _training_seconds, validation_freq
from scripts.bench.results import format_table, write_results
from scripts.bench.timing import interleaved_time_ms
from scripts.bench.traces import bucket, removal_bounds, trace_buckets, trace_gaps, trace_host, trace_top_kernels


@pytest.mark.parametrize("steps, points, log_freq, expected", [
    (1200, 15, 10, 80),    # 1200 / 15 = 80 divides 1200 and is a multiple of 10
    (2400, 15, 10, 160),
    (250, 15, 10, 10),     # multiples of 10 dividing 250: 10, 50, 250; 10 is nearest 16.7
    (7, 3, 10, 7),         # no multiple of the log interval divides 7: validate at the end only
])
def test_validation_freq_divides_the_run_on_log_steps(steps, points, log_freq, expected):
    assert validation_freq(steps, points, log_freq) == expected


def verdict_of(cola, dense, dense_flops, dense_small):
    return quality.verdict({"cola": cola, "dense": dense, "dense_flops": dense_flops, "dense_small": dense_small})


def test_verdict_follows_the_rule():
    """Each verdict of VERDICT_RULE from hand-picked seed losses (sigma computed by hand)."""
    # ΔL = 0.01, stds 0.02 and 0.01: sigma = sqrt(0.0004/3 + 0.0001/3) = 0.0129; 0.01 <= 2 sigma -> parity;
    # CoLA 3.50 <= 3.55 and 3.60 -> also compute-efficient
    v = verdict_of([3.48, 3.50, 3.52], [3.48, 3.49, 3.50], [3.55] * 3, [3.60] * 3)
    assert v["delta_L"] == pytest.approx(0.01) and v["sigma"] == pytest.approx(math.sqrt(0.0005 / 3))
    assert v["verdict"] == "parity and compute-efficient"
    # ΔL = 0.02 but the seeds agree to 0.001: a real difference, not parity; CoLA loses at equal FLOPs too
    v = verdict_of([3.519, 3.520, 3.521], [3.499, 3.500, 3.501], [3.51] * 3, [3.50] * 3)
    assert v["verdict"] == "inconclusive at this budget"
    # ΔL = 0.10 and no win at equal FLOPs: CoLA worse
    assert verdict_of([3.6] * 3, [3.5] * 3, [3.55] * 3, [3.58] * 3)["verdict"] == "CoLA worse"
    # ΔL = 0.10 but CoLA beats both equal-compute arms: compute-efficient, not worse
    assert verdict_of([3.6] * 3, [3.5] * 3, [3.65] * 3, [3.7] * 3)["verdict"] == "compute-efficient"
    assert verdict_of([3.6] * 3, [3.5] * 3, [], [3.7] * 3)["verdict"].startswith("not decided")


def test_quality_plan_chooses_from_finished_logs_and_resumes(tmp_path):
    """The sweep's choice comes from the logs on disk (lowest final validation loss per arm); a run
    whose log lacks its last validation is not finished; seeds 1-3 follow the choice, the CoLA and
    dense seed 1 alone on the GPU; an arm chosen at the edge of its learning-rate grid gets no seeds."""
    a = SimpleNamespace(out=str(tmp_path / "q"), log_freq=10, val_points=10, extra="")
    (tmp_path / "q_logs").mkdir()

    def write_log(run, final_loss, last_step=None):
        last = run.steps if last_step is None else last_step
        lines = [f"[titan] 2026-01-01 00:00:{i:02d},000 - root - INFO - step: {s}  loss: 5.0  grad_norm: 1.0  "
                 f"memory: 1.00GiB(1.00%)  tps: 1,000  tflops: 1.00  mfu: 1.00%" for i, s in enumerate((10, last))]
        lines.append(f"[titan] 2026-01-01 00:01:00,000 - root - INFO - validate step: {last}  loss: {final_loss}")
        quality.log_path(run, a).write_text("# command: x\n" + "\n".join(lines) + "\n")

    def loss(run):  # lowest at each arm's third learning rate (inside the grid), 20% warm-up slightly better
        return 4.0 + 0.01 * (quality.ARMS[run.arm].lrs.index(run.lr) - 2) ** 2 - 0.001 * (run.warmup == "0.2")

    sweep = quality.sweep_runs(100, a)
    assert len(sweep) == sum(2 * len(arm.lrs) for arm in quality.ARMS.values())
    assert {r.steps for r in sweep if r.arm == "dense_flops"} == {70}  # 100 / 1.433 in whole log intervals
    for run in sweep[:-1]:
        write_log(run, loss(run))
    assert quality.chosen(100, a)["dense_small"] is None  # its last sweep run has not run
    write_log(sweep[-1], loss(sweep[-1]))
    best = quality.chosen(100, a)
    for name, run in best.items():
        assert run == min((r for r in sweep if r.arm == name), key=loss)
        assert (run.lr, run.warmup) == (quality.ARMS[name].lrs[2], "0.2")
    write_log(best["cola"], 1.0, last_step=best["cola"].steps - 10)  # cut short: no final validation
    assert quality.chosen(100, a)["cola"] is None
    write_log(best["cola"], 4.5)  # finished, now the worst: another setting wins
    assert quality.chosen(100, a)["cola"] != best["cola"]
    best = quality.chosen(100, a)
    alone, shared = quality.seed_runs(best, alone=True), quality.seed_runs(best, alone=False)
    assert {(r.arm, r.seed) for r in alone} == {("cola", 1), ("dense", 1)} and all(r.alone for r in alone)
    assert len(shared) == 4 * 3 - 2 and not any(r.alone for r in shared)
    assert all((r.lr, r.warmup, r.steps) == (best[r.arm].lr, best[r.arm].warmup, best[r.arm].steps)
               for r in alone + shared)
    edge = next(r for r in sweep if r.arm == "dense" and r.lr == quality.ARMS["dense"].lrs[0])
    write_log(edge, 3.0)  # the lowest learning rate now wins: the grid must grow before any seed
    best = quality.chosen(100, a)
    assert best["dense"] == edge and quality.at_grid_edge(edge)
    assert not any(r.arm == "dense" for r in quality.seed_runs(best, True) + quality.seed_runs(best, False))


def test_quality_seeds_join_the_pool_once_their_arm_has_chosen(tmp_path, monkeypatch):
    """Sweep and seed runs share one pool: every seed run starts after its own arm's whole sweep has
    finished (never before), all arms with a choice inside their grid get seeds 1-3 in the same call,
    and the speed pair (CoLA's and dense's seed 1) is left to the stage that runs alone."""
    a = SimpleNamespace(out=str(tmp_path / "q"), log_freq=10, val_points=10, extra="", d_steps=100,
                        arms=",".join(quality.ARMS), parallel=3)
    finished, order = {}, []

    def fake_train(run, a):
        order.append(run)
        finished[run] = {"validation": [(run.steps, 4.0 + 0.01 * (quality.ARMS[run.arm].lrs.index(run.lr) - 2) ** 2)]}
        return finished[run]

    monkeypatch.setattr(quality, "train", fake_train)
    monkeypatch.setattr(quality, "load", lambda run, a: finished.get(run))
    quality.sweep_then_seeds(["sweep", "seeds"], a)
    sweep = quality.sweep_runs(100, a)
    assert set(sweep) <= set(order)
    seeds = [r for r in order if r.seed > 0]
    assert {(r.arm, r.seed) for r in seeds} == {(arm, s) for arm in quality.ARMS for s in quality.SEEDS} - {
        ("cola", 1), ("dense", 1)}
    for run in seeds:
        arm_sweep = [order.index(r) for r in sweep if r.arm == run.arm]
        assert order.index(run) > max(arm_sweep), run


def test_quality_logs_pack_reproducibly_and_resume(tmp_path):
    """The committed log archive holds every log byte for byte, is the same bytes when packed twice,
    and is unpacked where the folder is missing (a fresh clone resumes from it)."""
    a = SimpleNamespace(out=str(tmp_path / "q"))
    folder = tmp_path / "q_logs"
    folder.mkdir()
    logs = {"b.log": "second\n", "a.log": "# command: x\nfirst\n"}
    for name, text in logs.items():
        (folder / name).write_text(text)
    quality.pack_logs(a)
    first = (tmp_path / "q_logs.tar.gz").read_bytes()
    quality.pack_logs(a)
    assert (tmp_path / "q_logs.tar.gz").read_bytes() == first
    for path in folder.iterdir():
        path.unlink()
    quality.unpack_logs(a)
    assert {p.name: p.read_text() for p in folder.iterdir()} == logs


def test_training_seconds_sum_the_logged_windows():
    # 1000 tokens per step; windows of 10 steps at 2000 tok/s (5 s) then 10 steps at 5000 tok/s (2 s)
    run = {"tokens_per_step": 1000, "steps": [{"step": 10, "tps": 2000.0}, {"step": 20, "tps": 5000.0}]}
    assert _training_seconds(run) == {10: 5.0, 20: 7.0}


def test_time_to_reach_interpolates_the_validation_curve():
    run = {"train_s": {10: 5.0, 20: 7.0}, "validation": [(10, 4.0), (20, 3.0)]}
    assert _time_to_reach(run, 3.5) == (20, pytest.approx(6.0))  # halfway between the two points
    assert _time_to_reach(run, 4.5) == (10, 5.0)  # already below at the first point
    assert _time_to_reach(run, 2.0) == (None, None)  # never reached
    assert _time_to_reach(run, None) == (None, None)


def hand_gemm_tflop_1b(tokens: int, dense: bool) -> float:
    """6 · (projection weights + lm_head) · tokens for the 1B shapes, counted by hand."""
    d, f, r, layers, vocab = 2048, 5472, 512, 24, 32000
    cola = layers * (4 * r * (d + d) + 2 * r * (d + f) + r * (f + d)) + vocab * d
    full = layers * (4 * d * d + 3 * d * f) + vocab * d
    return 6 * (full if dense else cola) * tokens / 1e12


def test_gemm_flops_of_the_1b_pair_by_hand():
    tokens = 4 * 4096
    assert gemm_tflop_per_step("1B", tokens) == pytest.approx(hand_gemm_tflop_1b(tokens, dense=False))
    assert gemm_tflop_per_step("1B_fullrank", tokens) == pytest.approx(hand_gemm_tflop_1b(tokens, dense=True))


def test_ceiling_rows_pair_each_variant_with_its_dense_twin():
    steps = [{"variant": "1B", "gpu_busy_ms": 180.0}, {"variant": "1B:ungrouped", "gpu_busy_ms": 190.0},
             {"variant": "1B_fullrank", "gpu_busy_ms": 300.0}, {"variant": "60M", "gpu_busy_ms": 10.0}]
    gemm = {"1B": 70.0, "1B:ungrouped": 75.0, "1B_fullrank": 170.0, "60M": 3.0}
    peak, tokens = 800.0, 16384
    rows = {r["variant"]: r for r in ceiling_rows(steps, gemm, tokens, peak, 1.5)}
    assert set(rows) == {"1B", "1B:ungrouped"}  # 60M has no twin in the run; the twin is not a row
    row = rows["1B"]
    at_peak = hand_gemm_tflop_1b(tokens, dense=False) / peak * 1e3
    assert row["ratio_gpu_busy"] == pytest.approx(300 / 180)
    assert row["non_gemm_ms"] == pytest.approx(110.0)
    assert row["ratio_if_gemm_at_peak"] == pytest.approx(300 / (at_peak + 110))
    assert row["non_gemm_ms_for_1.5x"] == pytest.approx(300 / 1.5 - 70)


@pytest.mark.parametrize("name, kind", [
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("triton_poi_fused_mul_stack_view_4", "fused elementwise (triton)"),
    ("void at::native::cunn_SoftMaxForward<4, float>", "other"),
])
def test_kernel_buckets(name, kind):
    assert bucket(name) == kind


def test_trace_buckets_sum_kernel_durations_per_step(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "dur": 3000},
              {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "dur": 1000},
              {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add", "dur": 500},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 9000},  # host side: not GPU time
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "dur": 70}]
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert trace_buckets(trace, steps=2) == {"gemm": 2.0, "fused elementwise (triton)": 0.25, "other": 0.035}


def test_trace_buckets_count_the_traced_steps_launches_only(tmp_path):
    # the loop never waited for the GPU: GEMMs launched before ProfilerStep#40 opened (the previous
    # step's: one launch recorded before the window, one not recorded at all) still run inside the
    # trace window; they are not this step's GPU work
    host = dict(ph="X", pid=1, tid=1, cat="cuda_runtime", name="cudaLaunchKernel", dur=5)
    events = [{**host, "ts": 0, "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "ts": 120, "dur": 20, "args": {"correlation": 0}},
              {"ph": "X", "pid": 1, "tid": 1, "cat": "user_annotation", "name": "ProfilerStep#40", "ts": 100, "dur": 1000},
              {**host, "ts": 200, "args": {"correlation": 2}},
              {**host, "ts": 300, "name": "cudaGraphLaunch", "args": {"correlation": 3}},
              {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "ts": 150, "dur": 3000, "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "ts": 3200, "dur": 1000, "args": {"correlation": 2}},
              {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add", "ts": 4300, "dur": 500, "args": {"correlation": 3}}]
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert trace_buckets(trace) == {"gemm": 1.0, "fused elementwise (triton)": 0.5}
    assert trace_top_kernels(trace)[-1]["ms"] == pytest.approx(1.5)


def test_trace_top_kernels_and_idle_by_hand(tmp_path):
    # two GEMMs (3 ms, 1 ms) and a 0.5 ms kernel over a 10 ms span: 4.5 ms busy, 5.5 ms idle
    events = [{"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "ts": 0, "dur": 3000},
              {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add", "ts": 4000, "dur": 500},
              {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "ts": 9000, "dur": 1000},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 20000}]
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    rows = trace_top_kernels(trace, n=5)
    assert [(r["kernel"], r["calls"], r["ms"]) for r in rows[:2]] == [("nvjet_sm90_gemm", 2, 4.0),
                                                                    ("triton_poi_fused_add", 1, 0.5)]
    assert rows[-1]["ms"] == pytest.approx(4.5) and rows[-1]["idle_ms"] == pytest.approx(5.5)


def test_trace_gaps_by_hand(tmp_path):
    # host thread: a step annotation; an aten::to whose copy is followed by a stream synchronize that
    # blocks until the GPU drains (3.01 ms), then an embedding launch; later a compiled region launches
    # an mm late, right after an asynchronous device-to-device copy (not a wait). GPU: 0-3 ms busy, idle
    # until 3.3 (0.3 ms after the sync), busy to 3.8, idle to 4.0 (0.2 ms, no sync), a 5 us gap (ignored).
    host = dict(ph="X", pid=1, tid=1)
    events = [{**host, "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 0, "dur": 10000},
              {**host, "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 5, "dur": 20},
              {**host, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 5, "args": {"correlation": 6}},
              {**host, "cat": "cpu_op", "name": "aten::to", "ts": 1000, "dur": 2100},
              {**host, "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 1005, "dur": 5},
              {**host, "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 1010, "dur": 2000},
              {**host, "cat": "cpu_op", "name": "aten::embedding", "ts": 3200, "dur": 100},
              {**host, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 3250, "dur": 5, "args": {"correlation": 7}},
              {**host, "cat": "cpu_op", "name": "CompiledFunction", "ts": 3900, "dur": 300},
              {**host, "cat": "cpu_op", "name": "aten::copy_", "ts": 3905, "dur": 20},
              {**host, "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 3910, "dur": 10},
              {**host, "cat": "cpu_op", "name": "aten::mm", "ts": 3940, "dur": 20},
              {**host, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 3950, "dur": 5, "args": {"correlation": 8}},
              {**host, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 3960, "dur": 5, "args": {"correlation": 9}},
              {"ph": "X", "cat": "kernel", "name": "multi_tensor_apply_kernel", "ts": 0, "dur": 3000, "args": {"correlation": 6}},
              {"ph": "X", "cat": "kernel", "name": "embedding_kernel", "ts": 3300, "dur": 500, "args": {"correlation": 7}},
              {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "ts": 4000, "dur": 100, "args": {"correlation": 8}},
              {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add", "ts": 4105, "dur": 100, "args": {"correlation": 9}}]
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    rows = trace_gaps(trace, min_us=10)
    assert [(r["after_sync"], r["launched_by"], r["gaps"]) for r in rows[:2]] == [
        ("aten::to", "aten::embedding", 1), ("", "CompiledFunction > aten::mm", 1)]
    assert rows[0]["idle_ms"] == pytest.approx(0.3) and rows[1]["idle_ms"] == pytest.approx(0.2)
    assert rows[-1]["gaps"] == 2 and rows[-1]["idle_ms"] == pytest.approx(0.5) and rows[-1]["max_ms"] == pytest.approx(0.3)


def test_trace_host_charges_own_time_to_the_nearest_kind(tmp_path):
    # main thread: a compiled region (100 us) whose graph call (60) holds a launch (5), with 10 us of
    # guards; an eager op (30); the optimizer (50) with a fused kernel op (20). Autograd thread: a
    # compiled backward (80) whose graph call (70) runs inside it, then FSDP's post-backward (40) with
    # a copy (15). The profiler step annotation (1000) and time outside any op count for nothing. The
    # backward graph call replays one CUDA graph and captures another (a runtime call within its time).
    main, grad = dict(ph="X", pid=1, tid=1), dict(ph="X", pid=1, tid=2)
    events = [{**main, "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 1000},
              {**main, "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "ts": 10, "dur": 100},
              {**main, "cat": "cpu_op", "name": "TorchDynamo Cache Lookup", "ts": 10, "dur": 10},
              {**main, "cat": "user_annotation", "name": "## Call CompiledFxGraph abc ##", "ts": 30, "dur": 60},
              {**main, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 40, "dur": 5},
              {**main, "cat": "cpu_op", "name": "aten::add", "ts": 200, "dur": 30},
              {**main, "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 300, "dur": 50},
              {**main, "cat": "cpu_op", "name": "aten::_fused_adamw_", "ts": 310, "dur": 20},
              {**grad, "cat": "cpu_op", "name": "autograd::engine::evaluate_function: CompiledFunctionBackward",
               "ts": 400, "dur": 90},
              {**grad, "cat": "cpu_op", "name": "CompiledFunctionBackward", "ts": 405, "dur": 80},
              {**grad, "cat": "user_annotation", "name": "## Call CompiledFxGraph def ##", "ts": 410, "dur": 70},
              {**grad, "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 420, "dur": 5},
              {**grad, "cat": "cuda_runtime", "name": "cudaGraphInstantiateWithFlags", "ts": 430, "dur": 10},
              {**grad, "cat": "user_annotation", "name": "FSDP::post_backward_reduce (layers.0)", "ts": 500, "dur": 40},
              {**grad, "cat": "cpu_op", "name": "aten::copy_", "ts": 510, "dur": 15}]
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    rows = {r["kind"].split(" (")[0]: r for r in trace_host(trace)}
    assert rows["compiled graphs"]["host_ms"] == pytest.approx(0.130)  # 60 + 70, the launch included
    assert rows["compiled-region wrappers"]["host_ms"] == pytest.approx(0.050)  # 100 - 60 + 80 - 70
    assert rows["compiled-region wrappers"]["events"] == 2  # the region (its cache lookup inside it), the backward
    assert rows["FSDP2 hooks, copy-in/out, collectives"]["host_ms"] == pytest.approx(0.040)
    assert rows["optimizer step"]["host_ms"] == pytest.approx(0.050)
    assert rows["other ops"]["host_ms"] == pytest.approx(0.040)  # aten::add + the engine's own 10 us
    total = next(r for k, r in rows.items() if k.startswith("ALL"))
    assert total["host_ms"] == pytest.approx(0.310)
    assert "2 launch calls: 0.0 ms, 1 CUDA graph replays, 1 captures" in total["kind"]


def test_write_results_sections_with_notes(tmp_path):
    rows = [{"a": 1, "b": "x"}]
    sections = [("Plain", [{"k": 2.5}], None), ("Noted", [{"gaps": 3, "idle_ms": 1.25}], ["gaps"], "A note.")]
    json_path, md_path = write_results(str(tmp_path / "r"), rows, {"date": "d"}, "T", sections=sections)
    md = Path(md_path).read_text()
    assert "## Noted\n\nA note.\n\n| gaps |\n|------|\n|    3 |" in md  # the note under its heading, one column
    assert "idle_ms" not in md
    assert json.loads(Path(json_path).read_text())["sections"]["Noted"] == [{"gaps": 3, "idle_ms": 1.25}]
    with pytest.raises(TypeError, match="columns must be a sequence"):
        format_table(rows, "a note passed as columns")


def test_removal_bounds_by_hand():
    cola = {"gemm": 70.0, "attention": 60.0, "other": 20.0}
    dense = {"gemm": 170.0, "attention": 66.0, "other": 24.0}
    rows = {r["scenario"]: r["ratio"] for r in removal_bounds(cola, dense)}
    assert rows["as measured"] == pytest.approx(260 / 150)
    assert rows["no attention (both)"] == pytest.approx(194 / 90)
    assert rows["no other (both)"] == pytest.approx(236 / 130)
    assert rows["only gemm + attention left (both)"] == pytest.approx(236 / 130)
    assert rows["CoLA attention at the dense time"] == pytest.approx(260 / 156)


def test_gemm_efficiency_runs_on_cpu_and_its_parts_add_up(tmp_path):
    out = tmp_path / "res"
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.gemm_efficiency", "--device", "cpu", "--repeats", "1",
                           "--warmup", "0", "--out", str(out), "--quick", "--rounds", "2"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "res.json").read_text())["rows"]
    parts = {(r["strategy"], r["b"], r["part"]): r for r in rows}  # one layer row per (strategy, b): attn + mlp
    assert {k[0] for k in parts} == {"fullrank", "vanilla", "btp"} and {k[1] for k in parts} == {1, 4}
    for (strategy, b, part), r in parts.items():
        if part == "layer":
            assert r["time_ms"] == pytest.approx(parts[(strategy, b, "attn")]["time_ms"]
                                                 + parts[(strategy, b, "mlp")]["time_ms"])


def test_interleaved_timing_alternates_the_functions_round_by_round():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "peak")}
    times = interleaved_time_ms(fns, warmup=1, repeats=2, rounds=3, device="cpu")
    assert set(times) == {"a", "b", "peak"} and all(t >= 0 for t in times.values())
    warm, timed = calls[:3], calls[3:]
    assert warm == ["a", "b", "peak"]
    assert timed == ["a", "a", "b", "b", "peak", "peak"] * 3  # each round visits every function in turn


def test_emulate_split_efficiency_and_pipeline_prediction_by_hand(monkeypatch):
    rows = [{"flavor": "7B", "strategy": "tp1", "tp": 1, "pp": 1, "batch": 4, "ok": True, "step_s": 0.8},
            {"flavor": "7B", "strategy": "btp", "tp": 4, "pp": 1, "batch": 4, "ok": True, "step_s": 0.25}]
    emulate.add_split_efficiency(rows)
    assert rows[1]["perfect_s"] == pytest.approx(0.2) and rows[1]["split_eff"] == pytest.approx(0.8)
    # a pipeline row: 100 ms of GPU time at microbatch 1 (10 ms of it the optimizer), tp comm 20 ms
    monkeypatch.setattr(emulate.comm_model, "tp_seconds", lambda calls, tp, overlap_rate=None: 0.02)
    monkeypatch.setattr(emulate, "model_collectives", lambda *a, **k: ([], 0))
    row = {"flavor": "13B", "strategy": "btp", "tp": 4, "pp": 2, "batch": 4, "ok": True, "step_s": 0.3}
    got = emulate.predict(row, 4, 4096, {"gemm": 60.0, "attention": 30.0, "optimizer": 10.0})
    p2p = 2 * emulate.comm_model.collective_seconds("p2p", 4096 * (5120 // 4) * 2, 2)
    # 4 microbatches + 2 stages - 1 = 5 slots of ((90 ms + 20 ms) / 2 + p2p), then half the optimizer
    assert got["pred_step_s"] == pytest.approx(5 * (0.055 + p2p) + 0.005) and got["pred_basis"] == "GPU-bound"
    # with both stages' ranks measured in the schedule (0.2 s and 0.32 s for 4 microbatches) they win:
    # 5 slots of (0.32 s / 4 + 20 ms / 2 + p2p)
    stages = [{"stage": 0, "ok": True, "step_s": 0.2}, {"stage": 1, "ok": True, "step_s": 0.32}]
    got = emulate.predict(row, 4, 4096, {"gemm": 60.0}, stages)
    assert got["pred_step_s"] == pytest.approx(5 * (0.08 + 0.01 + p2p)) and got["pred_basis"] == "stage ranks"
    assert "pred_step_s" not in emulate.predict(row, 4, 4096, None, stages[:1])  # a stage missing: no basis
    # microbatches of 2 samples in a local batch of 8: still 4 microbatches, each transfer twice the size
    row2 = {**row, "microbatch": 2, "batch": 8}
    p2p2 = 2 * emulate.comm_model.collective_seconds("p2p", 2 * 4096 * (5120 // 4) * 2, 2)
    got = emulate.predict(row2, 8, 4096, {"gemm": 60.0}, stages)
    assert got["pred_step_s"] == pytest.approx(5 * (0.08 + 0.01 + p2p2))
    assert emulate.run_name(row2, 8) == "13B_btp_b8_mb2" and emulate.emulated_batch(row2, 8) == 2
    with pytest.raises(ValueError, match="--microbatch 2 must divide the local batch 3"):
        emulate.microbatches(row2, 3)
    # BOOST's Fig. 5 numbers sit beside the rows computed like BOOST's (micro-batches of 4 samples):
    # the 7B row at local batch 4 and the 13B pipeline at microbatch 4, not at microbatch 1
    stage_rows = [{**s, "flavor": "13B", "strategy": "btp", "batch": b} for b in (4, 16) for s in stages]
    table = emulate.add_predictions([{**row}, {**row, "microbatch": 4, "batch": 16},
                                     {**rows[1], "batch": 4}, {**rows[1], "batch": 1}], 4096, {}, stage_rows)
    boost = {(t["flavor"], t["batch"]): "boost_a100" in t for t in table}
    assert boost == {("13B", 4): False, ("13B", 16): True, ("7B", 4): True, ("7B", 1): False}


def test_emulate_runs_on_cpu(tmp_path):
    """Two tiny rows through the fake backend on CPU: parsed, split efficiency and a prediction present."""
    out = tmp_path / "emu"
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.emulate", "--rows", "tiny:tp1,btp", "--seq-len", "64",
                           "--steps", "3",
                           "--skip", "1", "--extra=--boost.synthetic_vocab_size 512 --compile.no-enable",
                           "--out", str(out)], cwd=Path(emulate.__file__).parents[2], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {r["strategy"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert rows["tp1"]["ok"] and rows["btp"]["ok"] and rows["btp"]["kind"] == "emulated"
    assert rows["btp"]["split_eff"] > 0 and rows["btp"]["pred_step_s"] > rows["btp"]["step_s"]


@pytest.mark.e2e
def test_multi_gpu_script_runs_the_real_layout_on_cpu(tmp_path):
    """scripts/bench/multi_gpu.sh, the real (torchrun) path, on 2 gloo ranks with the tiny row."""
    root = Path(emulate.__file__).resolve().parents[2]
    env = dict(os.environ, ROWS="tiny:btp", STEPS="3", SKIP="1", OUT=str(tmp_path / "mg"),
               EXTRA="--boost.synthetic_vocab_size 512 --compile.no-enable --training.seq_len 64")
    proc = subprocess.run(["bash", "scripts/bench/multi_gpu.sh"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = json.loads((tmp_path / "mg.json").read_text())["rows"]
    assert row["ok"] and row["kind"] == "measured" and row["step_s"] > 0 and row["tp"] == 2


@pytest.mark.e2e
def test_e2e_torchtitan_step_arm_runs_emulated_on_cpu(tmp_path):
    """``scripts.bench.e2e --emulate --torchtitan-step``: the A/B's baseline arm (torchtitan's own train
    step in the emulating trainer) runs a tiny tp 2 x FSDP 2 layout as rank 0; without --emulate it is
    refused before any run."""
    root = Path(emulate.__file__).resolve().parents[2]
    base = ["python", "-m", "scripts.bench.e2e", "--torchtitan-step", "--ngpu", "4", "--steps", "3", "--skip", "1",
            "--variants", "cola_1b", "--out", str(tmp_path / "e2e"),
            "--extra=--model.flavor tiny --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 2 "
            "--training.dataset synthetic --boost.tokenizer none --boost.synthetic_vocab_size 512 "
            "--training.seq_len 64 --training.local_batch_size 2"]
    refused = subprocess.run(base, cwd=root, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "add --emulate" in refused.stderr
    proc = subprocess.run([*base, "--emulate"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = json.loads((tmp_path / "e2e.json").read_text())["rows"]
    assert "python3 -m scripts.bench.torchtitan_step " in row["command"] and row["tokens_per_s"] > 0


def test_e2e_exits_nonzero_when_a_run_fails(tmp_path, monkeypatch):
    """A run that logs no step (here: out of memory in its first step, as a GPU log prints it) leaves a nan
    row carrying the log's exception line, and the script exits non-zero naming it, instead of a table that
    looks done; a run that trains keeps its numbers."""
    from scripts.bench import e2e

    oom = ("[titan] 2026-12-07 03:00:21,374 - root - WARNING - Error running lspci: no such file\n"
           "[rank0]: Traceback (most recent call last):\n"
           "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 688.00 MiB.\n")
    trained = ("[titan] 2026-12-07 03:00:21,374 - root - INFO - Trainer is initialized with local batch size 2, "
               "global batch size 2, gradient accumulation steps 1, sequence length 64, total steps 2\n" +
               "".join(f"[titan] 2026-12-07 03:00:2{s},000 - root - INFO - step:  {s}  loss:  3.1  grad_norm:  1.0  "
                       f"memory:  1.00GiB(1%)  tps: 1,000  tflops: 0.10  mfu: n/a\n" for s in (1, 2)))
    logs = {"cola_1b": (oom, 1), "fullrank_1b": (trained, 0)}
    monkeypatch.setattr(e2e, "run_train", lambda config, overrides, ngpu, log_path, **kw: e2e.parse_log(
        logs[log_path.stem][0], logs[log_path.stem][1], f"cmd {log_path.stem}"))
    monkeypatch.setattr(sys, "argv", ["e2e", "--steps", "2", "--skip", "0", "--variants", "cola_1b,fullrank_1b",
                                      "--out", str(tmp_path / "e2e")])
    with pytest.raises(SystemExit) as exit_:
        e2e.main()
    rows = {r["variant"]: r for r in json.loads((tmp_path / "e2e.json").read_text())["rows"]}
    err = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 688.00 MiB."
    assert rows["cola_1b"]["error"] == err and rows["cola_1b"]["tokens_per_s"] != rows["cola_1b"]["tokens_per_s"]
    assert rows["fullrank_1b"]["tokens_per_s"] == 1000 and "error" not in rows["fullrank_1b"]
    assert str(exit_.value).startswith(f"scripts.bench.e2e: 1 of 2 runs failed: cola_1b: {err} (logs in ")


def test_loss_match_compare_by_hand():
    """Last-window means and their difference, the largest step difference, and the baseline's noise
    around its 9-step moving average (a constant curve has none)."""
    base = [5.0] * 20
    cand = [5.0] * 18 + [5.3, 4.9]
    got = compare(base, cand, window=4)
    assert got["steps"] == 20 and got["baseline_last_mean"] == 5.0
    assert got["candidate_last_mean"] == pytest.approx((5.0 + 5.0 + 5.3 + 4.9) / 4)
    assert got["diff_last_mean"] == pytest.approx(0.05) and got["max_step_diff"] == pytest.approx(0.3)
    assert got["step_noise_std"] == 0.0
    zigzag = [5.0 + (0.1 if i % 2 else -0.1) for i in range(40)]
    assert compare(zigzag, zigzag, window=10)["step_noise_std"] == pytest.approx(0.1, rel=0.15)


def test_e2e_pairs_only_cola_variants_with_their_twin():
    from scripts.bench.e2e import dense_twin

    assert dense_twin("cola_1b_compile+flash+fused+b8") == "fullrank_1b_compile+flash+fused+b8"
    assert dense_twin("fullrank_1b_compile+flash+fused") is None  # the twin itself is not a CoLA row


def test_e2e_variant_names_compose():
    config, extra = variant("cola_1b_compile+flash+fp8tw+b12")
    assert config.endswith("cola_1b_h200.toml")
    assert extra == ["--compile.enable", "--boost.attention", "flash", "--boost.float8", "tensorwise",
                     "--training.local_batch_size", "12"]
    _, extra = variant("fullrank_1b_compile+mb90")
    assert extra == ["--compile.enable", "--activation_checkpoint.mode", "memory_budget",
                     "--activation_checkpoint.memory_budget", "0.9"]
    for bad in ("cola_1b_compile+bx", "no_such_base+flash", "cola_1b_compile+mb"):
        with pytest.raises(SystemExit, match="unknown"):
            variant(bad)


def test_elementwise_floor_counts_each_crossing_once():
    """A GEMM between elementwise code: its input made by relu is written once, its output read once by
    the multiply (not once per consumer), the graph input read once, the multiply's result written once;
    a weight reached through a view and read only by the GEMM costs nothing."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from scripts.bench.elementwise_floor import boundary_bytes

    def f(x, w):
        y = torch.relu(x) @ w.t()
        return y * 2 + y.sin(), y

    gm = make_fx(f, tracing_mode="fake")(torch.randn(8, 4), torch.randn(6, 4))
    relu_out, y, result = 8 * 4 * 4, 8 * 6 * 4, 8 * 6 * 4
    assert boundary_bytes(gm.graph) == {"written": relu_out + result, "read": 8 * 4 * 4 + y, "read_of_gemm_outputs": y}


def test_host_proxy_traces_a_layouts_host_time_on_the_cpu(tmp_path):
    """tp 2 × FSDP 2 on the fake backend, a 2-block stand-in of the 7B: the traced step's host table has one
    AccumulateGrad per parameter of the rank's model and FSDP2's hooks, and the untraced steps are timed."""
    import torch

    from boost_titan.models import Transformer
    from scripts.bench.host_proxy import stand_in

    out = tmp_path / "hp"
    subprocess.run([sys.executable, "-m", "scripts.bench.host_proxy", "--flavor", "7B", "--blocks", "2", "--ngpu", "4",
                    "--variants", "cola_1b", "--steps", "6", "--skip", "1", "--out", str(out), "--extra",
                    "--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 2"],
                   check=True, cwd=Path(__file__).resolve().parents[1], capture_output=True, timeout=600)
    res = json.loads(out.with_suffix(".json").read_text())
    with torch.device("meta"):
        params = len(list(Transformer(stand_in("7B", 128, blocks=2)).parameters()))  # the tied matrix once
    host = {r["kind"].split(" (")[0]: r for r in res["sections"]["Host time of the traced step by kind"]}
    assert host["gradient accumulation"]["events"] == params == 2 * 10 + 2
    assert host["FSDP2 hooks, copy-in/out, collectives"]["host_ms"] > 0
    (row,) = res["rows"]
    assert row["steps_timed"] == 3 and row["step_ms"] > 0  # steps 2-4; 5 and 6 are the profiler's


def test_host_floor_pipeline_slopes_by_hand():
    """The pipeline's host parts from its runs at 2 and 4 microbatches: slope per block and microbatch,
    the rest per step."""
    from scripts.bench.host_floor import pipeline_slopes

    rows = [{"kind": "pipeline", "tp": 2, "passes": 2, "blocks": 16, "step_s": 0.20, "ok": True},
            {"kind": "pipeline", "tp": 2, "passes": 4, "blocks": 16, "step_s": 0.36, "ok": True},
            {"kind": "pipeline", "tp": 4, "passes": 2, "blocks": 16, "step_s": 0.25, "ok": True}]  # no m = 4 run
    (slope,) = pipeline_slopes(rows)
    assert slope["tp"] == 2
    assert slope["host_per_block_pass_s"] == pytest.approx(0.16 / 32)
    assert slope["fixed_s"] == pytest.approx(0.04)


@pytest.mark.e2e
def test_host_floor_runs_and_resumes_on_cpu(tmp_path):
    """Two tiny kinds through the fake backend on CPU: each row's host time per block is its step over its
    blocks; a second call keeps the rows the first measured and, its time budget spent, runs no more."""
    out = tmp_path / "hf"
    cmd = [sys.executable, "-m", "scripts.bench.host_floor", "--flavor", "tiny", "--tp", "2", "--seq-len", "64",
           "--steps", "4", "--skip", "1", "--extra=--boost.synthetic_vocab_size 512 --compile.no-enable", "--out", str(out)]
    root = Path(emulate.__file__).parents[2]
    first = subprocess.run([*cmd, "--kinds", "one_rank,fsdp"], cwd=root, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    rows = {r["kind"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    for kind, dp in [("one_rank", 1), ("fsdp", 2)]:
        r = rows[kind]
        assert r["ok"] and r["dp"] == dp and r["blocks"] == 2
        assert r["host_per_block_s"] == pytest.approx(r["step_s"] / 2)
        assert "--parallelism.tensor_parallel_degree 2" in r["command"]
    second = subprocess.run([*cmd, "--kinds", "one_rank,fsdp,fsdp_one_unit", "--time-budget", "0"], cwd=root,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "[tiny_fsdp_one_unit_tp2_m1] not run" in second.stdout
    again = {r["kind"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert again.keys() == {"one_rank", "fsdp"} and again["fsdp"]["step_s"] == rows["fsdp"]["step_s"]
