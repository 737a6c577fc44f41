"""Which exercises there are, and the checks each one registers: the one place an exercise is named.

:data:`EXERCISES` names each exercise's module in this package, the learner's
functions it grades (in the order its ``check_<exercise>`` entry point takes them)
and that entry point's name. The module is imported the first time the exercise
is graded (:func:`checks_for`), and its ``@check`` decorators fill the registry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

__all__ = ["Exercise", "EXERCISES", "EXERCISE_MODULES", "RING", "Check", "check", "checks_for", "forget",
           "instead_of", "length_hint"]


@dataclass(frozen=True)
class Exercise:
    """An exercise: its name (the notebook's), its module in this package, its entry point and the learner's parts."""

    name: str
    module: str
    entry: str
    parts: tuple[str, ...]


EXERCISES = {e.name: e for e in (
    Exercise("01_ring_allreduce", "ring_allreduce", "check_ring_all_reduce", ("reduce_scatter", "all_gather")),
    Exercise("02_data_parallel", "data_parallel", "check_data_parallel",
             ("attach_gradient_averaging", "reduce_scatter_gradients")),
    Exercise("03_model_parallel", "model_parallel", "check_model_parallel", ("two_stage_step",)),
    Exercise("04_pipeline_schedule", "pipeline_schedule", "check_pipeline_schedule",
             ("one_f_one_b", "interleaved_one_f_one_b")),  # the second an optional stretch, graded as a bonus
    Exercise("05_tensor_parallel", "tensor_parallel", "check_tensor_parallel",
             ("ColumnParallelLinear", "RowParallelLinear", "CopyToParallelRegion", "ReduceFromParallelRegion")),
    Exercise("06_ring_attention", "ring_attention", "check_ring_attention", ("merge", "ring_attention_forward")),
    Exercise("07_dispatch_combine", "dispatch_combine", "check_dispatch_combine", ("dispatch", "combine")),
    Exercise("08_choose_a_layout", "choose_layout", "check_choose_layout", ("choose_layout",)),
    Exercise("09_find_the_bug", "find_the_bug", "check_find_the_bug",
             ("diagnosis", "train_step", "ring_sum", "make_replica")),
)}
# Exercise -> the module defining its checks.
EXERCISE_MODULES = {name: f"{__package__}.{e.module}" for name, e in EXERCISES.items()}
RING = "01_ring_allreduce"  # exercise 01's older name, as grading.RING (not collectives.RING, the ring's Collectives)


@dataclass
class Check:
    exercise: str
    name: str
    points: float
    fn: Callable
    hidden: bool = False
    timeout: float = 30.0
    description: str = ""
    requires: tuple[str, ...] = ()  # the checks of the answer this one measures a property of (see report.credited)
    allows: tuple[str, ...] = ()    # torch.distributed functions this check lets the learner call (guard.guarded)
    bonus: bool = False             # an optional stretch: its points add to the score, not to the maximum


_REGISTRY: dict[str, list[Check]] = {}


def check(exercise: str, points: float = 1, hidden: bool = False, timeout: float = 30.0, name: str | None = None,
          requires: tuple[str, ...] = (), allows: tuple[str, ...] = (), bonus: bool = False):
    """Register ``fn(submission, ctx)`` as a check of ``exercise``, worth ``points``.

    It passes by returning (optionally a fraction in [0, 1]), fails by raising
    :class:`~.scoring.CheckFailed`. ``hidden`` checks use world sizes and lengths the
    notebook does not show. ``timeout`` bounds each ``ctx.launch``. A check is
    known by its name: registering the same name again (re-running a notebook
    cell, reloading a module) replaces it where it stands.

    ``requires`` makes it a *property* of the answer those checks judge (its traffic, its edge cases, its
    hidden variants): it earns nothing unless each of them earns full marks (:func:`~.report.credited`, the
    one crediting rule of every exercise). ``allows`` names ``torch.distributed`` functions (``"broadcast"``)
    the learner may call in this check, though the guard switches them off in the exercise's others.

    ``bonus`` makes it part of an optional stretch: what it earns adds to the score, its points never to the
    maximum, and while the stretch is not written (NotImplementedError, or no function) it is "not attempted",
    which costs nothing (:class:`~.report.Report`).
    """
    def register(fn: Callable) -> Callable:
        new = Check(exercise, name or fn.__name__, points, fn, hidden, timeout, (fn.__doc__ or "").strip(),
                    tuple(requires), tuple(allows), bonus)
        checks = _REGISTRY.setdefault(exercise, [])
        for index, old in enumerate(checks):
            if old.name == new.name:
                checks[index] = new
                break
        else:
            checks.append(new)
        return fn

    return register


def checks_for(exercise: str) -> list[Check]:
    """The registered checks of ``exercise``, in the order they were defined (importing their module first)."""
    if exercise in EXERCISE_MODULES:
        importlib.import_module(EXERCISE_MODULES[exercise])  # once: Python caches the module
    if exercise not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(EXERCISE_MODULES))
        raise ValueError(f"no checks for exercise {exercise!r}; known exercises: {known}.")
    return list(_REGISTRY[exercise])


def forget(exercise: str) -> None:
    """Drop every check registered for ``exercise`` (an exercise defined in a test or a notebook cell)."""
    _REGISTRY.pop(exercise, None)


def length_hint(exercise: str | None) -> str | None:
    """The exercise module's ``LENGTH_HINT``: what a message that does not fit its receive asks, in its words."""
    if exercise not in EXERCISE_MODULES:
        return None
    return getattr(importlib.import_module(EXERCISE_MODULES[exercise]), "LENGTH_HINT", None)


def instead_of(exercise: str) -> str | None:
    """The exercise module's ``INSTEAD``: what to use instead of ``torch.distributed``, said when it is called."""
    if exercise not in EXERCISE_MODULES:
        return None
    return getattr(importlib.import_module(EXERCISE_MODULES[exercise]), "INSTEAD", None)
