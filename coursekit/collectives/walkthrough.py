"""The seed's worked example (R5, R6), symbolically: a recorded ring run replayed over labels.

Rank 0 (the seed's GPU1) holds segments a₁ … a₄, rank 1 holds b₁ …, and so
on. :func:`replay` walks a recorded :class:`coursekit.comm.Traffic` step by
step and says which sum each segment holds ("GPU1 sends a₁ to GPU2, added to
b₁"); :func:`ring_walkthrough` records :func:`ring_all_reduce` in the
simulator first. The step-through figure and widget of chapter 01 draw this.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import comm
from .ring import ring_all_reduce

__all__ = ["seed_label", "RingStep", "replay", "ring_walkthrough"]

_LETTERS = "abcdefghijklmnop"
_SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def seed_label(rank: int, segment: int) -> str:
    """The seed's name for a rank's segment: rank 0 (GPU1) holds a₁ … a₄, rank 1 b₁ …, and so on."""
    return _LETTERS[rank] + str(segment + 1).translate(_SUBSCRIPTS)


class RingStep(NamedTuple):
    """One step of a recorded ring run, with symbolic values.

    ``sends`` lists ``(src, dst, segment, value_sent)``; ``state[r][k]`` is rank
    ``r``'s segment ``k`` after the step, as a tuple of terms (``("a₁", "b₁")``
    means a₁+b₁).
    """

    phase: str
    step: int
    sends: list
    state: list

    def describe(self) -> list[str]:
        """The seed's sentences: "GPU1 sends a₁ to GPU2, added to b₁"."""
        lines = []
        for src, dst, k, value in self.sends:
            sent = _term(value)
            if self.phase == "reduce-scatter":
                before = self.state[dst][k][len(value):]
                lines.append(f"GPU{src + 1} sends {sent} to GPU{dst + 1}, added to {_term(before)}")
            else:
                lines.append(f"GPU{src + 1} sends {sent} to GPU{dst + 1}, which keeps it as segment {k + 1}")
        return lines


def _term(terms: tuple) -> str:
    return terms[0] if len(terms) == 1 else "(" + "+".join(terms) + ")"


def replay(traffic: comm.Traffic, world_size: int, labels=seed_label) -> list[RingStep]:
    """Replay a recorded run over symbolic labels: which sum each segment holds after every step.

    Uses what each transfer recorded: its ``segment`` and ``op`` (``"sum"``:
    the receiver adds it, sent terms first; ``"copy"``: the receiver keeps it).
    """
    state = [[(labels(r, k),) for k in range(world_size)] for r in range(world_size)]
    steps = []
    for (phase_name, step), transfers in traffic.steps():
        sends = [(t.src, t.dst, t.get("segment"), state[t.src][t.get("segment")]) for t in transfers]
        for (src, dst, k, value), t in zip(sends, transfers):
            state[dst][k] = value + state[dst][k] if t.get("op") == "sum" else value
        steps.append(RingStep(phase_name, step, sends, [list(row) for row in state]))
    return steps


def ring_walkthrough(world_size: int) -> list[RingStep]:
    """Run :func:`ring_all_reduce` in the simulator (one element per segment) and replay it symbolically.

        >>> ring_walkthrough(4)[0].describe()[0]
        'GPU1 sends a₁ to GPU2, added to b₁'
    """
    def run(rank, size):
        ring_all_reduce(torch.full((size,), float(rank + 1)))

    _, traffic = comm.simulate(run, world_size)
    return replay(traffic, world_size)
