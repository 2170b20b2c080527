"""What a rank does when its run fails around it.

torchrun starts every worker in a session of its own, so a worker outlives a launcher that is
killed (an OOM kill, a preempted wrapper, a closed terminal): it goes on training and writing
checkpoints, parented to init, and a restart then trains twice into one folder.
:func:`die_with_launcher` makes the kernel send the worker SIGTERM when the process that started it
(torchrun's agent) exits. When one *rank* dies, torchrun's agent already stops the others.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_launcher(sig: int = signal.SIGTERM) -> bool:
    """Under torchrun on Linux: ``sig`` when the launching agent exits; exit now if it already has.

    Returns whether the parent-death signal was set.
    """
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    launcher = os.getppid()
    if launcher == 1:  # orphaned already
        os._exit(128 + int(sig))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != launcher:  # it died while the signal was being armed
        os._exit(128 + int(sig))
    return True
