"""The bubble of a measured pipeline step, on the same window as the plan's -- and the step's tail beside it.

The plan (:func:`coursekit.parallel.pipeline.plan`) times only the schedule's compute actions: its clock
starts when the first forward starts and stops when the last backward (or W) ends, on any rank
(:attr:`Plan.makespan`), and its bubble is the share of p × that window in which a rank does not compute
(:attr:`Plan.bubble_fraction`). A measured step holds more than the schedule: after its last action
every rank waits for its sends, sums the tied embedding's gradient with the other end of the pipe,
receives the loss from the last stage, and runs the optimizer. None of that is pipelining, and none of it
shrinks when m grows, so counting it as bubble would mix two things. :func:`measured_bubble` measures
the bubble over the plan's window and gives that **tail** separately:

    >>> result = measured_bubble(spans)        # doctest: +SKIP  (spans: one step of Tracer.gather())
    >>> result.bubble                          # doctest: +SKIP  (idle share of p x window: the plan's bubble)
    >>> result.tail_share                      # doctest: +SKIP  (the tail's share of the whole step)

Why one window for all ranks, not one per rank: the plan's bubble counts the last rank's wait before
its first forward and the first rank's wait after its last backward -- that *is* the pipeline's fill and
drain. A window per rank (its own first action to its own last) would leave those waits out and call a
pipeline without overlap bubble-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ACTION_NAME", "MeasuredBubble", "compute_op", "measured_bubble"]

# The executor names each action's span after the action (``str(Action)``): F3@s1, SEND_B0@s2, ...
ACTION_NAME = re.compile(r"^(F|B|W|SEND_F|SEND_B|RECV_F|RECV_B)\d+@s\d+$")
COMPUTE_OPS = ("F", "B", "W")


@dataclass(frozen=True)
class MeasuredBubble:
    """One measured step, in the plan's terms (times in seconds on the trace's clock).

    ``bubble``: idle share of ``ranks`` × ``window`` -- what :attr:`Plan.bubble_fraction` predicts.
    ``start``, ``end``: the first compute action's start and the last one's end, on any rank (the window).
    ``step_end``: where the step's last span ends; the ``tail`` between ``end`` and it is the optimizer
    step and the end-of-step synchronisation (sends waited, tied gradients summed, the loss broadcast).
    """

    bubble: float
    start: float
    end: float
    step_end: float
    ranks: int

    @property
    def window(self) -> float:
        return self.end - self.start

    @property
    def tail(self) -> float:
        return max(0.0, self.step_end - self.end)

    @property
    def tail_share(self) -> float:
        """The tail as a share of the whole step (window + tail)."""
        return self.tail / (self.window + self.tail) if self.window + self.tail > 0 else 0.0


def compute_op(span) -> str | None:
    """``"F"``, ``"B"`` or ``"W"`` if ``span`` is a compute action of the schedule, else ``None``."""
    match = ACTION_NAME.match(span.name)
    # By name, not kind: a receive is recorded twice (comm and idle) under its name, a compute action once.
    return match.group(1) if match is not None and match.group(1) in COMPUTE_OPS else None


def measured_bubble(spans: list) -> MeasuredBubble:
    """Idle share of one measured step over the plan's window, and the tail after it (see the module).

    ``spans``: one step of :meth:`coursekit.measure.trace.Tracer.gather` from the pipeline executor. The busy time
    is the compute actions' spans (``F``, ``B``, ``W``); a receive's wait inside the window is bubble, as
    it is in the plan. A trace with no compute action gives a bubble of NaN.
    """
    compute = [s for s in spans if compute_op(s) is not None]
    ranks = len({s.rank for s in spans})
    if not compute:
        return MeasuredBubble(float("nan"), 0.0, 0.0, 0.0, ranks)
    start, end = min(s.start for s in compute), max(s.end for s in compute)
    busy = sum(s.duration for s in compute)
    bubble = 1 - busy / (ranks * (end - start)) if end > start else 0.0
    return MeasuredBubble(bubble, start, end, max(s.end for s in spans), ranks)
