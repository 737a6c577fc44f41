"""Where a ring attempt first leaves the ring's schedule, said in the seed's labels.

"GPU2 should add a₁ into b₁ (its segment (r − s − 1) mod G = 0); it added it into b₂": to say
that, we need to know which *labels* every message and every segment holds.
The trick: run the code once per label, in the simulator, on an input that is
1 at that label and 0 everywhere else (one element per segment, N = G). A ring
only copies and adds, so element values are linear in the inputs, and run
``i`` reads off the coefficient of label ``i`` in every message sent and
every element of the final tensors. Stacked over the runs, each message and each
segment becomes a vector of coefficients: ``a₁+b₁`` is 1 at a₁ and b₁, 0 elsewhere.

The same is done for the chapter's reference ring; then :func:`first_difference`
walks both step by step (the ``s``-th message on each link is step ``s``) and
reports the first message that differs, or the first message the receiver put
in the wrong segment. Code whose messages are not the same in every run (it
branches on values, or crashes, or deadlocks) gets no diagnosis: None.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import torch

from .. import comm
from ..collectives.ring import owned_segment, ring_all_gather, ring_reduce_scatter
from ..collectives.walkthrough import seed_label

__all__ = ["diagnose", "first_difference", "trace"]

RS, AG = "reduce-scatter", "all-gather"


class Trace(NamedTuple):
    """Coefficients (elements × labels) of everything a run sent, ended with and returned."""

    messages: list      # per rank: [(dst, coefficients), ...] in the order sent
    final: list         # per rank: coefficients of its whole tensor afterwards
    returned: list      # per rank: (segment index of the returned view or None, coefficients)


def _labels(phase: str, world_size: int) -> list[str]:
    """RS: every rank's every segment (a₁ … d₄); AG: every complete segment ((a₁+b₁+c₁+d₁) …)."""
    if phase == RS:
        return [seed_label(r, k) for r in range(world_size) for k in range(world_size)]
    return ["(" + "+".join(seed_label(r, k) for r in range(world_size)) + ")" for k in range(world_size)]


def _input(phase: str, rank: int, world_size: int, label: int) -> torch.Tensor:
    x = torch.zeros(world_size)
    if phase == RS and label // world_size == rank:
        x[label % world_size] = 1.0  # rank r's segment k is label r·G + k
    if phase == AG and owned_segment(rank, world_size) == label:
        x[label] = 1.0               # the complete segment k starts on the rank that owns it
    return x


def _segment_of(view, base: torch.Tensor) -> int | None:
    """Which element (= segment, N = G) of ``base`` the view ``view`` starts at; None if it is not inside it."""
    if not isinstance(view, torch.Tensor) or view.numel() == 0:
        return None
    offset = (view.data_ptr() - base.data_ptr()) // base.element_size()
    return offset if view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr() else None


def _one_run(rank: int, world_size: int, phase: str, fn: Callable, label: int):
    x = _input(phase, rank, world_size, label)
    if phase == RS:
        out = fn(x)
    else:
        own = owned_segment(rank, world_size)
        out = fn(x[own:own + 1], x)
    if not isinstance(out, torch.Tensor):
        out = x
    return x.clone(), _segment_of(out, x), out.detach().reshape(-1).clone()


