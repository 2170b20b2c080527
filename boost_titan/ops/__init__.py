from .rmsnorm import online_rms_norm_linear, sync_rms_norm
