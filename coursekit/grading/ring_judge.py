"""Judging one case of exercise 01: exact answers, what is wrong with a segment, and whether a ring computed it.

The inputs are small integers, so every sum is exact in every dtype and a
right answer is equal, bit for bit. A right answer counts only if the ring
computed it (:func:`not_a_ring`): each message to the right neighbour, none
longer than a segment, each rank sending exactly what the phase's G−1 steps
send (:func:`phase_sent`). The feedback names the world size, length, dtype, rank
and segment, and, where it can, the mistake ("returned segment 0; after G−1
steps rank r owns segment (r+1) mod G").
"""

from __future__ import annotations

import math

import torch

from .. import comm
from ..collectives import owned_segment, segment_bounds
from .ring_schedule import AG, RS

__all__ = ["ring_input", "ring_sum", "all_gather_start", "phase_sent", "shape_problems", "not_a_ring",
           "judge_reduce_scatter", "judge_all_gather"]


# ----------------------------------------------------------------------------- inputs and exact answers
def ring_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers: every sum is exact in every dtype, so answers compare exactly."""
    generator = torch.Generator().manual_seed(7919 * rank + numel)
    return torch.randint(-8, 9, (numel,), generator=generator).to(dtype)


def ring_sum(world_size: int, numel: int, dtype: torch.dtype, ranks=None) -> torch.Tensor:
    """The exact sum of the inputs of ``ranks`` (default: all of them), in float64."""
    total = torch.zeros(numel, dtype=torch.float64)
    for r in (range(world_size) if ranks is None else ranks):
        total += ring_input(r, numel, dtype).double()
    return total


# ----------------------------------------------------------------------------- is it a ring?
def _hub(world_size: int, traffic: comm.Traffic) -> int | None:
    """The rank every message goes to or comes from (a parameter server), if there is one (G ≥ 3)."""
    if world_size < 3 or not traffic.payload:
        return None
    ends = set.intersection(*({t.src, t.dst} for t in traffic.payload))
    return min(ends) if ends else None


def shape_problems(world_size: int, numel: int, traffic: comm.Traffic) -> list[str]:
    """What makes this traffic not a ring: a hub, a message to a non-neighbour, a message of more than a segment."""
    problems, payload = [], traffic.payload
    hub = _hub(world_size, traffic)
    if hub is not None:
        sent, received = traffic.sent, traffic.received
        problems.append(f"all traffic goes through rank {hub} (a parameter server): it sends {sent[hub]} and "
                        f"receives {received[hub]} elements, {sent[hub] + received[hub]} in all, the busiest other "
                        f"rank {max(sent[r] + received[r] for r in sent if r != hub)}; in a ring every rank sends "
                        f"only to its right neighbour and carries the same share")
    strangers = sorted({(t.src, t.dst) for t in payload if t.dst != (t.src + 1) % world_size})
    if strangers and hub is None:
        src, dst = strangers[0]
        problems.append(f"rank {src} sent to rank {dst}; in a ring each rank sends only to its right neighbour, "
                        f"rank (r+1) % G = {(src + 1) % world_size}")
    segment = math.ceil(numel / world_size) if world_size else numel
    biggest = max(payload, key=lambda t: t.numel, default=None)
    if biggest is not None and biggest.numel > segment:
        problems.append(f"rank {biggest.src} sent {biggest.numel} elements in one message"
                        f"{' (the whole tensor)' if biggest.numel == numel else ''}; a ring step sends one "
                        f"segment, at most ceil(N/G) = {segment} elements")
    return problems


def phase_sent(numel: int, world_size: int, phase: str) -> dict[int, int]:
    """Elements each rank sends in one phase: every segment but (r+1) % G in the reduce-scatter, every segment
    but (r+2) % G in the all-gather (see collectives.ring_traffic, their sum)."""
    if world_size == 1:
        return {0: 0}
    lengths = [b - a for a, b in segment_bounds(numel, world_size)]
    kept = 1 if phase == RS else 2
    return {r: numel - lengths[(r + kept) % world_size] for r in range(world_size)}


def _step_count(world_size: int, numel: int, traffic: comm.Traffic, phase: str) -> str | None:
    """None if every rank sent exactly what the phase's G−1 steps send, else the first rank that did not.

    Right values do not show it: an extra reduce-scatter step only adds into scratch, an extra all-gather
    step writes a finished segment over itself.
    """
    want, sent = phase_sent(numel, world_size, phase), traffic.sent
    wrong = [r for r in range(world_size) if sent.get(r, 0) != want[r]]
    if not wrong:
        return None
    rank, kept = wrong[0], 1 if phase == RS else 2
    lengths = [b - a for a, b in segment_bounds(numel, world_size)]
    steps = sum(1 for k, n in enumerate(lengths) if n and k != (rank + kept) % world_size)  # empty ones are skipped
    messages = sum(1 for t in traffic.payload if t.src == rank)
    plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"  # noqa: E731
    how = {steps + 1: "one step too many", steps - 1: "one step too few"}.get(messages, "not the ring's steps")
    return (f"rank {rank} sent {sent.get(rank, 0)} elements in {plural(messages, 'message')}; in the ring's {phase} "
            f"it sends N − len(segment (r+{kept}) % G) = {want[rank]} in {plural(steps, 'message')}: {how} in the "
            f"{phase} (G − 1 = {plural(world_size - 1, 'step')})")


def not_a_ring(world_size: int, numel: int, traffic: comm.Traffic, phase: str) -> str | None:
    """For a right answer: None if the ring computed it, in its G−1 steps, else why it earns nothing."""
    problems = shape_problems(world_size, numel, traffic)
    problem = problems[0] if problems else _step_count(world_size, numel, traffic, phase)
    if not problem:
        return None
    return f"right values, but not the ring's {phase}: {problem}"


# ----------------------------------------------------------------------------- judging one case
def _segment_feedback(rank: int, world_size: int, numel: int, dtype, got, index: int | None) -> str | None:
    """None if ``got`` is rank's fully reduced owned segment, else what is wrong with it."""
    where = f"world size {world_size}, length {numel}, {str(dtype).replace('torch.', '')}, rank {rank}"
    own = owned_segment(rank, world_size) if world_size > 1 else 0
    bounds = segment_bounds(numel, world_size) if world_size > 1 else [(0, numel)]
    start, stop = bounds[own]
    full = ring_sum(world_size, numel, dtype)
    if isinstance(got, str):
        return f"{where}: returned {got}, expected a tensor (the view of segment {own})"
    got = got.reshape(-1).double()
    if got.numel() == stop - start and torch.equal(got, full[start:stop]):
        return None
    expected = f"segment {own} = elements {start}:{stop} ({stop - start} of them), summed over all {world_size} ranks"
    if index is not None and index != own:
        return (f"{where}: returned segment {index}; after G−1 steps rank r owns segment (r+1) mod G, "
                f"so expected {expected}")
    mine = ring_input(rank, numel, dtype).double()[start:stop]
    if torch.equal(got, mine):  # first: a one-element segment left as it was may equal another's sum by chance
        return f"{where}: segment {own} is unchanged: nothing was added into it; expected {expected}"
    for k, (a, b) in enumerate(bounds):
        if k != own and b - a == got.numel() and b > a and torch.equal(got, full[a:b]):
            return f"{where}: returned the complete segment {k}, but the ring leaves rank r owning segment (r+1) % G; expected {expected}"
    if got.numel() != stop - start:
        hint = " (the whole tensor?)" if got.numel() == numel and world_size > 1 else ""
        return f"{where}: returned {got.numel()} elements{hint}; expected {expected}"
    # A partial sum along the ring (too few steps, or a send of the value before the add)? The ring sends
    # right, so rank r's segment can only have gathered the ranks just left of it: r, r−1, ..., r−c+1.
    for count in range(2, world_size):
        ranks = [(rank - i) % world_size for i in range(count)]
        if torch.equal(got, ring_sum(world_size, numel, dtype, ranks)[start:stop]):
            return (f"{where}: segment {own} holds the sum of only {count} of {world_size} ranks "
                    f"(a ring needs G-1 = {world_size - 1} steps, each passing on the running sum it just "
                    f"added to); expected {expected}")
    wrong = int((got != full[start:stop]).sum())
    return f"{where}: segment {own} is wrong at {wrong} of {stop - start} elements; expected {expected}"


