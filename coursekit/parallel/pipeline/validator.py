"""The validator of pipeline schedules: what would compute garbage or hang, found before anything runs.

:func:`validate` raises :class:`~coursekit.parallel.pipeline.schedules.ScheduleError`
(rank, action, reason) for the first problem of a schedule
(:mod:`coursekit.parallel.pipeline.schedules`): an action that cannot exist, a
compute action missing or repeated, an action before what it needs, sends and
receives of two ranks that do not match one by one, a deadlock. The deadlock is
found by :func:`run_on_clock`, which executes the schedule on a clock -- the same
replay :func:`~coursekit.parallel.pipeline.planning.plan` times.

    >>> from coursekit.parallel.pipeline.schedules import Action, one_f_one_b
    >>> validate(one_f_one_b(p=2, m=3))
    >>> s = one_f_one_b(p=2, m=1)
    >>> s.actions[1].remove(Action("RECV_F", 1, 0))           # rank 1 forgets to receive its input
    >>> try:
    ...     validate(s)
    ... except ScheduleError as error:
    ...     print(f"rank {error.rank}, {error.action}: {error.reason}")
    rank 1, F0@s1: F0@s1 needs its input, but RECV_F0@s1 is missing on rank 1: put RECV_F0@s1 before F0@s1
"""

from __future__ import annotations

from fractions import Fraction

from .schedules import COMMUNICATION, COMPUTE, Action, Schedule, ScheduleError, message, needs

__all__ = ["validate", "run_on_clock"]


