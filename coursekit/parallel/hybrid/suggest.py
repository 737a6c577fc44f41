"""A refused layout's error: its reason, and a change that was checked to fit -- never a guess.

A check that refuses a layout returns a :class:`Refusal`: one sentence (what is wrong, what to change) and the
``fixes`` worth trying (``{"zero": 1}``, ``{"tp": 2}``). :func:`refuse` completes each fix to the job's ranks (the
fewest degrees changed, ``dp`` first: it is the axis that takes "the rest"), runs each candidate through the
caller's own check, and names the first one or two that pass:

    tp = 3 does not divide the model's 4 attention heads (each rank takes whole heads): use a tp that divides 4,
    e.g. tp = 4, or tp = 2 and dp = 2.

The error is a :class:`LayoutError` (a ``ValueError``) whose ``suggestion`` is that first change as a dict, so a
caller -- or a test -- can apply it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Refusal", "LayoutError", "refuse", "nearest"]

AXES = ("pp", "dp", "sp", "tp")  # as degrees.AXES (which imports this module, so it cannot be imported here)


@dataclass(frozen=True)
class Refusal:
    """Why a layout cannot run: ``reason`` (one sentence, no final full stop) and the ``fixes`` to try.

    ``fixes``: partial changes ``{setting: value}``, most wanted first; each is completed to the job's ranks.
    Empty: only the degrees are wrong (any degrees that multiply to the ranks may do). ``None``: nothing to
    suggest. ``example``: whether the sentence shows the change found (not where it already lists the choices).
    """

    reason: str
    fixes: tuple[dict, ...] | None = ()
    example: bool = True


class LayoutError(ValueError):
    """A layout refused before any rank starts; ``suggestion``: a change that passes the same check, or None."""

    def __init__(self, message: str, suggestion: dict | None = None):
        super().__init__(message)
        self.suggestion = suggestion


def refuse(refusal: Refusal, settings: dict, world_size: int, fits: Callable[[dict], bool], *,
           free: bool = False, rename: dict[str, str] | None = None) -> LayoutError:
    """The error for ``refusal`` of ``settings`` on ``world_size`` ranks, with up to two changes that ``fits``.

    ``settings``: the layout now, ``{setting: value}`` (the four degrees among them); ``fits(change)``: whether
    ``settings`` with ``change`` passes the caller's whole check. ``free``: the ranks are not fixed (the command
    line starts as many as the degrees make), so a fix is not completed to ``world_size``. ``rename`` maps the
    sentence's names to the caller's (``micro_batches`` -> ``microbatches``) in ``suggestion``.
    """
    changes = [] if refusal.fixes is None else _passing(refusal.fixes, settings, world_size, fits, free)
    text = refusal.reason
    if changes and refusal.example:
        text += ", e.g. " + ", or ".join(" and ".join(f"{k} = {v!r}" for k, v in c.items()) for c in changes)
    first = {(rename or {}).get(k, k): v for k, v in changes[0].items()} if changes else None
    return LayoutError(text + ".", first)


def _passing(fixes: tuple[dict, ...], settings: dict, world_size: int, fits, free: bool) -> list[dict]:
    """The change that fits with the fewest settings changed, and another fix's best if it is short and different."""
    candidates = []
    for rank, fix in enumerate(fixes or ({},)):
        for order, degrees in enumerate(_completions(settings, fix, world_size, free)):
            change = {k: v for k, v in {**fix, **degrees}.items() if settings.get(k) != v}
            if change:
                candidates.append(((len(change), rank, order), rank, change))
    found, settled = [], set()  # settled: the fixes whose best change that fits is known
    for _, rank, change in sorted(candidates, key=lambda c: c[0]):
        if rank in settled or not fits(change):
            continue
        settled.add(rank)
        if not found or _another(found[0], change):
            found.append(change)
            if len(found) == 2:
                break
    return found


def _another(first: dict, second: dict) -> bool:
    """Whether ``second`` is worth showing beside ``first``: other settings, and at most two of them (or as many)."""
    return set(second) != set(first) and len(second) <= max(2, len(first))


def _completions(settings: dict, fix: dict, world_size: int, free: bool) -> list[dict]:
    """The degrees that make ``fix`` whole on ``world_size`` ranks, nearest the layout first (dp changed first)."""
    base = {axis: fix.get(axis, settings.get(axis, 1)) for axis in AXES}
    if free:
        return [base]
    if not isinstance(world_size, int) or world_size < 1:
        return []

    def distance(degrees):
        changed = [axis for axis in AXES if degrees[axis] != base[axis]]
        return len(changed), sum(axis != "dp" for axis in changed)

    fixed = [axis for axis in AXES if axis in fix]
    found = [d for d in _factorizations(world_size) if all(d[axis] == fix[axis] for axis in fixed)]
    return sorted(found, key=distance)


def _factorizations(n: int) -> list[dict]:
    """Every ``{pp, dp, sp, tp}`` of whole numbers that multiply to ``n``."""
    def divisors(k):
        return [d for d in range(1, k + 1) if k % d == 0]

    return [{"pp": pp, "dp": dp, "sp": sp, "tp": n // (pp * dp * sp)}
            for pp in divisors(n) for dp in divisors(n // pp) for sp in divisors(n // (pp * dp))]


def nearest(name: str, value: int, allowed) -> tuple[dict, ...]:
    """Fixes ``{name: k}`` for each allowed ``k`` but ``value``, the nearest first (the larger of two as near)."""
    return tuple({name: k} for k in sorted(allowed, key=lambda k: (abs(k - value), -k)) if k != value)