def judge_reduce_scatter(world_size: int, numel: int, dtype, results: list) -> str | None:
    """The first rank whose returned segment is wrong (and how many more are), or why it is not a ring, or None."""
    bad = [f for f in (_segment_feedback(r, world_size, numel, dtype, results[r][0], results[r][2])
                       for r in range(world_size)) if f]
    if bad:
        return bad[0] + (f" (and {len(bad) - 1} more rank{'s' * (len(bad) > 2)})" if len(bad) > 1 else "")
    ring = not_a_ring(world_size, numel, comm.Traffic.merge([r[1] for r in results]), RS)
    return f"world size {world_size}, length {numel}: {ring}" if ring else None


def all_gather_start(rank: int, world_size: int, numel: int, dtype, as_copy: bool) -> torch.Tensor:
    """The ``out`` a rank's all_gather starts from: its own input (not zeros: an all_gather that adds what it
    receives, or never puts it in place, must come out wrong), its owned segment already summed unless the
    segment is passed as a copy (then ``out`` holds the rank's input there too, and all_gather must copy it)."""
    out = ring_input(rank, numel, dtype)
    if not as_copy and world_size > 1:
        start, stop = segment_bounds(numel, world_size)[owned_segment(rank, world_size)]
        out[start:stop] = ring_sum(world_size, numel, dtype)[start:stop].to(dtype)
    return out


