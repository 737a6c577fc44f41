"""Grade the course's exercises: from a notebook cell, or ``coursekit grade PATH``.

In an exercise notebook::

    from coursekit import grading
    grading.grade("01_ring_allreduce", reduce_scatter=my_reduce_scatter, all_gather=my_all_gather)

prints one line per check (points earned, what went wrong, for which world
size, length and segment) and returns a :class:`Report`. It never raises: an
unfinished exercise scores zero and the notebook keeps running.

From a shell, ``coursekit grade exercises/01_ring_allreduce.ipynb`` executes a
*copy* of the notebook (your file is never touched), prints the score table
and exits 0 only on full marks.

Writing checks for a chapter::

    @grading.check("02_data_parallel", points=2, hidden=True)
    def averages_gradients(submission, ctx):
        results = ctx.launch(some_rank_function, 4, submission.average)   # real ranks, per-check timeout
        if wrong:
            raise grading.CheckFailed("world size 4: rank 2's gradient is the sum, not the mean", fraction=0.5)

Inside ``ctx.launch`` every rank runs with ``torch.distributed``'s collectives
(and its raw send/recv) replaced by a function that raises and explains: an
exercise that asks for a ring built from ``coursekit.comm`` cannot pass by
calling ``dist.all_reduce``, and everything it sends is counted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from . import comm
from .launch import LaunchTimeout, RankError, launch

__all__ = ["check", "CheckFailed", "Check", "Result", "Report", "grade", "checks_for", "check_ring_all_reduce",
           "main", "REPORT_ENV"]

REPORT_ENV = "COURSEKIT_GRADE_REPORT"  # where grade() also writes its results (set by `coursekit grade`)


class CheckFailed(AssertionError):
    """Raise in a check: ``message`` is shown to the learner; ``fraction`` of the points is still earned."""

    def __init__(self, message: str, fraction: float = 0.0):
        super().__init__(message)
        self.fraction = max(0.0, min(1.0, fraction))


class NotDone(CheckFailed):
    """The learner's function still raises NotImplementedError."""


class Deadlocked(CheckFailed):
    """The check ran past its timeout (usually a receive nobody sends to)."""


@dataclass
class Check:
    exercise: str
    name: str
    points: float
    fn: Callable
    hidden: bool = False
    timeout: float = 30.0
    description: str = ""


_REGISTRY: dict[str, list[Check]] = {}

# Exercise -> module defining its checks (imported on demand by `coursekit grade`).
EXERCISE_MODULES = {"01_ring_allreduce": "coursekit.grading", "02_data_parallel": "coursekit.checks.data_parallel"}


def check(exercise: str, points: float = 1, hidden: bool = False, timeout: float = 30.0, name: str | None = None):
    """Register ``fn(submission, ctx)`` as a check of ``exercise``, worth ``points``.

    It passes by returning (optionally a fraction in [0, 1]), fails by raising
    :class:`CheckFailed`. ``hidden`` checks use world sizes and lengths the
    notebook does not show. ``timeout`` bounds each ``ctx.launch``.
    """
    def register(fn: Callable) -> Callable:
        checks = _REGISTRY.setdefault(exercise, [])
        check_name = name or fn.__name__
        checks[:] = [c for c in checks if c.name != check_name]  # re-running a cell replaces, not duplicates
        checks.append(Check(exercise, check_name, points, fn, hidden, timeout, (fn.__doc__ or "").strip()))
        return fn

    return register


def checks_for(exercise: str) -> list[Check]:
    """The registered checks of ``exercise`` (importing the module that defines them)."""
    if exercise not in _REGISTRY and exercise in EXERCISE_MODULES:
        __import__(EXERCISE_MODULES[exercise])
    if exercise not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(EXERCISE_MODULES))
        raise ValueError(f"no checks for exercise {exercise!r}; known exercises: {known}.")
    return list(_REGISTRY[exercise])


# --------------------------------------------------------------------------
# Running checks: real ranks, a timeout, no built-in collectives.
# --------------------------------------------------------------------------
FORBIDDEN = ["all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
             "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter", "all_reduce_coalesced",
             "all_gather_object", "broadcast_object_list", "_reduce_scatter_base", "_all_gather_base",
             "send", "recv", "isend", "irecv", "batch_isend_irecv"]


class ForbiddenCall(RuntimeError):
    pass