def trace(phase: str, fn: Callable, world_size: int, simulate: Callable) -> Trace | None:
    """Run ``fn`` once per label with ``simulate(rank_fn, G, *args, on_send=...)``; None if it is not linear."""
    runs = []
    for label in range(len(_labels(phase, world_size))):
        sent: list[list] = [[] for _ in range(world_size)]

        def on_send(src, dst, message, kind, sent=sent):
            if kind == "payload":
                sent[src].append((dst, message.reshape(-1).double()))
        try:
            results = simulate(_one_run, world_size, phase, fn, label, on_send=on_send)
        except Exception:  # a crash or a deadlock: its own feedback says more than a schedule could
            return None
        runs.append((sent, results))
    first_sent, first_results = runs[0]
    shape = [[(dst, m.numel()) for dst, m in rank] for rank in first_sent]
    if any([[(dst, m.numel()) for dst, m in rank] for rank in sent] != shape for sent, _ in runs):
        return None  # a different schedule for different values
    if any([r[1] for r in results] != [r[1] for r in first_results] or
           [r[2].numel() for r in results] != [r[2].numel() for r in first_results] for _, results in runs):
        return None
    stack = lambda tensors: torch.stack([t.double() for t in tensors], dim=-1)  # noqa: E731 (elements × labels)
    messages = [[(dst, stack([sent[src][i][1] for sent, _ in runs])) for i, (dst, _) in enumerate(first_sent[src])]
                for src in range(world_size)]
    final = [stack([results[r][0] for _, results in runs]) for r in range(world_size)]
    returned = [(first_results[r][1], stack([results[r][2] for _, results in runs])) for r in range(world_size)]
    return Trace(messages, final, returned)


def _term(coefficients: torch.Tensor, labels: list[str]) -> str:
    """One element's coefficients as a sum of labels: ``(a₁+b₁)``, ``2·a₁``, ``0``."""
    terms = [(labels[i] if abs(c - 1) < 1e-9 else f"{c:g}·{labels[i]}")
             for i, c in enumerate(coefficients.tolist()) if abs(c) > 1e-9]
    if not terms:
        return "0"
    return terms[0] if len(terms) == 1 else "(" + "+".join(t.strip("()") for t in terms) + ")"


def _value(coefficients: torch.Tensor, labels: list[str]) -> str:
    if coefficients.shape[0] == 1:
        return _term(coefficients[0], labels)
    return "[" + ", ".join(_term(row, labels) for row in coefficients) + "]"


def _holding(final: torch.Tensor, message: torch.Tensor) -> int | None:
    """The first segment (element) whose coefficients include all of ``message``'s; None if none does."""
    need = message[0]
    for k in range(final.shape[0]):
        if bool(((final[k] - need) > -1e-9).all()) and bool((need > 1e-9).any()):
            return k
    return None


def _gpu(rank: int) -> str:
    return f"GPU{rank + 1}"


def _placement(phase: str, step: int, dst: int, message, reference: Trace, got: Trace, labels, world_size):
    """Did the receiver of ``message`` at ``step`` put it where the ring does? None, or what it did instead."""
    want, found = _holding(reference.final[dst], message), _holding(got.final[dst], message)
    value = _term(message[0], labels)
    if phase == RS:
        rule = f"rank r adds what it receives at step s into its segment (r − s − 1) mod G = {want}"
        mine = lambda k: seed_label(dst, k)  # noqa: E731
        if found == want and want is not None and got.final[dst][want][dst * world_size + want] < 0.5:
            return (f"at step {step}, {_gpu(dst)} replaced {mine(want)} with {value} instead of adding it "
                    f"(segment.add_(received)): {rule}")
    else:
        rule = f"rank r keeps what it receives at step s as its segment (r − s) mod G = {want}"
        mine = lambda k: f"its segment {k}"  # noqa: E731
    if found == want:
        return None
    verb = "add" if phase == RS else "keep"
    did = f"it {'added' if phase == RS else 'kept'} it {'into' if phase == RS else 'as'} {mine(found)}" \
        if found is not None else f"it did not {verb} it anywhere"
    where = "into" if phase == RS else "as"
    return f"at step {step}, {_gpu(dst)} should {verb} {value} {where} {mine(want)}; {did} ({rule})"


