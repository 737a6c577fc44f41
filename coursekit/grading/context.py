"""How a check runs the learner's code: the :class:`Context` every check is handed.

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
(:func:`.guard.forbid_torch_collectives`), so everything moves through
``coursekit.comm`` and is counted. On real ranks each rank's C-level output
(gloo's ``terminate called …``) goes to a file, never to the notebook; a rank
that dies is summarised in one line (:mod:`.rank_deaths`), and an error in one line with the learner's
line (:mod:`.feedback`).

Several checks often judge the same run (one training, three checks): ``ctx.memo(key, compute)``
runs ``compute()`` once per grading (one :func:`~coursekit.grading.grade` call) and hands every later
check the same result, or raises the same :class:`CheckFailed` again.
"""

from __future__ import annotations

import tempfile
from typing import Any, Callable, Hashable

from ..launch import LaunchTimeout, RankError, launch
from ..comm.simulator import Deadlock, SimulatorError, describe_waits, simulate
from .feedback import NOT_IMPLEMENTED, describe_timeout, explain, is_stub
from .guard import guarded
from .rank_deaths import LENGTH_HINT, death_summary
from .registry import length_hint
from .scoring import CheckFailed, Deadlocked, NotDone

__all__ = ["Context", "NOT_SIMULABLE"]

# Errors that mean "the simulator cannot run this code", not "the code is wrong": such code goes to real ranks.
NOT_SIMULABLE = ("process group has not been initialized", "the simulator runs one world of ranks",
                  "coursekit.comm needs ranks")


def _refuse_stubs(args: tuple) -> None:
    """A learner's function still the exercise's stub: "not done" now, as the ranks would say after starting."""
    if any(is_stub(arg) for arg in args):
        raise NotDone(NOT_IMPLEMENTED)


class Context:
    """What a check gets besides the submission: ways to run code, with the check's timeout and guard.

    ``memo`` is the grading's memory, shared by every check of one :func:`~coursekit.grading.grade` call.
    """

    def __init__(self, check_, timeout: float, instead: str | None = None, memo: dict | None = None):
        self.check, self.timeout, self.instead = check_, timeout, instead
        self.exercise = getattr(check_, "exercise", None)  # whose library answers are held back (coursekit.answers)
        self.allow = tuple(getattr(check_, "allows", ()))  # torch.distributed functions this check lets through
        self.memory = {} if memo is None else memo

    def __getstate__(self) -> dict:  # a Context passed to a rank travels without the grading's memory
        return {**self.__dict__, "memory": {}}

    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per grading: later calls with ``key`` return its result (or raise its failure again).

        Only :class:`CheckFailed` is remembered as a failure; any other error propagates and is not kept.
        """
        if key not in self.memory:
            try:
                self.memory[key] = (compute(), None)
            except CheckFailed as failed:
                self.memory[key] = (None, failed)
        result, failed = self.memory[key]
        if failed is not None:
            raise failed
        return result

    def simulate(self, fn: Callable, world_size: int, *args, on_send: Callable | None = None,
                 case: str | None = None) -> list:
        """Run ``fn(rank, world_size, *args)`` in the strict simulator; learner errors become :class:`CheckFailed`.

        ``on_send`` sees every message (see :func:`coursekit.comm.simulate`). ``case`` names the case in what a
        deadlock or an endless loop is told ("all_reduce, world size 4, length 1001"; default: the world size).
        """
        _refuse_stubs(args)
        case = case or f"world size {world_size}"
        try:
            return simulate(guarded(fn, self.instead, exercise=self.exercise, allow=self.allow), world_size, *args,
                            timeout=self.timeout,
                            on_send=on_send).results
        except Deadlock as error:
            raise Deadlocked(f"{case}: deadlock (a send waits until its receive is posted, as "
                             f"on gloo): {describe_waits(error.waiting)}") from None
        except SimulatorError as error:
            raise explain(error.rank, error.remote_traceback) from None
        except TimeoutError:
            raise CheckFailed(f"{case}: still running after {self.timeout:g} s, stopped "
                              f"(an endless loop?)") from None

    def launch(self, fn: Callable, world_size: int, *args, case: str | None = None) -> list:
        """Run ``fn(rank, world_size, *args)`` on real ranks; learner errors become :class:`CheckFailed`
        (``case`` as in :meth:`simulate`)."""
        _refuse_stubs(args)
        case = case or f"world size {world_size}"
        with tempfile.TemporaryDirectory(prefix="coursekit-check-") as logs:
            try:
                return launch(guarded(fn, self.instead, logs, self.exercise, self.allow), world_size, *args,
                              timeout=self.timeout)
            except LaunchTimeout as error:
                raise Deadlocked(f"{case}: still running after {self.timeout:g} s, stopped: "
                                 f"{describe_timeout(error)}", waited=True) from None
            except RankError as error:
                hint = length_hint(self.exercise) or LENGTH_HINT
                summary = death_summary(error.rank, error.remote_traceback, logs, world_size, hint)
                raise (CheckFailed(summary) if summary else explain(error.rank, error.remote_traceback)) from None

    def run(self, fn: Callable, world_size: int, *args, accept: Callable[[list], bool] = lambda results: True,
            case: str | None = None):
        """The simulator first; if ``accept(simulated results)``, real ranks, whose results are returned.

        Results the simulator shows to be wrong are returned as they are: real
        ranks would only compute the same wrong answer, slower. Code the
        simulator cannot run (it calls ``torch.distributed`` for its rank, say) goes straight to real ranks.
        """
        try:
            results = self.simulate(fn, world_size, *args, case=case)
        except CheckFailed as failed:
            if not any(limit in str(failed) for limit in NOT_SIMULABLE):
                raise
        else:
            if not accept(results):
                return results
        return self.launch(fn, world_size, *args, case=case)

    def run_case(self, fn: Callable, world_size: int, *args, accept: Callable[[list], bool] = lambda r: True,
                 case: str | None = None):
        """:meth:`run` for one case of several: a crash is *returned*, so that it costs only this case.

        An unfinished exercise (:class:`NotDone`) or a deadlock (:class:`Deadlocked`)
        still ends the whole check: no other case could do better.
        """
        try:
            return self.run(fn, world_size, *args, accept=accept, case=case)
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