@contextmanager
def forbid_torch_collectives():
    """Inside the block, ``torch.distributed``'s collectives and raw send/recv raise :class:`ForbiddenCall`.

    ``coursekit.comm`` keeps working: it bound the real functions at import.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def forbidden(name):
        def call(*args, **kwargs):
            hint = ("use coursekit.comm.send/recv/isend/irecv, so that every transfer is counted"
                    if name in ("send", "recv", "isend", "irecv", "batch_isend_irecv")
                    else "build it from coursekit.comm.send/recv/isend/irecv")
            raise ForbiddenCall(f"torch.distributed.{name} was called: this exercise asks you to {hint}.")
        return call

    saved = [(module, name, getattr(module, name)) for module in (dist, c10d) for name in FORBIDDEN
             if hasattr(module, name)]
    for module, name, _ in saved:
        setattr(module, name, forbidden(name))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def _guarded(fn):
    def rank_main(rank, world_size, *args):
        with forbid_torch_collectives():
            return fn(rank, world_size, *args)
    return rank_main


class Context:
    """What a check gets besides the submission: ``launch`` with the check's timeout and guard."""

    def __init__(self, check_: Check, timeout: float):
        self.check, self.timeout = check_, timeout

    def launch(self, fn: Callable, world_size: int, *args) -> list:
        """Run ``fn(rank, world_size, *args)`` on real ranks; learner errors become :class:`CheckFailed`."""
        try:
            return launch(_guarded(fn), world_size, *args, timeout=self.timeout)
        except LaunchTimeout as error:
            waits = "; ".join(f"rank {r}: {w}" for r, w in sorted(error.waiting.items()))
            raise Deadlocked(f"world size {world_size}: ranks still running after {self.timeout:g} s, stopped. "
                             f"A deadlock? {waits}") from None
        except RankError as error:
            raise _explain(error, world_size) from None


def _explain(error: RankError, world_size: int) -> CheckFailed:
    last = error.remote_traceback.strip().splitlines()[-1] if error.remote_traceback.strip() else str(error)
    if "NotImplementedError" in error.remote_traceback:
        return NotDone("not implemented yet (your function raises NotImplementedError)")
    if "ForbiddenCall" in error.remote_traceback:
        return CheckFailed(last.split(": ", 1)[-1])
    return CheckFailed(f"rank {error.rank} raised {last}")


# --------------------------------------------------------------------------
# Results and the report.
# --------------------------------------------------------------------------
@dataclass
class Result:
    name: str
    points: float
    earned: float
    status: str          # pass, partial, fail, not done, timeout, skipped
    feedback: str = ""
    hidden: bool = False
    seconds: float = 0.0


@dataclass
class Report:
    exercise: str
    results: list = field(default_factory=list)
    note: str = ""

    @property
    def score(self) -> float:
        return round(sum(r.earned for r in self.results), 2)

    @property
    def max_score(self) -> float:
        return round(sum(r.points for r in self.results), 2)

    @property
    def full_marks(self) -> bool:
        return bool(self.results) and all(r.earned >= r.points for r in self.results)

    def table(self) -> str:
        width = max([len(r.name) + (9 if r.hidden else 0) for r in self.results] + [5])
        lines = [f"{self.exercise}: {_fmt(self.score)} / {_fmt(self.max_score)} points", ""]
        lines.append(f"{'check':<{width}}  {'points':>7}  result")
        for r in self.results:
            label = r.name + (" (hidden)" if r.hidden else "")
            lines.append(f"{label:<{width}}  {_fmt(r.earned):>3}/{_fmt(r.points):<3}  {r.status}")
            for line in r.feedback.splitlines():
                lines.append(f"{'':<{width}}           {line}")
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(f"Report({self.exercise!r}, {_fmt(self.score)}/{_fmt(self.max_score)})")


def _fmt(x: float) -> str:
    return f"{x:g}"


