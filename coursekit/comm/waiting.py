"""What a rank is waiting on: one short note per rank, in memory its launcher can read.

The communication layer (:mod:`coursekit.comm`) writes the note just before it
blocks ("recv from rank 1, 4096 elements (reduce-scatter step 2)"); the
launcher (:mod:`coursekit.launch`) gives each rank the shared buffer and reads
it when a launch times out, so :class:`coursekit.LaunchTimeout` can say who
waits on what. Both import this module; neither imports the other for it.
"""

from __future__ import annotations

__all__ = ["STATUS_BYTES", "set_waiting", "waiting_on", "read_note", "attach"]

STATUS_BYTES = 240  # room for one note (longer ones are cut)

_buffer = None  # a multiprocessing RawArray of bytes, attached in each launched rank


def attach(buffer) -> None:
    """Called once in each launched rank: notes go to ``buffer`` from now on."""
    global _buffer
    # Written through a memoryview: slice assignment into the ctypes array itself costs ~2 µs a
    # note, and a ring step writes two (set, clear).
    _buffer = memoryview(buffer).cast("B")


def set_waiting(description: str) -> None:
    """Record what this rank is about to wait on (shown if the launch times out).

    Cheap (a memcpy into shared memory); a no-op outside a launched rank. ``""`` clears the note.
    """
    if _buffer is not None:
        if not description:
            _buffer[0] = 0  # an empty note: read_note stops at the first zero byte
            return
        data = description.encode("utf-8", "replace")[: STATUS_BYTES - 1]
        _buffer[: len(data) + 1] = data + b"\0"


def read_note(buffer) -> str:
    """The note in ``buffer`` (the parent's side), ``""`` if none."""
    return bytes(buffer).split(b"\0", 1)[0].decode("utf-8", "replace")


class waiting_on:
    """Context manager form of :func:`set_waiting`: ``with waiting_on("recv from rank 1"): ...``."""

    __slots__ = ("description",)

    def __init__(self, description: str):
        self.description = description

    def __enter__(self):
        set_waiting(self.description)
        return self

    def __exit__(self, *exc):
        set_waiting("")
        return False