def _count(k: int) -> str:
    return f"{k} message{'' if k == 1 else 's'}"


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` (rank, action, reason) for the first thing that would go wrong.

    In this order: an action that cannot exist (micro-batch, stage, a stage of
    another rank, a message to nowhere); a compute action missing or repeated;
    an action before what it needs on its own rank; sends and receives of a
    pair of ranks that do not match one by one; a deadlock.
    """
    p, m, n, last = schedule.n_ranks, schedule.n_micro_batches, schedule.n_stages, schedule.n_stages - 1
    if len(schedule.actions) != p:
        raise ScheduleError(len(schedule.actions) - 1, None, f"the schedule lists {len(schedule.actions)} ranks; "
                            f"n_ranks is {p}: give one list of actions per rank")
    split = schedule.split_backward
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if a.op not in COMPUTE + COMMUNICATION:
                raise ScheduleError(rank, a, f"unknown op {a.op!r}: use one of {COMPUTE + COMMUNICATION}")
            if not 0 <= a.micro_batch < m:
                raise ScheduleError(rank, a, f"micro-batch {a.micro_batch} does not exist: there are {m} "
                                    f"(0..{m - 1})")
            if not 0 <= a.stage < n:
                raise ScheduleError(rank, a, f"stage {a.stage} does not exist: there are {n} (0..{n - 1})")
            if schedule.stage_owner(a.stage) != rank:
                raise ScheduleError(rank, a, f"stage {a.stage} belongs to rank {schedule.stage_owner(a.stage)}; "
                                    f"rank {rank} holds stages {schedule.stages_of(rank)}: move the action there")
            peer = {"SEND_F": a.stage + 1, "RECV_F": a.stage - 1, "SEND_B": a.stage - 1, "RECV_B": a.stage + 1}
            if a.op in peer and not 0 <= peer[a.op] <= last:
                raise ScheduleError(rank, a, f"stage {a.stage} is the {'last' if peer[a.op] > last else 'first'} "
                                    f"stage: there is no stage {peer[a.op]} to talk to; remove it")
            if a.op in peer and schedule.stage_owner(peer[a.op]) == rank:
                raise ScheduleError(rank, a, f"stage {peer[a.op]} is on this rank too: nothing to send or receive; "
                                    "remove it")
    seen: dict[Action, int] = {}
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if a.op in COMPUTE and a in seen:
                raise ScheduleError(rank, a, f"{a} appears twice: each (stage, micro-batch) runs one {a.op}")
            seen[a] = rank
    for stage in range(n):
        for i in range(m):
            for op in ("F", "B", "W") if split else ("F", "B"):
                if Action(op, stage, i) not in seen:
                    extra = " (this schedule splits the backward: every B needs its W)" if op == "W" else ""
                    raise ScheduleError(schedule.stage_owner(stage), Action(op, stage, i),
                                        f"missing: every (stage, micro-batch) needs one {op}{extra}")
    for rank, actions in enumerate(schedule.actions):
        done = set()
        for a in actions:
            for need, what in needs(schedule, a):
                if need not in done:
                    where = "comes later" if need in actions else "is missing"
                    raise ScheduleError(rank, a, f"{a} needs {what}, but {need} {where} on rank {rank}: "
                                        f"put {need} before {a}")
            done.add(a)
    _check_pairs(schedule)
    run_on_clock(schedule)


def _check_pairs(schedule: Schedule) -> None:
    """The k-th SEND from a to b must be the k-th RECV on b from a (same op, stage and micro-batch)."""
    p = schedule.n_ranks
    sent = {(a, b): [] for a in range(p) for b in range(p)}
    received = {(a, b): [] for a in range(p) for b in range(p)}
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if a.op.startswith("SEND"):
                dst, recv = message(schedule, a)
                sent[rank, dst].append((a, recv))
            elif a.op.startswith("RECV"):
                src = schedule.stage_owner(a.stage + (-1 if a.op == "RECV_F" else 1))
                received[src, rank].append(a)
    for (src, dst), sends in sent.items():
        recvs = received[src, dst]
        for k, ((send, expected), recv) in enumerate(zip(sends, recvs), start=1):
            if expected != recv:
                raise ScheduleError(dst, recv, f"the {_ordinal(k)} message from rank {src} is {send}, but the "
                                    f"{_ordinal(k)} receive from rank {src} here is {recv} (messages between two "
                                    f"ranks match in order): receive {expected} here, or reorder rank {src}'s sends")
        if len(sends) > len(recvs):
            send, expected = sends[len(recvs)]
            raise ScheduleError(src, send, f"rank {dst} receives {_count(len(recvs))} from rank {src}, this is "
                                f"the {_ordinal(len(recvs) + 1)} send to it: add {expected} on rank {dst}, or "
                                "remove this send")
        if len(recvs) > len(sends):
            recv = recvs[len(sends)]
            raise ScheduleError(dst, recv, f"rank {src} sends {_count(len(sends))} here, this is the "
                                f"{_ordinal(len(sends) + 1)} receive from it: add the matching send on rank {src}, "
                                "or remove this receive")


def run_on_clock(schedule: Schedule, times: dict[str, Fraction] | None = None,
                 stage_costs=None) -> list[list[tuple[Action, Fraction, Fraction]]]:
    """Execute the schedule on a clock: compute takes ``times[op]`` (× ``stage_costs[stage]``), messages
    arrive at once.

    A rank blocks on a RECV until its sender has issued the matching SEND.
    Raises :class:`ScheduleError` naming every stuck rank if they all block.
    Returns, per rank, ``(action, start, end)`` of each compute action: what
    :func:`validate` runs to find a deadlock (unit times) and
    :func:`~coursekit.parallel.pipeline.planning.plan` to time a schedule.
    """
    times = times or {"F": 1, "B": 1, "W": 1}
    p = schedule.n_ranks
    clock, position = [Fraction(0)] * p, [0] * p
    issued: dict[tuple[int, Action], Fraction] = {}  # (destination, RECV it matches) -> when it was sent
    spans: list[list[tuple[Action, Fraction, Fraction]]] = [[] for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for rank, actions in enumerate(schedule.actions):
            while position[rank] < len(actions):
                a = actions[position[rank]]
                if a.op.startswith("RECV"):
                    if (rank, a) not in issued:
                        break
                    clock[rank] = max(clock[rank], issued.pop((rank, a)))
                elif a.op.startswith("SEND"):
                    issued[message(schedule, a)] = clock[rank]
                else:
                    took = times[a.op] * (1 if stage_costs is None else stage_costs[a.stage])
                    spans[rank].append((a, clock[rank], clock[rank] + took))
                    clock[rank] += took
                position[rank] += 1
                progress = True
    stuck = [r for r in range(p) if position[r] < len(schedule.actions[r])]
    if stuck:
        waits = "; ".join(f"rank {r} waits at {schedule.actions[r][position[r]]} for rank "
                          f"{_sender(schedule, schedule.actions[r][position[r]])}" for r in stuck)
        first = schedule.actions[stuck[0]][position[stuck[0]]]
        raise ScheduleError(stuck[0], first, f"deadlock: {waits}. A RECV blocks until its SEND is issued: move a "
                            "SEND before the RECV it waits behind")
    return spans


def _sender(schedule: Schedule, recv: Action) -> int:
    return schedule.stage_owner(recv.stage + (-1 if recv.op == "RECV_F" else 1))