def grade(exercise: str, *, only: list[str] | str | None = None, timeout: float | None = None,
          verbose: bool = True, **submission: Any) -> Report:
    """Run the checks of ``exercise`` on ``submission`` (keyword arguments: the learner's functions).

    ``only`` limits it to some checks (by name); ``timeout`` overrides each
    check's. Prints the table unless ``verbose=False``; never raises for the
    learner's mistakes. Also writes the results to ``$COURSEKIT_GRADE_REPORT``
    when set (that is how ``coursekit grade`` reads them).
    """
    checks = checks_for(exercise)
    if only is not None:
        wanted = [only] if isinstance(only, str) else list(only)
        unknown = set(wanted) - {c.name for c in checks}
        if unknown:
            raise ValueError(f"unknown checks {sorted(unknown)}; {exercise} has {[c.name for c in checks]}.")
        checks = [c for c in checks if c.name in wanted]
    namespace = SimpleNamespace(**submission)
    report, stuck = Report(exercise), None
    for item in checks:
        start = time.perf_counter()
        if stuck is not None:
            report.results.append(Result(item.name, item.points, 0.0, "skipped",
                                         f"not run: {stuck} timed out first; fix that deadlock", item.hidden))
            continue
        try:
            outcome = item.fn(namespace, Context(item, timeout or item.timeout))
            fraction = 1.0 if outcome is None else float(outcome)
            status, feedback = ("pass" if fraction >= 1 else "partial"), ""
        except NotDone as failed:
            fraction, status, feedback = 0.0, "not done", str(failed)
        except Deadlocked as failed:
            fraction, status, feedback, stuck = 0.0, "timeout", str(failed), item.name
        except CheckFailed as failed:
            fraction, feedback = failed.fraction, str(failed)
            status = "partial" if fraction > 0 else "fail"
        except NotImplementedError:
            fraction, status, feedback = 0.0, "not done", "not implemented yet (NotImplementedError)"
        except Exception as error:  # a learner's function can fail in any way: report, never crash the notebook
            fraction, status, feedback = 0.0, "fail", f"{type(error).__name__}: {error}"
        earned = round(item.points * fraction, 2)
        report.results.append(Result(item.name, item.points, earned, status, feedback, item.hidden,
                                     round(time.perf_counter() - start, 2)))
    if verbose:
        print(report.table())
    _save(report)
    return report


def _save(report: Report) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        saved = {}
    entry = saved.setdefault(report.exercise, {})
    for result in report.results:  # the latest result of each check wins
        entry[result.name] = asdict(result)
    Path(path).write_text(json.dumps(saved, indent=1))


# --------------------------------------------------------------------------
# `coursekit grade PATH`
# --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``coursekit grade NOTEBOOK``: execute a copy, print the score table; 0 only on full marks."""
    parser = argparse.ArgumentParser(prog="coursekit grade", description=main.__doc__)
    parser.add_argument("notebook", type=Path, help="an exercise notebook, e.g. exercises/01_ring_allreduce.ipynb")
    parser.add_argument("--exercise", help="exercise name (default: the notebook's file name)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per notebook cell (default 600)")
    options = parser.parse_args(argv)
    path: Path = options.notebook
    if not path.is_file():
        print(f"coursekit grade: no such notebook: {path}", file=sys.stderr)
        return 2
    exercise = options.exercise or path.stem
    try:
        checks = checks_for(exercise)
    except ValueError as error:
        print(f"coursekit grade: {error} (pass --exercise NAME)", file=sys.stderr)
        return 2
    note = ""
    with tempfile.TemporaryDirectory(prefix="coursekit-grade-") as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)  # the learner's file is only ever read
        report_path = Path(tmp) / "report.json"
        previous = os.environ.get(REPORT_ENV)
        os.environ[REPORT_ENV] = str(report_path)
        os.environ.setdefault("MPLBACKEND", "agg")
        try:
            import papermill

            papermill.execute_notebook(str(copy), str(Path(tmp) / ("executed-" + path.name)), kernel_name="python3",
                                       cwd=tmp, execution_timeout=int(options.timeout), progress_bar=False,
                                       log_output=False)
        except Exception as error:  # the learner's notebook may fail anywhere: grade what ran
            first = str(error).strip().splitlines()
            note = "the notebook stopped with an error before the end: " + (first[-1] if first else type(error).__name__)
        finally:
            if previous is None:
                os.environ.pop(REPORT_ENV, None)
            else:
                os.environ[REPORT_ENV] = previous
        try:
            saved = json.loads(report_path.read_text()).get(exercise, {})
        except (OSError, ValueError):
            saved = {}
    report = Report(exercise, note=note)
    for item in checks:
        if item.name in saved:
            report.results.append(Result(**saved[item.name]))
        else:
            report.results.append(Result(item.name, item.points, 0.0, "not run",
                                         "the notebook never ran this check", item.hidden))
    print(report.table())
    return 0 if report.full_marks else 1


