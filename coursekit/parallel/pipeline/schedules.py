"""Pipeline schedules as data: who computes what, in which order, and what they send.

A schedule is a plain list of actions per rank -- forward ``F`` of micro-batch
``i`` on stage ``s``, backward ``B``, for zero bubble the weight gradient
``W``, and the sends and receives between them. This module owns the data
(:class:`Action`, :class:`Schedule`), the four generators and
:func:`add_communication`. Nothing here runs a model:
:func:`~coursekit.parallel.pipeline.validator.validate` checks a schedule before
anything runs, :func:`~coursekit.parallel.pipeline.planning.plan` executes it on a
unit-time clock, and the executor (:mod:`coursekit.parallel.pipeline.executor`)
runs the same list on real ranks.

    >>> s = one_f_one_b(p=2, m=3)
    >>> " ".join(str(a) for a in s.actions[1])
    'RECV_F0@s1 F0@s1 B0@s1 SEND_B0@s1 RECV_F1@s1 F1@s1 B1@s1 SEND_B1@s1 RECV_F2@s1 F2@s1 B2@s1 SEND_B2@s1'

The four schedules, p ranks and m micro-batches:

* GPipe (Huang et al. 2019): every forward, then every backward. Bubble
  (p−1)/(m+p−1) of the time; each rank holds all m micro-batches' activations.
* 1F1B (PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale
  Language Model Training on GPU Clusters Using Megatron-LM"): p−1−r forwards
  to fill the pipe, then one forward, one backward. Same bubble, at most
  min(p−r, m) micro-batches held on rank r.
* Interleaved 1F1B (same paper): each rank holds v stages (chunks) ``r, r+p,
  …``, so the pipe fills v times faster: bubble (p−1)/(v·m+p−1), at the price
  of v times more messages.
* ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the backward is
  split into B (gradient of the input, which the previous stage waits for) and
  W (gradient of the weights, which nobody waits for); W is deferred into the
  cool-down bubble. Bubble (p−1)(T_F+T_B−T_W) instead of (p−1)(T_F+T_B+T_W).

Communication semantics (what the executor implements): a SEND never blocks
(``isend``, waited for at the end of the step); a RECV blocks until the
matching SEND has been issued; the k-th RECV on rank b from rank a matches
the k-th SEND on a to b, so both sides must list them in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


__all__ = ["COMPUTE", "COMMUNICATION", "Action", "Schedule", "ScheduleError", "gpipe", "one_f_one_b",
           "interleaved_1f1b", "zb_h1", "SCHEDULES", "make_schedule", "add_communication", "message", "needs"]

COMPUTE = ("F", "B", "W")
COMMUNICATION = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


@dataclass(frozen=True)
class Action:
    """One step of one rank: ``op`` of ``micro_batch`` on ``stage`` (global stage index).

    SEND_F(s, i) sends stage s's output to the owner of s+1; RECV_F(s, i)
    receives stage s's input from the owner of s−1; SEND_B(s, i) sends the
    gradient of stage s's input to the owner of s−1; RECV_B(s, i) receives the
    gradient of stage s's output from the owner of s+1.
    """

    op: str
    stage: int
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.op}{self.micro_batch}@s{self.stage}"


@dataclass
class Schedule:
    """Per rank, the ordered actions (communication included) of one training step."""

    name: str
    n_ranks: int
    n_micro_batches: int
    stages_per_rank: int
    actions: list[list[Action]]

    @property
    def n_stages(self) -> int:
        return self.n_ranks * self.stages_per_rank

    def stage_owner(self, stage: int) -> int:
        return stage % self.n_ranks

    def stages_of(self, rank: int) -> list[int]:
        return list(range(rank, self.n_stages, self.n_ranks))

    @property
    def split_backward(self) -> bool:
        """True when the backward is split into B (input gradient) and W (weight gradient)."""
        return any(a.op == "W" for actions in self.actions for a in actions)

    def __str__(self) -> str:
        return "\n".join(f"rank {r}: " + " ".join(str(a) for a in acts if a.op in COMPUTE)
                         for r, acts in enumerate(self.actions))


class ScheduleError(ValueError):
    """A schedule that would compute garbage or hang, found before anything runs."""

    def __init__(self, rank: int, action: Action | None, reason: str):
        self.rank, self.action, self.reason = rank, action, reason
        where = f"rank {rank}" + (f", action {action}" if action is not None else "")
        super().__init__(f"{where}: {reason}")


# ----------------------------------------------------------------------------- generators
def _check_sizes(p: int, m: int, v: int = 1) -> None:
    for name, value in (("p (ranks)", p), ("m (micro-batches)", m), ("v (stages per rank)", v)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def _schedule(name: str, p: int, m: int, v: int, compute: list[list[tuple[str, int, int]]]) -> Schedule:
    return add_communication(Schedule(name, p, m, v, [[Action(*c) for c in ops] for ops in compute]))


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): all m forwards, then all m backwards, on each of p ranks."""
    _check_sizes(p, m)
    return _schedule("gpipe", p, m, 1, [[("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)]
                                        for r in range(p)])


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (Narayanan et al. 2021): p−1−r warm-up forwards on rank r, then alternate F and B, then drain.

    Rank r never holds more than min(p−r, m) micro-batches' activations.
    """
    _check_sizes(p, m)
    compute = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [("F", r, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", r, warmup + i), ("B", r, i)]
        ops += [("B", r, i) for i in range(m - warmup, m)]
        compute.append(ops)
    return _schedule("1f1b", p, m, 1, compute)


def interleaved_1f1b(p: int, m: int, v: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2): rank r holds stages r, r+p, …, r+(v−1)p.

    Micro-batches go through a rank's chunks in rounds of ``m // rounds``
    (``rounds = max(1, m // p)``, as ``torch.distributed.pipelining.ScheduleInterleaved1F1B``
    does in torch 2.13: m = p·k as in the paper, or e.g. p = 4, m = 10 with two rounds of 5).
    Warm-up on rank r: (v−1)·round + 2(p−1−r) forwards (Megatron-LM's count), then 1F1B.
    Torch also accepts m < p; here that is refused, because a chunk's input then
    arrives after the rank has run out of work and the bubble exceeds (p−1)/(v·m+p−1).
    """
    _check_sizes(p, m, v)
    rounds = max(1, m // p)
    if m < p or m % rounds:
        hint = f"m = {p * rounds} or {p * (rounds + 1)}" if m >= p else f"m >= {p}"
        raise ValueError(f"interleaved 1F1B needs m >= p (coursekit's rule; torch's ScheduleInterleaved1F1B also "
                         f"accepts m < p) and m a multiple of the number of rounds max(1, m // p) (as torch "
                         f"requires); got p = {p}, m = {m}: use {hint}, or v = 1")
    per_round = m // rounds
    compute = []
    for r in range(p):
        total = v * m
        warmup = min((v - 1) * per_round + 2 * (p - 1 - r), total)
        forwards = [_chunk(k, per_round, v, p, r, reverse=False) for k in range(total)]
        backwards = [_chunk(k, per_round, v, p, r, reverse=True) for k in range(total)]
        ops = [("F", *forwards[k]) for k in range(warmup)]
        for k in range(total - warmup):
            ops += [("F", *forwards[warmup + k]), ("B", *backwards[k])]
        ops += [("B", *backwards[k]) for k in range(total - warmup, total)]
        compute.append(ops)
    return _schedule("interleaved", p, m, v, compute)


def _chunk(k: int, per_round: int, v: int, p: int, rank: int, reverse: bool) -> tuple[int, int]:
    """(stage, micro-batch) of a rank's k-th forward (or backward): rounds of ``per_round`` per chunk."""
    local = (k // per_round) % v
    stage = ((v - 1 - local) if reverse else local) * p + rank
    return stage, (k // (per_round * v)) * per_round + k % per_round


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023, section 3.1): 1F1B's order of F and B, each W placed to fill the bubble.

    Rank r runs 1F1B; after its first r backwards it adds no W (those are the
    slots where the next rank's B is still on its way), from then on each B is
    followed by the oldest pending W; the deferred W's fill the cool-down.
    Same F/B order as 1F1B, so the same activations held between F and B.
    Needs m >= p: with fewer micro-batches there are not enough W to fill the bubble.
    """
    _check_sizes(p, m)
    if m < p:
        raise ValueError(f"ZB-H1 needs m >= p micro-batches to fill the bubble with weight gradients; got p = {p}, "
                         f"m = {m}: use m >= {p}, or 1F1B")
    compute = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [("F", r, i) for i in range(warmup)]
        pending = []
        for k in range(m):
            if warmup + k < m:
                ops.append(("F", r, warmup + k))
            ops.append(("B", r, k))
            pending.append(k)
            if k >= r:
                ops.append(("W", r, pending.pop(0)))
        ops += [("W", r, i) for i in pending]
        compute.append(ops)
    return _schedule("zb_h1", p, m, 1, compute)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_1f1b, "zb_h1": zb_h1}


def make_schedule(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """One of :data:`SCHEDULES` by name; ``v`` only for ``"interleaved"``."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    if name == "interleaved":
        return interleaved_1f1b(p, m, v)
    if v != 1:
        raise ValueError(f"{name} has one stage per rank: v must be 1 (got {v}); use 'interleaved' for v > 1")
    return SCHEDULES[name](p, m)


# ----------------------------------------------------------------------------- communication
def message(schedule: Schedule, action: Action) -> tuple[int, Action] | None:
    """For a SEND: (destination rank, the RECV it matches). None when the peer stage is on this rank.

    The pairing rule of the whole package: :func:`add_communication` places receives with it, the
    validator matches pairs and replays the clock with it.
    """
    step = {"SEND_F": 1, "SEND_B": -1}[action.op]
    peer = action.stage + step
    if schedule.stage_owner(peer) == schedule.stage_owner(action.stage):
        return None
    return schedule.stage_owner(peer), Action("RECV" + action.op[4:], peer, action.micro_batch)


def add_communication(schedule: Schedule) -> Schedule:
    """The same compute order with every SEND right after what it sends and every RECV in time.

    Write only F, B (and W) per rank, then call this. A RECV goes before the
    first compute that needs it -- or earlier, so that the receives from one
    rank come in the order that rank sends them (pairs match in order). That
    never costs time: the message it is moved in front of was sent later.

        >>> s = add_communication(Schedule("mine", 2, 1, 1, [[Action("F", 0, 0), Action("B", 0, 0)],
        ...                                                  [Action("F", 1, 0), Action("B", 1, 0)]]))
        >>> [str(a) for a in s.actions[0]]
        ['F0@s0', 'SEND_F0@s0', 'RECV_B0@s0', 'B0@s0']
    """
    last = schedule.n_stages - 1
    sends: list[list[Action]] = []
    for rank, actions in enumerate(schedule.actions):
        out = []
        for a in actions:
            if a.op in COMMUNICATION:
                continue
            out.append(a)
            send = ("SEND_F" if a.op == "F" and a.stage < last else
                    "SEND_B" if a.op == "B" and a.stage > 0 else None)
            if send and message(schedule, Action(send, a.stage, a.micro_batch)):
                out.append(Action(send, a.stage, a.micro_batch))
        sends.append(out)
    result = []
    for rank, actions in enumerate(sends):
        need = {}  # RECV -> index of the first compute action of this rank that needs it
        for index, a in enumerate(actions):
            for recv, _ in needs(schedule, a):
                if recv.op.startswith("RECV"):
                    need.setdefault(recv, index)
        before: dict[int, list[Action]] = {}
        for src in range(schedule.n_ranks):
            order = [recv for a in sends[src] if a.op.startswith("SEND")
                     for dst, recv in [message(schedule, a)] if dst == rank and recv in need]
            at = len(actions)
            for recv in reversed(order):  # suffix minimum: never after a later message's deadline
                at = min(at, need[recv])
                before.setdefault(at, []).insert(0, recv)
        merged = []
        for index, a in enumerate(actions):
            merged += before.get(index, []) + [a]
        result.append(merged)
    return replace(schedule, actions=result)


def needs(schedule: Schedule, a: Action) -> list[tuple[Action, str]]:
    """What must come before action ``a`` on its own rank, each with what it is to ``a`` (for messages).

        >>> [(str(n), what) for n, what in needs(one_f_one_b(2, 1), Action("B", 0, 0))]
        [('F0@s0', 'its forward'), ('RECV_B0@s0', 'its output gradient')]
    """
    last, rank, i = schedule.n_stages - 1, schedule.stage_owner(a.stage), a.micro_batch
    if a.op == "F" and a.stage > 0:
        local = schedule.stage_owner(a.stage - 1) == rank
        return [(Action("F", a.stage - 1, i) if local else Action("RECV_F", a.stage, i), "its input")]
    if a.op == "B":
        needs = [(Action("F", a.stage, i), "its forward")]
        if a.stage < last:
            local = schedule.stage_owner(a.stage + 1) == rank
            needs.append((Action("B", a.stage + 1, i) if local else Action("RECV_B", a.stage, i),
                          "its output gradient"))
        return needs
    if a.op == "W":
        return [(Action("B", a.stage, i), "its B")]
    if a.op.startswith("SEND"):
        return [(Action(a.op[-1], a.stage, i), "what it sends")]
    return []