def first_difference(phase: str, reference: Trace, got: Trace, world_size: int) -> str | None:
    """The first step where ``got`` leaves the reference schedule, as one sentence; None if it never does."""
    labels = _labels(phase, world_size)
    steps = max(len(m) for m in reference.messages + got.messages)
    for step in range(steps):
        for rank in range(world_size):
            ref = reference.messages[rank][step] if step < len(reference.messages[rank]) else None
            mine = got.messages[rank][step] if step < len(got.messages[rank]) else None
            if ref is None and mine is None:
                continue
            if mine is None:
                return (f"at step {step}, {_gpu(rank)} should send {_value(ref[1], labels)} to {_gpu(ref[0])}; "
                        f"it sent nothing more (its {phase} stopped after {step} messages)")
            if ref is None:
                return (f"at step {step}, {_gpu(rank)} sent {_value(mine[1], labels)} to {_gpu(mine[0])}: one "
                        f"message too many (the ring's {phase} has G − 1 = {world_size - 1} steps)")
            if mine[0] != ref[0]:
                return (f"at step {step}, {_gpu(rank)} sent {_value(mine[1], labels)} to {_gpu(mine[0])}; in the "
                        f"ring it sends only to its right neighbour: {_value(ref[1], labels)} to {_gpu(ref[0])}")
            if mine[1].shape != ref[1].shape or not torch.allclose(mine[1], ref[1]):
                return (f"at step {step}, {_gpu(rank)} should send {_value(ref[1], labels)} to {_gpu(ref[0])}; "
                        f"it sent {_value(mine[1], labels)}")
        for rank in range(world_size):
            if step < len(reference.messages[rank]):
                dst, message = reference.messages[rank][step]
                wrong = _placement(phase, step, dst, message, reference, got, labels, world_size)
                if wrong:
                    return wrong
    return _wrong_ending(phase, reference, got, labels, world_size)


def _wrong_ending(phase: str, reference: Trace, got: Trace, labels, world_size: int) -> str | None:
    """Every message was right: is what each rank returns (RS) or ends with (AG) right too?"""
    for rank in range(world_size):
        if phase == RS:
            (want, ref), (index, mine) = reference.returned[rank], got.returned[rank]
            if index != want or mine.shape != ref.shape or not torch.allclose(mine, ref):
                which = f"segment {index} ({_value(mine, labels)})" if index is not None else _value(mine, labels)
                return (f"{_gpu(rank)} returned {which}; after G − 1 steps rank r owns segment (r + 1) mod G: "
                        f"{_gpu(rank)} owns segment {want}, {_value(ref, labels)}")
        elif not torch.allclose(got.final[rank], reference.final[rank]):
            k = int((got.final[rank] - reference.final[rank]).abs().sum(dim=1).argmax())
            return (f"after the all-gather {_gpu(rank)}'s segment {k} holds {_term(got.final[rank][k], labels)}; "
                    f"it should hold {_term(reference.final[rank][k], labels)}")
    return None


def _all_gather(segment, out):
    return ring_all_gather(segment, out)


@functools.lru_cache(maxsize=8)
def _reference(phase: str, world_size: int) -> Trace:
    """The chapter's own ring, traced the same way (cached: it never changes)."""
    def run(fn, world_size, *args, on_send):
        return comm.simulate(fn, world_size, *args, on_send=on_send).results
    return trace(phase, ring_reduce_scatter if phase == RS else _all_gather, world_size, run)


def diagnose(phase: str, fn: Callable, simulate: Callable, world_sizes=(4, 3)) -> str | None:
    """The first difference from the ring's schedule at the first of ``world_sizes`` where there is one.

    ``simulate(rank_fn, G, *args, on_send=...)`` runs the learner's code (with
    the grader's guard: see :meth:`coursekit.grading.context.Context.simulate`)
    and returns the per-rank results.
    """
    for world_size in world_sizes:
        got = trace(phase, fn, world_size, simulate)
        if got is None:
            return None
        found = first_difference(phase, _reference(phase, world_size), got, world_size)
        if found:
            return f"{found} [seen with {world_size} ranks, one element per segment]"
    return None
