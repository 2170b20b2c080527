from .precision import upcast
from .rmsnorm import online_rms_norm_linear, rms_norm, sync_rms_norm

__all__ = ["online_rms_norm_linear", "rms_norm", "sync_rms_norm", "upcast"]
