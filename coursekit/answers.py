"""The library's own answers to the exercises, by name, and the switch a grader uses to hold them back.

Exercise 01 asks for the ring's reduce-scatter and all-gather; coursekit has both (:mod:`coursekit.collectives.ring`), and
exercise 02 tells learners to import them. Exercise 04 asks for 1F1B with its messages; :mod:`coursekit.parallel.pipeline` has it and
``add_communication``, which places the messages;
exercise 06's merge and ring loop are :mod:`coursekit.parallel.sequence`'s ``merge`` and ``ring_attention``;
exercise 08's choice is what the planner computes. A learner who calls the library's function has written
nothing, so every function that answers an exercise is listed here, in :data:`ANSWERS`, by its qualified name --
the algorithm's own file carries no grading hook -- and while a grader runs the learner's code for that exercise
it holds them back (:func:`held_back`): calling one raises :class:`AnswerHeldBack`, whose message says what to
write instead. Everywhere else -- chapters, other exercises, the grader's own references -- they work as usual.

Holding back swaps the function's code for a refusal, in place, for as long as the block lasts: every path to
it is closed at once -- the name in its module, a re-export (``coursekit.ring_all_reduce``), a reference taken
before grading began, a ``functools.wraps`` chain's ``__wrapped__``. The switch is per process and counts
nesting, like ``grading.guard``'s: the simulator's ranks are threads of one process, each inside the block;
real ranks enter it in their own process.
"""

from __future__ import annotations

import importlib
import threading
from collections import Counter
from contextlib import contextmanager

__all__ = ["AnswerHeldBack", "ANSWERS", "WHOLE_NOTEBOOK", "answer_of", "resolve", "held_back", "hold_for_this_process",
           "is_held_back", "refuse", "released"]

_RING = "coursekit.collectives.ring."
_SCHEDULES = "coursekit.parallel.pipeline.schedules."
_SEQUENCE = "coursekit.parallel.sequence.core."
_PLANNER = "coursekit.costmodel.planner."
_TENSOR = "coursekit.parallel.tensor.core."
_EXPERT = "coursekit.parallel.expert.core."
_ACTIONS = "write each rank's list of actions yourself, its sends and receives included"
_CHOOSE = ("choose the degrees yourself from the numbers: evaluate(config, Layout(...), hardware, global_batch) "
           "prices one layout -- its memory, its step time and why")

#: qualified name -> (exercise, what the learner should write instead). The functions are held back while their
#: exercise is graded; a class listed here (exercise 05's layers) by the listed functions it calls. None of them
#: is shown in a chapter (:func:`coursekit.show` refuses them): chapter 07 states the capacity rule and runs
#: ``keep_within_capacity`` on one example, without showing the lines exercise 07's dispatch writes.
ANSWERS: dict[str, tuple[str, str]] = {
    _RING + "ring_reduce_scatter": ("01_ring_allreduce",
                                    "write the reduce-scatter's G-1 steps yourself with coursekit.comm"),
    _RING + "ring_all_gather": ("01_ring_allreduce", "write the all-gather's G-1 steps yourself with coursekit.comm"),
    _RING + "ring_all_reduce": ("01_ring_allreduce",
                                "write the reduce-scatter and the all-gather yourself with coursekit.comm"),
    **{_SCHEDULES + name: ("04_pipeline_schedule", _ACTIONS)
       for name in ("_schedule", "gpipe", "one_f_one_b", "interleaved_1f1b", "add_communication")},
    # f, g and the two layers are the answer: the layers held back by their forward (a subclass of the library's layer
    # inherits it), f and g by their forward and backward and the functions that apply them
    **{_TENSOR + name: ("05_tensor_parallel", "write f, g and the two layers yourself with the exercise's collectives")
       for name in ("ColumnParallelLinear", "RowParallelLinear", "ColumnParallelLinear.forward",
                    "RowParallelLinear.forward", "_Copy", "_Copy.forward", "_Copy.backward", "_Reduce",
                    "_Reduce.forward", "_Reduce.backward", "copy_to_parallel_region", "reduce_from_parallel_region")},
    _SEQUENCE + "merge": ("06_ring_attention",
                          "write the online-softmax merge yourself: weigh each part by e^(lse_i - lse)"),
    _SEQUENCE + "ring_attention": ("06_ring_attention",
                                   "write the ring loop yourself: block_attention, merge and PassRight, G steps"),
    **{_PLANNER + name: ("08_choose_a_layout", _CHOOSE) for name in ("layouts", "brute_force", "plan")},
    _EXPERT + "dispatch": ("07_dispatch_combine", "write dispatch yourself: exchange the counts (comm.control()), "
                                                  "send the rows with all_to_all, regroup what arrived by expert"),
    # dispatch keeps each expert within its capacity: the library's rule and the routing built on it are the answer
    **{_EXPERT + name: ("07_dispatch_combine", "keep each expert's assignments within capacity yourself, in dispatch: "
                                               "⌈factor·k·T/E⌉ of this rank's, first choices first, then token order")
       for name in ("keep_within_capacity", "route", "Routing.__init__")},
    _EXPERT + "combine": ("07_dispatch_combine", "write combine yourself: undo dispatch's regrouping, all_to_all "
                                                 "the rows back, add each into its token's row times its gate"),
}

