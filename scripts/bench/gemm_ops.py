"""Where BTP's per-rank GEMM time goes, product by product, and which formulations beat the model's.

gemm_efficiency.py times a layer's GEMMs as the model runs them. This script splits that time into
the three products of every linear — forward ``y = x Wᵀ``, ``dX = dY W``, ``dW = dYᵀ X`` — and times
candidate formulations of each, to find what could lift BTP to issue 6's target (≥ 90% of the
measured peak at b = 4, ≥ 88% at b = 1):

  model      as the model computes it: weight stored ``[c, out, in]``; the products are NT / NN / TN
             and ``dW`` is ``[out, in]``.
  w_in_out   the weight stored ``[c, in, out]`` instead (``y = x W``): NN / NT / TN with ``dW = Xᵀ dY``
             ``[in, out]``. A layout change of the parameter; it must hold for all three products.
  lt         ``model`` through cuBLASLt (``torch.backends.cuda.preferred_blas_library``).
  splitk{S}  ``dW`` only: K = b·s cut into S slices, one batched GEMM with fp32 output, summed and
             cast. ``dW``'s output is small (``r × d/t``: 32 output tiles of 128 × 256 for 7B tp 4) and
             its K is large, so its tiles may not fill the 132 SMs.
  overlap    ``dX`` and ``dW`` together, ``dW`` on a side stream (fork/join inside the CUDA graph):
             a ``dW`` that leaves SMs idle could run beside the ``dX`` that needs them.
  triton     (``--triton-below P``: products where ``model`` reaches < P% of the peak) the product
             compiled by inductor with max-autotune restricted to its Triton GEMM templates
             (persistent TMA templates enabled): the best tuned Triton kernel for that exact shape.

Every candidate (``model`` included) is checked against the product's fp32 definition (einsum).
A product's candidates are timed in interleaved rounds together with an 8192³ reference GEMM, and
each row's % of peak is against that reference in the same rounds: an H200's GEMM throughput drifts
by several percent with clocks and temperature within a minute (docs/results/clocks_h200.md), more than
most differences measured here.
Part rows (% of the batch's median reference) sum the per-GEMM best picks: ``best_layout`` keeps one
layout per weight (the faster of ``model`` / ``w_in_out`` over its three products, dW optionally
split), ``best_any`` lets every product pick freely (a bound, not a runnable configuration).

GPU:  python -m scripts.bench.gemm_ops --out docs/results/gemm_ops_7b_tp4
CPU:  python -m scripts.bench.gemm_ops --device cpu --size tiny --batch 1 --seq 64
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch

from scripts.bench.common import (
    H200_DATASHEET_BF16_TFLOPS,
    PeakGemm,
    cuda_time_ms,
    env_info,
    interleaved_time_ms,
    print_table,
    write_results,
)
from scripts.bench.gemm_efficiency import SIZES, layer_gemms

SPLITS = (2, 4, 8)
PRODUCTS = ("fwd", "dX", "dW")


@contextlib.contextmanager
def blas(library: str):
    if not torch.cuda.is_available():
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


class Operands:
    """x ``[c, m, k]``, dY ``[c, m, n]`` and the weight in both layouts, for one linear."""

    def __init__(self, c: int, m: int, k: int, n: int, device, dtype):
        g = lambda *s: torch.randn(c, *s, device=device, dtype=dtype) / s[-1] ** 0.25  # noqa: E731
        self.x, self.dy, self.w = g(m, k), g(m, n), g(n, k)  # w: [c, out, in]
        self.w_t = self.w.transpose(1, 2).contiguous()  # [c, in, out]
        self.y, self.dx = self.x.new_empty(c, m, n), self.x.new_empty(c, m, k)
        self.dw, self.dw_t = self.w.new_empty(c, n, k), self.w.new_empty(c, k, n)
        self.m, self.k, self.n, self.c = m, k, n, c

    def products(self, side: torch.cuda.Stream | None) -> dict[str, dict[str, callable]]:
        """{product: {candidate: fn}}; each fn writes its result to a preallocated buffer."""
        x, dy, w, w_t = self.x, self.dy, self.w, self.w_t
        fns = {
            "fwd": {"model": lambda: torch.bmm(x, w.transpose(1, 2), out=self.y),
                    "w_in_out": lambda: torch.bmm(x, w_t, out=self.y)},
            "dX": {"model": lambda: torch.bmm(dy, w, out=self.dx),
                   "w_in_out": lambda: torch.bmm(dy, w_t.transpose(1, 2), out=self.dx)},
            "dW": {"model": lambda: torch.bmm(dy.transpose(1, 2), x, out=self.dw),
                   "w_in_out": lambda: torch.bmm(x.transpose(1, 2), dy, out=self.dw_t)},
        }
        for s in SPLITS:
            if self.m % s == 0:
                fns["dW"][f"splitk{s}"] = lambda s=s: self.split_k_dw(s)
        if side is not None:
            fns["dX+dW"] = {"model": lambda: (fns["dX"]["model"](), fns["dW"]["model"]()),
                            "overlap": lambda: self.overlapped(fns["dX"]["model"], fns["dW"]["model"], side)}
        return fns

    def split_k_dw(self, s: int) -> torch.Tensor:
        c, m, k, n = self.c, self.m, self.k, self.n
        dy_t = self.dy.view(c * s, m // s, n).transpose(1, 2)  # [c·s, n, m/s], no copy
        xs = self.x.view(c * s, m // s, k)
        kw = {"out_dtype": torch.float32} if self.x.dtype in (torch.bfloat16, torch.float16) else {}
        part = torch.bmm(dy_t, xs, **kw)  # [c·s, n, k] partial sums in fp32
        self.dw.copy_(part.view(c, s, n, k).sum(1))
        return self.dw

    @staticmethod
    def overlapped(dx_fn, dw_fn, side: torch.cuda.Stream) -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            dw_fn()
        dx_fn()
        main.wait_stream(side)

    def operands(self, product: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b) with ``product = a @ b`` in the model's layout (2-D when c = 1)."""
        a, b = {"fwd": (self.x, self.w.transpose(1, 2)), "dX": (self.dy, self.w),
                "dW": (self.dy.transpose(1, 2), self.x)}[product]
        return (a[0], b[0]) if self.c == 1 else (a, b)

    def triton(self, product: str) -> callable:
        """``product`` through the best of inductor's Triton GEMM templates (autotuned on first call)."""
        import torch._inductor.config as inductor

        a, b = self.operands(product)
        out = {"fwd": self.y, "dX": self.dx, "dW": self.dw}[product]
        torch._dynamo.config.recompile_limit = torch._dynamo.config.accumulated_recompile_limit = 10_000
        mm = torch.compile(lambda a, b: a @ b, mode="max-autotune-no-cudagraphs", dynamic=False)
        with inductor.patch({"max_autotune_gemm_backends": "TRITON", "triton.enable_persistent_tma_matmul": True,
                             "autotune_fallback_to_aten": False}):
            out.copy_(mm(a, b).view_as(out))  # compiles and autotunes now, outside any timing or capture
        return lambda: mm(a, b)

    def reference(self, product: str) -> torch.Tensor:
        """The product from its definition, in fp32 (einsum, independent of the candidates' layouts)."""
        x, dy, w = (t.float() for t in (self.x, self.dy, self.w))
        spec = {"fwd": ("cmk,cnk->cmn", x, w), "dX": ("cmn,cnk->cmk", dy, w), "dW": ("cmn,cmk->cnk", dy, x)}
        return torch.einsum(*spec[product])

    def result(self, product: str, name: str, returned) -> torch.Tensor:
        """What candidate ``name`` computed for ``product``, in the model's layout."""
        if name == "triton":  # returns a fresh tensor (2-D when c = 1)
            return returned.view(self.c, *returned.shape[-2:])
        if product == "dW" and name == "w_in_out":  # dW of the [in, out] weight
            return self.dw_t.transpose(1, 2)
        return {"fwd": self.y, "dX": self.dx, "dW": self.dw}[product]

    def check(self, fns: dict) -> None:
        """Every candidate of fwd / dX / dW (the model's own included) equals the fp32 definition."""
        tol = dict(rtol=2e-2, atol=2e-2) if self.x.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
        for product in PRODUCTS:
            ref = self.reference(product)
            for name, fn in fns[product].items():
                for buf in (self.y, self.dx, self.dw, self.dw_t):
                    buf.zero_()
                got = self.result(product, name, fn()).float()
                torch.testing.assert_close(got, ref, **tol, msg=lambda s, product=product, name=name: f"{product}/{name}: {s}")


