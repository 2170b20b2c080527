"""torchtitan glue: registers the ``cola_llama`` model family, the ``llama3_peer`` reference (torchtitan's
llama3 at our dense shapes, :mod:`.peers`) and, on CPU, the device shim.

Loaded by torchtitan through ``[job] custom_config_module = "torchtitan_ext.cola_llama.job_config"`` (which
imports this package first) and ``[experimental] custom_import = "torchtitan_ext"``.
"""

import torch

if not torch.cuda.is_available():
    from torchtitan_ext.runtime import cpu_shim

    cpu_shim.install()

from torchtitan_ext.cola_llama.peers import register as register_peer  # noqa: E402
from torchtitan_ext.cola_llama.spec import register  # noqa: E402
from torchtitan_ext.runtime import around_family  # noqa: E402
from torchtitan_ext.runtime.faults import die_with_launcher  # noqa: E402
from torchtitan_ext.runtime.logs import quiet  # noqa: E402

die_with_launcher()
quiet()
register(around_family)
register_peer()