def _gather_hint(rank: int, world_size: int, numel: int, dtype, got, wrong: list, as_copy: bool) -> str:
    """What a wrong segment after all_gather says about the mistake: "" if nothing does."""
    full, before = ring_sum(world_size, numel, dtype), ring_input(rank, numel, dtype).double()
    bounds, own = segment_bounds(numel, world_size), owned_segment(rank, world_size)
    a, b = bounds[own]
    if as_copy and own in wrong and torch.equal(got[a:b], before[a:b]):
        return (f"; its own segment {own} still holds what out held before: all_gather was given its segment as a "
                f"copy, not a view of out, and must put it in place (out's segment (r+1) % G) before sending it")
    for k in wrong:
        a, b = bounds[k]
        if torch.equal(got[a:b], before[a:b]):
            return (f"; segment {k} still holds what out held before: receive each segment straight into its "
                    f"place in out")
        if torch.equal(got[a:b], full[a:b] + before[a:b]):
            return (f"; segment {k} holds what out held there plus the complete segment: all_gather must copy "
                    f"(replace) what it receives, not add it (adding is the reduce-scatter's)")
    return ""


def judge_all_gather(world_size: int, numel: int, dtype, results: list) -> str | None:
    """The first rank that does not hold every segment of the sum after all_gather, or why it is not a ring, or None.

    ``results``: per rank, ``(out after all_gather, traffic, whether the segment was passed as a copy)``.
    """
    full = ring_sum(world_size, numel, dtype)
    bounds = segment_bounds(numel, world_size)
    for rank, (got, _, as_copy) in enumerate(results):
        got = got.double()
        wrong = [k for k, (a, b) in enumerate(bounds) if not torch.equal(got[a:b], full[a:b])]
        if wrong:
            a, b = bounds[wrong[0]]
            return (f"world size {world_size}, length {numel}: after all_gather rank {rank} has wrong values in "
                    f"segment{'s' if len(wrong) > 1 else ''} {', '.join(map(str, wrong))} "
                    f"(segment k = elements {a}:{b} for k = {wrong[0]})"
                    f"{_gather_hint(rank, world_size, numel, dtype, got, wrong, as_copy)}")
    ring = not_a_ring(world_size, numel, comm.Traffic.merge([r[1] for r in results]), AG)
    return f"world size {world_size}, length {numel}: {ring}" if ring else None
