"""A benchmark trial, not library code: the model's RMSNorm through quack-kernels' CuTe DSL kernel.

Issue 18 asks to try quack's kernels against Inductor's inside the training loop and keep what wins.
Put this folder first on ``PYTHONPATH`` of a ``scripts/bench/e2e.py`` run; in each training rank
(``LOCAL_RANK`` set by torchrun) ``boost_titan.models.model.rms_norm`` — every pre-norm and the final
norm at tp 1 — becomes ``quack.rmsnorm.rmsnorm`` (a custom op with its own backward; Inductor then
cannot fuse the norm with the residual add or the casts around it). Result: ``docs/results/``,
``e2e_quack_norm.md``.
"""

import os

if "LOCAL_RANK" in os.environ:
    from quack.rmsnorm import rmsnorm as _quack_rmsnorm

    import boost_titan.models.model as _model

    def _rms_norm(x, weight, eps):
        return _quack_rmsnorm(x, weight.to(x.dtype), eps=eps)

    _model.rms_norm = _rms_norm
    print("[trial] RMSNorm: quack.rmsnorm.rmsnorm", flush=True)
