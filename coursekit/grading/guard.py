"""The guard around the learner's code: ``torch.distributed``'s collectives and raw send/recv switched off.

An exercise that asks for a ring built from ``coursekit.comm`` must not pass by
calling ``dist.all_reduce``; and everything the learner sends must go through
``coursekit.comm``, where it is counted. So while a check runs the learner's code
(on real ranks or in the simulator), :func:`forbid_torch_collectives` replaces
each of :data:`FORBIDDEN` by a function that raises :class:`ForbiddenCall` and
says what to use instead. Likewise coursekit's own answer to the exercise
(``coursekit.ring_reduce_scatter`` in exercise 01) is held back while the learner's
code runs (:mod:`coursekit.answers`), so wrapping it earns nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from typing import Callable

from ..answers import held_back
from .rank_deaths import quiet_rank

__all__ = ["FORBIDDEN", "ForbiddenCall", "forbid_torch_collectives", "guarded"]

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
def forbid_torch_collectives(instead: str | None = None, allow: tuple[str, ...] = ()):
    """Inside the block, ``torch.distributed``'s collectives and raw send/recv raise :class:`ForbiddenCall`.

    ``allow`` names the ones a check lets the learner call (exercise 09's program C: ``broadcast``, the fix
    chapter 09 teaches).

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
                                   for name in FORBIDDEN if hasattr(module, name) and name not in allow]
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


def guarded(fn: Callable, instead: str | None, logs: str | None = None, exercise: str | None = None,
            allow: tuple[str, ...] = ()) -> Callable:
    """``fn(rank, world_size, *args)`` run inside the guard, its C-level output kept in ``logs`` (see rank_deaths).

    With ``exercise``, the library's own answers to it are held back too (:func:`coursekit.answers.held_back`):
    a learner who wraps ``coursekit.ring_reduce_scatter`` in exercise 01 has written no ring. ``allow``: the
    ``torch.distributed`` functions the check lets through (:func:`forbid_torch_collectives`).
    """
    def rank_main(rank, world_size, *args):
        with quiet_rank(logs, rank), forbid_torch_collectives(instead, allow), \
                (held_back(exercise) if exercise else nullcontext()):
            return fn(rank, world_size, *args)
    return rank_main
