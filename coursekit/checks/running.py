"""How a check runs the learner's code, and what the learner is told when it goes wrong.

A check calls one of three methods of its :class:`Context`:

* ``ctx.simulate(fn, G, ...)``: the strict simulator (:func:`coursekit.comm.simulate`),
  in this process, in milliseconds. A send waits for its receive there, as on
  gloo, so a deadlock is found at once; a message that does not fit its receive
  is a sentence, not a process that gloo aborts.
* ``ctx.launch(fn, G, ...)``: real ranks (:func:`coursekit.launch`), the truth.
* ``ctx.run(fn, G, ..., accept=...)``: the simulator first; real ranks only when
  the simulated results are accepted. A wrong ring therefore fails in a second,
  and the real ranks never see a schedule that would abort them.

In all three, ``torch.distributed``'s collectives and raw send/recv raise
(:func:`forbid_torch_collectives`), so everything moves through
``coursekit.comm`` and is counted. On real ranks each rank's C-level output
(gloo's ``terminate called …``) goes to a file, never to the notebook; a rank
that dies is summarised in one line (:mod:`.rank_deaths`).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from contextlib import contextmanager
from typing import Callable

from ..launch import LaunchTimeout, RankError, launch
from ..simulator import Deadlock, SimulatorError, describe_waits, simulate
from .rank_deaths import death_summary, quiet_rank

__all__ = ["CheckFailed", "NotDone", "Deadlocked", "ForbiddenCall", "forbid_torch_collectives", "Context",
           "FORBIDDEN", "notes_from_timeout"]


class CheckFailed(AssertionError):
    """Raise in a check: ``message`` is shown to the learner; ``fraction`` of the points is still earned."""

    def __init__(self, message: str, fraction: float = 0.0):
        super().__init__(message)
        self.fraction = max(0.0, min(1.0, fraction))


class NotDone(CheckFailed):
    """The learner's function still raises NotImplementedError."""


class Deadlocked(CheckFailed):
    """Every rank waits on a call nobody matches. ``waited``: real ranks ran out their timeout (slow to find)."""

    def __init__(self, message: str, waited: bool = False):
        super().__init__(message)
        self.waited = waited


FORBIDDEN = ["all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
             "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "all_reduce_coalesced",
             "all_gather_object", "broadcast_object_list", "_reduce_scatter_base", "_all_gather_base",
             "send", "recv", "isend", "irecv", "batch_isend_irecv"]
_POINT_TO_POINT = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}


class ForbiddenCall(RuntimeError):
    pass


_forbidding = threading.Lock()
_forbidden_depth = [0, []]  # how many blocks are inside forbid_torch_collectives, and the originals they replaced


