"""Ctrl-C during a launch: it always reaches the caller, and never cuts starting or stopping a rank in half.

Python runs a signal's handler in the main thread, between two bytecodes,
wherever that thread is. For a launcher that goes wrong in two ways:

* **Lost.** What at-fork callbacks and finalizers (``__del__``, weakref
  callbacks) raise is printed ("Exception ignored in ...") and dropped. Of 200
  SIGINTs sent in the first 30 ms of a 4-rank launch, 54 died so in
  ``logging``'s at-fork callback, and those launches ran on to the end.
* **Half done.** Raised between ``fork()`` and the parent noting the new pid,
  KeyboardInterrupt orphans a rank no teardown can find (93 of those 200).

So while a launch runs, SIGINT's handler counts each interrupt, then raises
as Python's own does. :func:`check` (each turn of the collect loop) and the end
of :class:`watched` raise again if one was swallowed. Inside :class:`held` the
handler only counts: KeyboardInterrupt comes when the block is done.
"""

from __future__ import annotations

import signal
import threading


class _Count:
    def __init__(self):
        self.seen = 0     # SIGINTs since the launch began
        self.holding = 0  # depth of `held` blocks


_count: _Count | None = None  # set while a watched launch runs in the main thread


def _on_sigint(signum, frame):
    count = _count
    if count is not None:
        count.seen += 1
        if count.holding:
            return  # `held` raises it when its block is done
    raise KeyboardInterrupt


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C came during this launch and was swallowed on its way."""
    if _count is not None and _count.seen and not _count.holding and _in_main_thread():
        raise KeyboardInterrupt


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class watched:
    """Around a launch or a Cluster call. A no-op where no KeyboardInterrupt can be lost: outside the
    main thread (Python raises none there), under someone else's handler, or inside another ``watched``."""

    def __enter__(self):
        global _count
        self.active = (_count is None and _in_main_thread()
                       and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        if self.active:
            try:
                signal.signal(signal.SIGINT, _on_sigint)
                _count = _Count()
            except BaseException:  # a Ctrl-C just now: leave things as they were
                signal.signal(signal.SIGINT, signal.default_int_handler)
                _count = None
                raise
        return self

    def __exit__(self, kind, error, traceback):
        global _count
        if not self.active:
            return False
        signal.signal(signal.SIGINT, signal.default_int_handler)  # first: a later SIGINT raises as usual
        seen, _count = _count.seen, None
        if seen and not (kind and issubclass(kind, KeyboardInterrupt)):
            raise KeyboardInterrupt from error  # swallowed on its way (or replaced): the caller still gets it
        return False


class held:
    """A block that must not be cut in half: a Ctrl-C in it is raised when the block is done."""

    def __enter__(self):
        self.watch = watched().__enter__()  # works alone too, e.g. Cluster.close() called from a cell
        self.count = _count if _in_main_thread() else None
        if self.count is not None:
            self.before = self.count.seen
            self.count.holding += 1
        return self

    def __exit__(self, kind, error, traceback):
        late = False
        if self.count is not None:
            self.count.holding -= 1
            late = kind is None and self.count.seen > self.before and not self.count.holding
        self.watch.__exit__(KeyboardInterrupt if late else kind, error, traceback)
        if late:
            raise KeyboardInterrupt
        return False
