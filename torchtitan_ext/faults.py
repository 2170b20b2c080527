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


# ---- one live run per checkpoint folder ----------------------------------------------------------
LOCK_NAME = ".run.lock"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a live pid from a reused one)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return None if fields[0] == "Z" else fields[19]


def claim_checkpoint_folder(folder: str, launcher_pid: int) -> str | None:
    """Write ``folder/.run.lock`` naming this run (host, launcher pid, its start time, since when);
    returns a one-line reason instead if another live run holds the folder.

    A lock whose process is gone (or whose pid now belongs to another process) is stale and taken
    over; a lock from another host cannot be checked and is reported, with the file to delete.
    """
    import datetime
    import json
    import socket

    host = socket.gethostname()
    path = os.path.join(folder, LOCK_NAME)
    os.makedirs(folder, exist_ok=True)
    mine = {"host": host, "pid": launcher_pid, "start_time": _start_time(launcher_pid),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                other = json.loads(open(path).read())
            except (OSError, ValueError):
                other = {}
            if other.get("host") == host and other.get("pid") == launcher_pid:
                return None  # ours already
            if other.get("host") == host and (not other.get("pid") or
                                              _start_time(other["pid"]) != other.get("start_time")):
                os.unlink(path)  # stale: its run is gone
                continue
            where = other.get("host", "?")
            return (f"checkpoint folder {folder} is held by a live run (host {where}, pid {other.get('pid')}, "
                    f"since {other.get('since')}); stop it first" +
                    ("" if where == host else f", or delete {path} if that run is known to be gone"))
        with os.fdopen(fd, "w") as f:
            json.dump(mine, f)
        return None
    return f"could not claim {path}"