def with_blas(library: str, fn: callable) -> callable:
    def run():
        with blas(library):
            return fn()
    return run


def time_gemm(gemm, m: int, args, device, dtype, peak: PeakGemm) -> list[dict]:
    """Rows of (product, candidate) times for one linear; all candidates of a product interleaved."""
    ops = Operands(gemm.c, m, gemm.k, gemm.n, device, dtype)
    cuda = device.type == "cuda"
    fns = ops.products(torch.cuda.Stream(device) if cuda else None)
    kw = dict(warmup=args.warmup, repeats=args.repeats, use_graph=cuda, device=device)
    rows = []
    for product, cands in fns.items():
        flops = 2 * gemm.c * m * gemm.k * gemm.n * (2 if product == "dX+dW" else 1)
        if cuda:
            cands["lt"] = with_blas("cublaslt", cands["model"])
        if cuda and product in PRODUCTS and args.triton_below > 0:
            model_tflops = flops / (cuda_time_ms(cands["model"], **kw) * 1e-3) / 1e12
            if 100 * model_tflops / peak.tflops(cuda_time_ms(peak, **kw)) < args.triton_below:
                try:
                    cands["triton"] = ops.triton(product)
                except Exception as e:  # a candidate that cannot be built is reported, not fatal
                    print(f"  {gemm.name} {product}: no Triton candidate ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200]})", flush=True)
        ms = interleaved_time_ms({**cands, "_peak": peak}, rounds=args.rounds, **kw)
        local_peak = peak.tflops(ms.pop("_peak"))
        for name, t in ms.items():
            tflops = flops / (t * 1e-3) / 1e12
            rows.append({"gemm": gemm.name, "c": gemm.c, "m": m, "k": gemm.k, "n": gemm.n, "product": product,
                         "candidate": name, "ms": t, "tflops": tflops, "peak_tflops": local_peak,
                         "pct_peak": 100 * tflops / local_peak})
    ops.check(fns)  # every timed candidate computes the product's definition
    del ops
    return rows