# ==========================================================================
# Chapter 01: the ring all-reduce (exercises/01_ring_allreduce.ipynb).
# The learner writes reduce_scatter(tensor, group=None) -> owned segment and
# all_gather(segment, out, group=None) with coursekit.comm, following the
# schedule of coursekit.collectives (rank r ends owning segment (r+1) % G).
# ==========================================================================
RING = "01_ring_allreduce"


def check_ring_all_reduce(reduce_scatter: Callable, all_gather: Callable, **options: Any) -> Report:
    """Grade chapter 01's exercise: ``grading.check_ring_all_reduce(my_reduce_scatter, my_all_gather)``."""
    return grade(RING, reduce_scatter=reduce_scatter, all_gather=all_gather, **options)


def _ring_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers: every sum is exact in every dtype, so answers compare exactly."""
    generator = torch.Generator().manual_seed(7919 * rank + numel)
    return torch.randint(-8, 9, (numel,), generator=generator).to(dtype)


def _ring_sum(world_size: int, numel: int, dtype: torch.dtype, ranks=None) -> torch.Tensor:
    total = torch.zeros(numel, dtype=torch.float64)
    for r in (range(world_size) if ranks is None else ranks):
        total += _ring_input(r, numel, dtype).double()
    return total


def _rs_rank(rank, world_size, reduce_scatter, cases):
    out = []
    for numel, dtype in cases:
        with comm.record() as traffic:
            segment = reduce_scatter(_ring_input(rank, numel, dtype))
        out.append((segment.detach().clone() if isinstance(segment, torch.Tensor) else repr(type(segment)), traffic))
    return out


def _segment_feedback(rank: int, world_size: int, numel: int, dtype, got) -> str | None:
    """None if ``got`` is rank's fully reduced owned segment, else what is wrong with it."""
    from .collectives import owned_segment, segment_bounds

    where = f"world size {world_size}, length {numel}, {str(dtype).replace('torch.', '')}, rank {rank}"
    own = owned_segment(rank, world_size) if world_size > 1 else 0
    bounds = segment_bounds(numel, world_size) if world_size > 1 else [(0, numel)]
    start, stop = bounds[own]
    full = _ring_sum(world_size, numel, dtype)
    if isinstance(got, str):
        return f"{where}: returned {got}, expected a tensor (the view of segment {own})"
    got = got.reshape(-1).double()
    if got.numel() == stop - start and torch.equal(got, full[start:stop]):
        return None
    expected = f"segment {own} = elements {start}:{stop} ({stop - start} of them), summed over all {world_size} ranks"
    for k, (a, b) in enumerate(bounds):
        if k != own and b - a == got.numel() and b > a and torch.equal(got, full[a:b]):
            return f"{where}: returned the complete segment {k}, but the ring leaves rank r owning segment (r+1) % G; expected {expected}"
    if got.numel() != stop - start:
        hint = " (the whole tensor?)" if got.numel() == numel and world_size > 1 else ""
        return f"{where}: returned {got.numel()} elements{hint}; expected {expected}"
    mine = _ring_input(rank, numel, dtype).double()[start:stop]
    if torch.equal(got, mine):
        return f"{where}: segment {own} is unchanged: nothing was added into it; expected {expected}"
    for count in range(2, world_size):  # a partial sum along the ring: too few steps?
        ranks = [(rank + 1 - i) % world_size for i in range(count)]
        if torch.equal(got, _ring_sum(world_size, numel, dtype, ranks)[start:stop]):
            return (f"{where}: segment {own} holds the sum of only {count} of {world_size} ranks "
                    f"(a ring needs G-1 = {world_size - 1} steps); expected {expected}")
    wrong = int((got != full[start:stop]).sum())
    return f"{where}: segment {own} is wrong at {wrong} of {stop - start} elements; expected {expected}"


def _per_case(ctx, rank_fn, world_size, learner_fn, cases):
    """Run all cases in one launch; if that crashes, one launch per case, so a crash costs only its case.

    Yields ``(numel, dtype, per-rank results or the CheckFailed)``.
    """
    try:
        results = ctx.launch(rank_fn, world_size, learner_fn, cases)
        for index, (numel, dtype) in enumerate(cases):
            yield numel, dtype, [r[index] for r in results]
        return
    except (NotDone, Deadlocked):
        raise
    except CheckFailed:
        pass
    for numel, dtype in cases:
        try:
            yield numel, dtype, [r[0] for r in ctx.launch(rank_fn, world_size, learner_fn, [(numel, dtype)])]
        except (NotDone, Deadlocked):
            raise
        except CheckFailed as failed:
            yield numel, dtype, failed