@contextmanager
def forbid_torch_collectives(instead: str | None = None):
    """Inside the block, ``torch.distributed``'s collectives and raw send/recv raise :class:`ForbiddenCall`.

    ``instead`` says what the exercise wants used (default: build it from
    ``coursekit.comm``). ``coursekit.comm`` keeps working: it bound the real
    functions at import. Re-entrant and thread-safe: the simulator's ranks are
    threads of one process, each inside the block; the first to enter replaces
    the functions and the last to leave puts the originals back.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def forbidden(name):
        def call(*args, **kwargs):
            if name in _POINT_TO_POINT:
                hint = "use coursekit.comm.send/recv/isend/irecv, so that every transfer is counted"
            else:
                hint = instead or "build it from coursekit.comm.send/recv/isend/irecv"
            raise ForbiddenCall(f"torch.distributed.{name} was called: this exercise asks you to {hint}.")
        return call

    with _forbidding:
        if _forbidden_depth[0] == 0:
            _forbidden_depth[1] = [(module, name, getattr(module, name)) for module in (dist, c10d)
                                   for name in FORBIDDEN if hasattr(module, name)]
            for module, name, _ in _forbidden_depth[1]:
                setattr(module, name, forbidden(name))
        _forbidden_depth[0] += 1
    try:
        yield
    finally:
        with _forbidding:
            _forbidden_depth[0] -= 1
            if _forbidden_depth[0] == 0:
                for module, name, original in _forbidden_depth[1]:
                    setattr(module, name, original)


def _guarded(fn: Callable, instead: str | None, logs: str | None = None) -> Callable:
    def rank_main(rank, world_size, *args):
        with quiet_rank(logs, rank), forbid_torch_collectives(instead):
            return fn(rank, world_size, *args)
    return rank_main


# Errors that mean "the simulator cannot run this code", not "the code is wrong": such code goes to real ranks.
_NOT_SIMULABLE = ("process group has not been initialized", "the simulator runs one world of ranks",
                  "coursekit.comm needs ranks")


class Context:
    """What a check gets besides the submission: ways to run code, with the check's timeout and guard."""

    def __init__(self, check_, timeout: float, instead: str | None = None):
        self.check, self.timeout, self.instead = check_, timeout, instead

    def simulate(self, fn: Callable, world_size: int, *args, on_send: Callable | None = None) -> list:
        """Run ``fn(rank, world_size, *args)`` in the strict simulator; learner errors become :class:`CheckFailed`.

        ``on_send`` sees every message (see :func:`coursekit.comm.simulate`).
        """
        try:
            return simulate(_guarded(fn, self.instead), world_size, *args, timeout=self.timeout,
                            on_send=on_send).results
        except Deadlock as error:
            raise Deadlocked(f"world size {world_size}: deadlock (a send waits until its receive is posted, as "
                             f"on gloo): {describe_waits(error.waiting)}") from None
        except SimulatorError as error:
            raise _explain(error.rank, error.remote_traceback) from None
        except TimeoutError:
            raise CheckFailed(f"world size {world_size}: still running after {self.timeout:g} s, stopped "
                              f"(an endless loop?)") from None

    def launch(self, fn: Callable, world_size: int, *args) -> list:
        """Run ``fn(rank, world_size, *args)`` on real ranks; learner errors become :class:`CheckFailed`."""
        with tempfile.TemporaryDirectory(prefix="coursekit-check-") as logs:
            try:
                return launch(_guarded(fn, self.instead, logs), world_size, *args, timeout=self.timeout)
            except LaunchTimeout as error:
                raise Deadlocked(f"world size {world_size}: still running after {self.timeout:g} s, stopped: "
                                 f"{_describe_timeout(error)}", waited=True) from None
            except RankError as error:
                summary = death_summary(error.rank, error.remote_traceback, logs, world_size)
                raise (CheckFailed(summary) if summary else _explain(error.rank, error.remote_traceback)) from None

    def run(self, fn: Callable, world_size: int, *args, accept: Callable[[list], bool] = lambda results: True):
        """The simulator first; if ``accept(simulated results)``, real ranks, whose results are returned.

        Results the simulator shows to be wrong are returned as they are: real
        ranks would only compute the same wrong answer, slower. Code the
        simulator cannot run (it calls ``torch.distributed`` for its rank, say) goes straight to real ranks.
        """
        try:
            results = self.simulate(fn, world_size, *args)
        except CheckFailed as failed:
            if not any(limit in str(failed) for limit in _NOT_SIMULABLE):
                raise
        else:
            if not accept(results):
                return results
        return self.launch(fn, world_size, *args)

    def run_case(self, fn: Callable, world_size: int, *args, accept: Callable[[list], bool] = lambda r: True):
        """:meth:`run` for one case of several: a crash is *returned*, so that it costs only this case.

        An unfinished exercise (:class:`NotDone`) or a deadlock (:class:`Deadlocked`)
        still ends the whole check: no other case could do better.
        """
        try:
            return self.run(fn, world_size, *args, accept=accept)
        except (NotDone, Deadlocked):
            raise
        except CheckFailed as failed:
            return failed

    def launch_case(self, fn: Callable, world_size: int, *args) -> list | CheckFailed:
        """:meth:`launch` for one case of several (real ranks only), with :meth:`run_case`'s rules."""
        try:
            return self.launch(fn, world_size, *args)
        except (NotDone, Deadlocked):
            raise
        except CheckFailed as failed:
            return failed


def _explain(rank: int, remote_traceback: str) -> CheckFailed:
    """The learner's error from a rank's traceback, in one line, with where in their code it happened."""
    lines = remote_traceback.strip().splitlines()
    last = lines[-1] if lines else "an error"
    if "NotImplementedError" in remote_traceback:
        return NotDone("not implemented yet (your function raises NotImplementedError)")
    if "ForbiddenCall" in remote_traceback:
        return CheckFailed(last.split(": ", 1)[-1])
    where = _learner_line(remote_traceback)
    return CheckFailed(f"rank {rank} raised {last}{f' ({where})' if where else ''}")


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _learner_line(remote_traceback: str) -> str:
    """``in reduce_scatter, line 12``: the innermost frame outside coursekit and torch, or ``""``."""
    found = ""
    for line in remote_traceback.splitlines():
        match = _FRAME.match(line)
        if match and not os.path.abspath(match["file"]).startswith(_PACKAGE) and "/torch/" not in match["file"]:
            found = f"in {match['name']}, line {match['line']}"
    return found


def notes_from_timeout(error: LaunchTimeout) -> dict[int, str | None]:
    """Each stuck rank's ``coursekit.comm`` note ("send to rank 1, 4 elements"), None if it was in no comm call."""
    notes = {}
    for rank, text in error.waiting.items():
        notes[rank] = text[len("waiting on "):].split("; at ", 1)[0] if text.startswith("waiting on ") else None
    return notes


def _describe_timeout(error: LaunchTimeout) -> str:
    """The simulator's one line (``rank 0 waits in send to rank 1, …``); ranks outside comm say where they are."""
    notes = notes_from_timeout(error)
    waiting = {rank: note for rank, note in notes.items() if note}
    parts = [describe_waits(waiting)] if waiting else []
    for rank, note in sorted(notes.items()):
        if note is None:
            frames = error.waiting[rank].split("; at ", 1)
            parts.append(f"rank {rank} is busy outside coursekit.comm{' at ' + frames[1] if len(frames) > 1 else ''}")
    return "; ".join(parts)
