"""The one thread that starts every rank: it lives as long as the process, and it never takes a Ctrl-C.

Ranks are forked (or spawned) here, not in the caller's thread, because:

* Linux's parent-death signal (see :mod:`.rank_signals`) is tied to the
  *thread* that forked a rank. A Cluster created in a short-lived thread (a
  callback, an executor) had its ranks killed as that thread ended; its next
  ``run`` got BrokenPipeError. This thread ends only with the process.
* It blocks SIGINT, and Python runs signal handlers only in the main thread:
  no Ctrl-C can land in the at-fork callbacks (where CPython drops what they
  raise), and every rank begins with SIGINT blocked.
* One thread forks for every launch, one at a time: a rank forked for
  another launch would inherit this launch's ends of the pipes and keep them
  open, and a dead rank's end-of-file would never arrive.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .interrupts import held
from .rank_signals import block_ctrl_c

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def in_starter(job: Callable[..., Any], *args) -> Any:
    """``job(*args)`` in the starter thread; its result, or its exception. A Ctrl-C waits until it is done."""
    with held():  # a half-started gang must not be left to the starter while the caller tears it down
        return _starter().submit(job, *args).result()


def _starter() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, "coursekit-starter", initializer=block_ctrl_c)
        return _pool


def _forget_in_child() -> None:
    """A forked child has only the thread that forked it: a launch from there needs a starter of its own."""
    global _lock, _pool
    _lock, _pool = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_in_child)
