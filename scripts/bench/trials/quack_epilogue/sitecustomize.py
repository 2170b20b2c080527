"""A benchmark trial, not library code: σ of every CoLA bottleneck inside quack-kernels' GEMM epilogues.

Issue 18's remaining route to its targets is elementwise work moved into the GEMMs. Put this folder
first on ``PYTHONPATH`` of a ``scripts/bench/e2e.py`` run of an *ungrouped* CoLA variant
(``cola_1b_ungrouped_compile``: one A and one B GEMM per factor, the shape quack's functions take);
in each training rank (``LOCAL_RANK`` set by torchrun) every tp 1 low-rank :class:`Projection` computes
``B_j σ(A_j x)`` as ``quack.linear.linear_act_func`` (``x A_jᵀ`` with σ in the epilogue, both written)
then ``act_linear_func`` (its backward: ``dy B_j`` with σ' in the epilogue, which also rebuilds σ(A_j x)
for B_j's weight gradient; only the pre-activation is saved). Dense projections, grouped ones and
tensor-parallel subclasses keep the library's code. Standalone numbers: ``scripts/bench/lowrank_epilogue.py``.
"""

import os

if "LOCAL_RANK" in os.environ:
    from quack.linear import act_linear_func, linear_act_func

    import boost_titan.models.model as _model

    _forward = _model.Projection.forward

    def _forward_quack(self, x):
        if self.a is None or self.grouped or type(self) is not _model.Projection:
            return _forward(self, x)
        if self.norm is not None:
            x = self.norm(x)
        b_ws = [w for blk in self.b for w in blk.weight.unbind(0)]  # B_1..B_c, as Projection.up orders them
        out = []
        for a_w, b_w in zip(self.a.weight.unbind(0), b_ws):
            preact, postact = linear_act_func(x, a_w, "silu", tuned=False)
            out.append(act_linear_func(preact, b_w, postact, "silu", tuned=False))
        return out

    _model.Projection.forward = _forward_quack
    print("[trial] CoLA bottlenecks: quack linear_act_func / act_linear_func (σ in the GEMM epilogues)", flush=True)