def part_times(t: dict, gemms: list, m: int) -> dict[str, float]:
    """A part's GEMM time (ms) as the model runs it, with one best layout per weight (dW optionally
    split), with a free pick per product; what dW beside dX would save; and its FLOPs."""
    acc = dict.fromkeys(("model", "best_layout", "best_any", "overlap_saved", "flops"), 0.0)
    for g in gemms:
        ms = {(p, c): v for (name, p, c), v in t.items() if name == g.name}
        dw_split = min((v for (p, c), v in ms.items() if p == "dW" and c.startswith("splitk")), default=float("inf"))
        acc["model"] += sum(ms[(p, "model")] for p in PRODUCTS)
        acc["best_layout"] += min(ms[("fwd", lay)] + ms[("dX", lay)] + min(ms[("dW", lay)], dw_split)
                                  for lay in ("model", "w_in_out"))
        acc["best_any"] += sum(min(v for (p, _), v in ms.items() if p == prod) for prod in PRODUCTS)
        if ("dX+dW", "overlap") in ms:
            acc["overlap_saved"] += ms[("dX+dW", "model")] - ms[("dX+dW", "overlap")]
        acc["flops"] += 6 * g.c * m * g.k * g.n
    return acc


def best_rows(rows: list[dict], parts: dict[str, list], b: int, m: int, peak: float) -> list[dict]:
    """One row per part and for the layer: :func:`part_times` and each time's % of ``peak``."""
    t = {(r["gemm"], r["product"], r["candidate"]): r["ms"] for r in rows}
    per_part = {part: part_times(t, gemms, m) for part, gemms in parts.items()}
    per_part["layer"] = {k: sum(acc[k] for acc in per_part.values()) for k in per_part[next(iter(parts))]}
    out = []
    for part, acc in per_part.items():
        row = {"b": b, "part": part, "overlap_saved_ms": acc["overlap_saved"]}
        for k in ("model", "best_layout", "best_any"):
            row[f"{k}_ms"] = acc[k]
            row[f"{k}_pct"] = 100 * acc["flops"] / (acc[k] * 1e-3) / 1e12 / peak
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="7B", choices=list(SIZES))
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--rank-ratio", type=float, default=0.25)
    ap.add_argument("--repeats", type=int, default=10, help="timed replays per candidate per round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds over a product's candidates")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="docs/results/gemm_ops_7b_tp4")
    ap.add_argument("--triton-below", type=float, default=0.0,
                    help="add a Triton-autotuned candidate where the model's product is below this %% of peak")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    d, f = SIZES[args.size]
    r = int(d * args.rank_ratio)
    parts = layer_gemms("btp", d, f, r, args.tp)
    meta = env_info(device)
    peak = PeakGemm(device)
    print(f"[{meta['device']}] {args.size} tp{args.tp} btp", flush=True)
    rows, summary = [], []
    for b in args.batch:
        m = b * args.seq
        b_rows = [row for gs in parts.values() for g in gs for row in time_gemm(g, m, args, device, dtype, peak)]
        for row in b_rows:
            row["b"] = b
        rows += b_rows
        b_peak = statistics.median(row["peak_tflops"] for row in b_rows)  # the batch's parts: one peak
        summary += best_rows(b_rows, parts, b, m, b_peak)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    peaks = [row["peak_tflops"] for row in rows]
    meta.update({"size": args.size, "d": d, "f": f, "r": r, "tp": args.tp, "seq": args.seq,
                 "dtype": str(dtype).replace("torch.", ""), "warmup": args.warmup, "repeats": args.repeats,
                 "rounds": args.rounds,
                 "timing": ("CUDA events, CUDA-graph replay" if device.type == "cuda" else "perf_counter")
                 + "; a product's candidates and the peak GEMM timed in interleaved rounds, medians",
                 "peak_gemm": f"{peak.a.shape[0]}^3 mm in every product's rounds; rows use their own",
                 "measured_peak_tflops_median_min_max": [round(statistics.median(peaks), 1), round(min(peaks), 1),
                                                         round(max(peaks), 1)],
                 "datasheet_tflops": H200_DATASHEET_BF16_TFLOPS if device.type == "cuda" else None})
    notes = __doc__.split("\n\n", 1)[1].rsplit("\n\nGPU:", 1)[0]
    cols = ["b", "part", "model_pct", "best_layout_pct", "best_any_pct", "model_ms", "best_layout_ms",
            "best_any_ms", "overlap_saved_ms"]
    title = f"BTP per-rank GEMMs by product ({args.size}, tp {args.tp})"
    section = ("Part time: as the model, best layout, best per product (% of measured peak)", summary, cols)
    json_path, md_path = write_results(args.out, rows, meta, title, sections=[section], notes=notes)
    print(f"wrote {json_path}, {md_path}")
    best = {}
    for row in rows:
        key = (row["b"], row["gemm"], row["product"])
        best[key] = min(best.get(key, row), row, key=lambda x: x["ms"])
    model = {(x["b"], x["gemm"], x["product"]): x for x in rows if x["candidate"] == "model"}
    print_table([{"b": k[0], "gemm": k[1], "product": k[2], "model_pct": model[k]["pct_peak"],
                  "best": v["candidate"], "best_pct": v["pct_peak"]} for k, v in best.items()],
                ["b", "gemm", "product", "model_pct", "best", "best_pct"])
    print()
    print_table(summary, cols)


if __name__ == "__main__":
    main()