#: Exercises whose answer a notebook could compute in any cell and hand back from the graded function (exercise 08's
#: layouts: one call of the planner per scenario, stored). ``coursekit grade`` holds their answers back from the
#: notebook's first cell (:func:`hold_for_this_process`), not only while the graded function runs.
WHOLE_NOTEBOOK = ("08_choose_a_layout",)

_lock = threading.Lock()
_held: Counter[str] = Counter()                  # exercise -> how many blocks hold its answers back now
_saved: dict[str, list[tuple[object, object]]] = {}  # exercise -> (function, its own code), while held back


class AnswerHeldBack(RuntimeError):
    """The learner's code called the library's own answer to the exercise being graded."""


def is_held_back(exercise: str) -> bool:
    return _held[exercise] > 0


def answer_of(obj) -> str | None:
    """The exercise ``obj`` (a function or class of the library) answers, or None."""
    entry = ANSWERS.get(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
    return entry[0] if entry else None


def resolve(qualified: str):
    """The object ``"package.module.Class.method"`` names (None if there is none): the longest importable prefix
    is the module, the rest attributes."""
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def refuse(qualified: str):
    """What a held-back answer runs instead of its own code: raise :class:`AnswerHeldBack`, saying what to write."""
    exercise, instead = ANSWERS[qualified]
    raise AnswerHeldBack(f"{qualified} was called: it is coursekit's own answer to exercise {exercise}, so it earns "
                         f"no credit there -- {instead}.")


def _refusal(*args, **kwargs):  # a template: its constant "QUALIFIED" becomes each answer's name
    __import__("coursekit.answers", fromlist=["refuse"]).refuse("QUALIFIED")


def _functions(exercise: str) -> list[tuple[str, object]]:
    """The functions listed for ``exercise`` (classes are held back by what they call)."""
    out = []
    for qualified, (owner, _) in ANSWERS.items():
        obj = resolve(qualified)
        if owner == exercise and callable(obj) and hasattr(obj, "__code__"):
            out.append((qualified, obj))
    return out


@contextmanager
def held_back(exercise: str):
    """Inside the block, every function :data:`ANSWERS` lists for ``exercise`` raises :class:`AnswerHeldBack`."""
    with _lock:
        if _held[exercise] == 0:
            saved = []
            for qualified, fn in _functions(exercise):
                code = _refusal.__code__
                consts = tuple(qualified if c == "QUALIFIED" else c for c in code.co_consts)
                saved.append((fn, fn.__code__))
                # the refusal runs with the answer's own globals: it reaches this module through __import__
                fn.__code__ = code.replace(co_consts=consts, co_name=fn.__code__.co_name,
                                           co_qualname=fn.__code__.co_qualname)
            _saved[exercise] = saved
        _held[exercise] += 1
    try:
        yield
    finally:
        with _lock:
            _held[exercise] -= 1
            if _held[exercise] == 0:
                for fn, code in _saved.pop(exercise):
                    fn.__code__ = code


_process_holds: list = []  # the blocks hold_for_this_process entered: never left, while the process lives


def hold_for_this_process(exercise: str) -> None:
    """Hold ``exercise``'s answers back for the rest of this process: ``coursekit grade`` runs this first in the
    kernel of a notebook of :data:`WHOLE_NOTEBOOK`, so no cell can call them and keep the result for later."""
    block = held_back(exercise)
    block.__enter__()
    _process_holds.append(block)


@contextmanager
def released(exercise: str):
    """Inside the block ``exercise``'s answers run as themselves even where they are held back: the grader's own
    reference (exercise 08's best layout), computed while the learner's whole notebook is held."""
    with _lock:
        held = list(_saved.get(exercise, []))
        refusals = [(fn, fn.__code__) for fn, _ in held]
        for fn, code in held:
            fn.__code__ = code
    try:
        yield
    finally:
        with _lock:
            if _held[exercise] > 0:
                for fn, refusal in refusals:
                    fn.__code__ = refusal
