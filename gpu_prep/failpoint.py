"""Named points where a test can have the process killed, to prove that a run killed anywhere leaves no
file that looks complete and that --resume finishes it byte for byte.

GPU_PREP_FAILPOINT="name:n" sends SIGKILL (or GPU_PREP_FAILPOINT_SIGNAL, e.g. INT for a Ctrl-C) to this
process (with GPU_PREP_FAILPOINT_GROUP=1, to its process group, as a terminal's Ctrl-C goes to every process
of the command) the n-th time it passes the point `name`; GPU_PREP_FAILPOINT_SIGNAL=ENOSPC (or another errno name)
raises that OSError there instead, as a full disk would. Unset
(always, outside tests) a point costs one dictionary lookup. With GPU_PREP_FAILPOINT_ONCE=path, only the
process that creates that file first is killed: one worker of a cluster, and not the one started in its
place.
"""

from __future__ import annotations

import errno
import os
import signal

_ARMED: dict[str, int] = {}
if spec := os.environ.get("GPU_PREP_FAILPOINT"):
    _name, _, _count = spec.partition(":")
    _ARMED[_name] = int(_count or 1)


def failpoint(name: str, path: object = None) -> None:
    """path: the file an OSError raised here is about, as a failed write names it."""
    if name in _ARMED:
        _ARMED[name] -= 1
        if _ARMED[name] == 0 and _first():
            how = os.environ.get("GPU_PREP_FAILPOINT_SIGNAL", "KILL")
            if how.startswith("E"):
                code = getattr(errno, how)
                raise OSError(code, os.strerror(code), *([str(path)] if path is not None else []))
            if os.environ.get("GPU_PREP_FAILPOINT_GROUP") == "1":
                os.killpg(os.getpgid(0), getattr(signal, "SIG" + how))
            else:
                os.kill(os.getpid(), getattr(signal, "SIG" + how))


def _first() -> bool:
    marker = os.environ.get("GPU_PREP_FAILPOINT_ONCE")
    if marker is None:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
