"""How a rank treats signals: Ctrl-C belongs to its parent, and its parent's death is its own.

**Ctrl-C.** Jupyter's stop button sends SIGINT to the kernel's whole process
group, ranks included. Only the parent acts on it (it stops every rank), so a
rank ignores SIGINT. Before it gets there it must not receive a
KeyboardInterrupt of its own (it would die, and the parent would blame it):
ranks are started by a thread that blocks SIGINT (:mod:`.starter`), a blocked
signal stays blocked through ``fork`` and ``exec`` alike, and a rank unblocks
it only once it ignores it (a SIGINT pending by then is discarded).

**Its parent's death.** A rank asks Linux to SIGKILL it the moment its parent
dies (``PR_SET_PDEATHSIG``), so no rank outlives a kernel that crashed or was
killed: a running rank is gone at once, well within
:data:`DIES_WITH_PARENT_WITHIN_S`. Two catches:

* "parent" means the *thread* that forked the rank: when that thread ends, the
  rank is killed though the process lives on. Hence the one long-lived starter.
* a parent that dies between ``fork`` and ``prctl`` sends no signal, ever. So
  the rank asks the kernel first, then checks it still has the same parent,
  and exits if it has been adopted by someone else.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from multiprocessing import resource_tracker

DIES_WITH_PARENT_WITHIN_S = 1.0  # the promise: a running rank is gone this soon after its parent process dies
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def block_ctrl_c(start_method: str = "fork") -> None:
    """In the thread that starts ranks, before each start: the rank begins with SIGINT blocked.

    The resource tracker that multiprocessing starts at the first spawn unblocks SIGINT in the thread
    that started it, so for spawn it is started first, and SIGINT blocked after.
    """
    if start_method != "fork":
        resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def ignore_ctrl_c() -> None:
    """First thing in a rank: ignore SIGINT, then unblock it (in that order, or one could slip through)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _load_libc():
    """The C library, for ``prctl``; None where there is none to ask (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()  # loaded once, in the parent: a forked rank inherits it (dlopen per rank cost 0.5 ms)


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this rank when its parent dies; exit now if the parent is already gone."""
    if _LIBC is None:
        return
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # after prctl, never before: the parent may die in between
        os._exit(1)