def _score_reduce_scatter(submission, ctx, plan) -> float:
    problems, total = [], 0
    for world_size, cases in plan:
        for numel, dtype, results in _per_case(ctx, _rs_rank, world_size, submission.reduce_scatter, cases):
            total += 1
            if isinstance(results, CheckFailed):
                problems.append(f"world size {world_size}, length {numel}: {results}")
                continue
            bad = [f for f in (_segment_feedback(r, world_size, numel, dtype, results[r][0])
                               for r in range(world_size)) if f]
            if bad:
                problems.append(bad[0] + (f" (and {len(bad) - 1} more ranks)" if len(bad) > 1 else ""))
    if problems:
        raise CheckFailed("\n".join(problems), fraction=(total - len(problems)) / total)
    return 1.0


def _ag_rank(rank, world_size, all_gather, cases):
    from .collectives import owned_segment, segment_bounds

    out = []
    for numel, dtype in cases:
        full = _ring_sum(world_size, numel, dtype).to(dtype)
        start, stop = segment_bounds(numel, world_size)[owned_segment(rank, world_size)]
        target = torch.zeros(numel, dtype=dtype)
        target[start:stop] = full[start:stop]
        with comm.record() as traffic:
            all_gather(target[start:stop], target)
        out.append((target, traffic))
    return out


def _score_all_gather(submission, ctx, plan) -> float:
    from .collectives import segment_bounds

    problems, total = [], 0
    for world_size, cases in plan:
        for numel, dtype, results in _per_case(ctx, _ag_rank, world_size, submission.all_gather, cases):
            total += 1
            if isinstance(results, CheckFailed):
                problems.append(f"world size {world_size}, length {numel}: {results}")
                continue
            full = _ring_sum(world_size, numel, dtype)
            bounds = segment_bounds(numel, world_size)
            for rank in range(world_size):
                got = results[rank][0].double()
                wrong = [k for k, (a, b) in enumerate(bounds) if not torch.equal(got[a:b], full[a:b])]
                if wrong:
                    problems.append(f"world size {world_size}, length {numel}: after all_gather rank {rank} has "
                                    f"wrong values in segment{'s' if len(wrong) > 1 else ''} "
                                    f"{', '.join(map(str, wrong))} (segment k = elements {bounds[wrong[0]][0]}:"
                                    f"{bounds[wrong[0]][1]} for k = {wrong[0]})")
                    break
    if problems:
        raise CheckFailed("\n".join(problems), fraction=(total - len(problems)) / total)
    return 1.0


def _both_rank(rank, world_size, reduce_scatter, all_gather, numel, dtype):
    x = _ring_input(rank, numel, dtype)
    with comm.record() as traffic:
        mine = reduce_scatter(x)
        all_gather(mine, x)
    return x, traffic


F32 = torch.float32


@check(RING, points=3)
def reduce_scatter_correct(submission, ctx):
    """reduce_scatter returns each rank's fully reduced segment: G = 2, 3, 4; lengths divisible or not."""
    return _score_reduce_scatter(submission, ctx, [(2, [(8, F32), (9, F32)]), (3, [(12, F32), (10, F32)]),
                                                  (4, [(16, F32), (10, F32)])])


@check(RING, points=2)
def all_gather_correct(submission, ctx):
    """all_gather gives every rank every segment: G = 2, 3, 4."""
    return _score_all_gather(submission, ctx, [(2, [(8, F32), (9, F32)]), (3, [(10, F32)]), (4, [(10, F32)])])


