"""Saying what went wrong with a rank: what a stuck one was doing at the timeout, how a dead one died.

For a stuck rank, the note comes from :mod:`coursekit.comm.waiting` (the
communication layer writes it before it blocks) and the stack from
``faulthandler``, which each rank set up to dump its frames on ``SIGUSR1``
into a pipe of its own.
"""

from __future__ import annotations

import os
import signal
import time

from ..comm.waiting import read_note
from .gang import Gang

STACK_DUMP_S = 0.3  # how long a timeout waits for the stuck ranks' faulthandler dumps


def describe_waiting(gang: Gang, ranks: list[int]) -> dict[int, str]:
    """For each rank in ``ranks``: what it waits on, and its innermost frames.

    The notes are read first: the signal may interrupt a blocking call and so
    change what the rank is doing.
    """
    notes = {rank: read_note(gang.status[rank]) for rank in ranks}
    for rank in ranks:
        try:
            os.kill(gang.procs[rank].pid, signal.SIGUSR1)
        except (ProcessLookupError, TypeError):
            pass
    time.sleep(STACK_DUMP_S)  # faulthandler writes from a signal handler; give it a moment
    described = {}
    for rank in ranks:
        note, (dump, others) = notes[rank], split_threads(read_stack(gang.stacks[rank]))
        frames, call = innermost_frames(dump), torch_distributed_call(dump)
        if note:
            parts = [f"waiting on {note}"]
        elif call:  # blocked (or working) in torch's own call: coursekit wrote no note, the frames say where
            parts = [f"inside torch.distributed.{call} (not a coursekit call: no note of what it waits on)"]
        else:
            parts = ["busy (not inside a communication call)"]
        if frames:
            parts.append("at " + " <- ".join(frames))
        threads = [" <- ".join(f) for f in (innermost_frames(other, keep=2) for other in others) if f]
        if threads:  # a main thread "busy" in a matmul may be waiting on one of these (the GIL, a lock, a queue)
            parts.append("its other threads at " + " | ".join(threads))
        described[rank] = "; ".join(parts)
    return described


def how_it_died(rank: int, code: int | None) -> str:
    """Why a rank's process ended without a word, from its exit code."""
    how = f"was killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exited with code {code}"
    return (f"rank {rank} {how} before returning a result "
            f"(a crash in C++, e.g. a gloo buffer-size mismatch, or os._exit).\n")


def _is_launcher_file(path: str) -> bool:
    """The launcher's own frames (rank_main and friends) say nothing about the learner's bug."""
    path = path.replace(os.sep, "/")
    return "coursekit/launch/" in path


def read_stack(reader) -> str:
    """What a rank's faulthandler has written to its stack pipe so far (``reader``: the parent's end)."""
    chunks = []
    try:
        while reader.poll(0):  # readable: text, or the end of the pipe (the rank died)
            chunk = os.read(reader.fileno(), 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (OSError, ValueError):
        pass
    return b"".join(chunks).decode("utf-8", "replace")


def split_threads(dump: str) -> tuple[str, list[str]]:
    """A faulthandler dump of every thread, cut into the thread that took the signal and the others.

    The signal is sent to the rank's process, which Linux delivers to its main thread (the one that runs
    the learner's function); faulthandler calls that one "Current thread". A dump of one thread only
    ("Stack (most recent call first)") is all current.
    """
    blocks: list[list[str]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")) or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    texts = ["\n".join(block) for block in blocks]
    current = next((i for i, text in enumerate(texts) if text.startswith("Current thread")), len(texts) - 1)
    if current < 0:
        return "", []
    return texts[current], texts[:current] + texts[current + 1:]


def torch_distributed_call(dump: str) -> str:
    """The ``torch.distributed`` function a rank is inside (``"all_reduce"``), from its faulthandler dump; ``""``: none.

    The outermost frame of ``distributed_c10d.py`` is the call the learner wrote (an
    ``all_reduce`` may call helpers of the same file further in).
    """
    names = [line.rsplit(" in ", 1)[-1].strip() for line in dump.splitlines()
             if line.strip().startswith("File ") and "distributed_c10d.py" in line]
    return names[-1] if names else ""


def innermost_frames(dump: str, keep: int = 3) -> list[str]:
    """The innermost ``keep`` frames of a faulthandler dump, as 'function (file:line)'."""
    lines = [line.strip() for line in dump.splitlines() if line.strip().startswith("File ")]
    frames = []
    for line in lines:  # faulthandler prints the most recent call first
        # File "/path/to/file.py", line 12 in name
        try:
            path_part, rest = line[6:].split('", line ', 1)
            lineno, name = rest.split(" in ", 1)
        except ValueError:
            continue
        if _is_launcher_file(path_part):
            continue
        frames.append(f"{name} ({os.path.basename(path_part)}:{lineno})")
        if len(frames) == keep:
            break
    return frames
