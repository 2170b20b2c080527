from .rmsnorm import online_rms_norm_linear, rms_norm, sync_rms_norm, upcast

__all__ = ["online_rms_norm_linear", "rms_norm", "sync_rms_norm", "upcast"]