@check(RING, points=1)
def all_reduce_bit_identical(submission, ctx):
    """reduce_scatter then all_gather = all-reduce, with the same bits on every rank (G = 4, length 1001)."""
    world_size, numel = 4, 1001
    results = ctx.launch(_both_rank, world_size, submission.reduce_scatter, submission.all_gather, numel,
                         torch.float32)
    full = _ring_sum(world_size, numel, torch.float32)
    for rank, (x, _) in enumerate(results):
        if not torch.equal(x.double(), full):
            raise CheckFailed(f"world size {world_size}, length {numel}: rank {rank} does not hold the sum after "
                              f"reduce_scatter + all_gather")
    random = ctx.launch(_random_all_reduce, world_size, submission.reduce_scatter, submission.all_gather, numel)
    if any(not torch.equal(r, random[0]) for r in random):
        raise CheckFailed("ranks disagree in the last bits: each segment must be summed in one order, along the "
                          "ring, then copied; data-parallel replicas would drift apart")


def _random_all_reduce(rank, world_size, reduce_scatter, all_gather, numel):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    all_gather(reduce_scatter(x), x)
    return x


@check(RING, points=2)
def ring_traffic_pattern(submission, ctx):
    """Only neighbours talk, one segment per message, exactly 2·(G−1)·N elements in all (G = 3 and 4)."""
    from .collectives import ring_traffic

    problems, correct_results = [], True
    for world_size, numel in ((4, 10), (3, 7)):
        results = ctx.launch(_both_rank, world_size, submission.reduce_scatter, submission.all_gather, numel, F32)
        full = _ring_sum(world_size, numel, F32)
        correct = all(torch.equal(x.double(), full) for x, _ in results)
        correct_results &= correct
        traffic = comm.Traffic.merge([t for _, t in results])
        expected = 2 * (world_size - 1) * numel
        where = f"world size {world_size}, length {numel}"
        if traffic.total == 0:
            problems.append(f"{where}: no transfer went through coursekit.comm: send with comm.isend/comm.send "
                            f"and receive with comm.irecv/comm.recv so the ring can be counted")
            continue
        strangers = sorted({(t.src, t.dst) for t in traffic.payload if t.dst != (t.src + 1) % world_size})
        if strangers:
            src, dst = strangers[0]
            problems.append(f"{where}: rank {src} sent to rank {dst}; in a ring each rank sends only to its right "
                            f"neighbour, rank (r+1) % G = {(src + 1) % world_size}")
        biggest = max(traffic.payload, key=lambda t: t.numel)
        if biggest.numel > math.ceil(numel / world_size):
            problems.append(f"{where}: rank {biggest.src} sent {biggest.numel} elements in one message"
                            f"{' (the whole tensor)' if biggest.numel == numel else ''}; a ring step sends one "
                            f"segment, at most ceil(N/G) = {math.ceil(numel / world_size)} elements")
        if traffic.total != expected:
            ratio = traffic.total / expected
            problems.append(f"{where}: {'correct result but ' if correct else ''}{ratio:.3g}× the expected traffic "
                            f"({traffic.total} elements moved; a ring moves 2·(G−1)·N = {expected})")
        elif traffic.sent != ring_traffic(numel, world_size):
            problems.append(f"{where}: per-rank sends {traffic.sent}, expected {ring_traffic(numel, world_size)}")
    if problems:
        raise CheckFailed("\n".join(problems))
    if not correct_results:
        raise CheckFailed("the traffic pattern is a ring, but the results are wrong (see the checks above)",
                          fraction=0.5)


@check(RING, points=1)
def only_point_to_point(submission, ctx):
    """Built from coursekit.comm point-to-point only: no torch.distributed collectives (G = 4)."""
    results = ctx.launch(_both_rank, 4, submission.reduce_scatter, submission.all_gather, 12, F32)
    if comm.Traffic.merge([t for _, t in results]).total == 0:
        raise CheckFailed("nothing was sent through coursekit.comm: use comm.isend/comm.irecv (or send/recv)")


@check(RING, points=1, hidden=True)
def edge_cases(submission, ctx):
    """Lengths shorter than the world size, zero, and a world of one rank."""
    _score_reduce_scatter(submission, ctx, [(4, [(2, F32), (0, F32)]), (1, [(5, F32)])])
    _score_all_gather(submission, ctx, [(4, [(3, F32), (0, F32)]), (1, [(5, F32)])])


@check(RING, points=2, hidden=True)
def hidden_variants(submission, ctx):
    """World sizes and lengths the notebook does not show, float64 and float16 too."""
    plan = [(5, [(1001, torch.float64), (5, F32)]), (6, [(50, F32)]), (3, [(7, torch.float16)])]
    _score_reduce_scatter(submission, ctx, plan)
    _score_all_gather(submission, ctx, plan)
