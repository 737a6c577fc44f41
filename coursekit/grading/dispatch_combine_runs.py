"""What runs for exercise 07: the learner's dispatch and combine on simulated ranks, and the one-process MoE.

A :class:`Case` is one layer and one batch per rank: ep ranks, E experts, top-k, dropless or a capacity factor,
each rank's token count, and ``skew`` (a router bias that makes expert 0 every token's first choice, so the
other ranks' experts get little or nothing). :func:`run` runs each rank's router on its tokens (its choices and gates),
calls the learner's ``dispatch`` (which keeps each expert within capacity), the rank's ``Experts`` on what arrived, the learner's ``combine``, and backward
from a fixed upstream gradient, on ``ctx.simulate`` (float64), watching every message it sends
(:class:`Sent`: in which stage, to whom, how many elements, integers or not, payload or control).
:func:`reference` is the answer: :class:`~coursekit.parallel.expert.MoE` on one process, each rank's batch
routed on its own (capacity is per batch), and what each rank's experts should receive.
:func:`run_groups` runs the two functions on 4 real ranks as two expert-parallel groups.
"""

from __future__ import annotations

import copy
import math
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch

from .. import comm
from ..comm.mesh import Mesh
from ..parallel.expert import MoE, Routing, route
from .feedback import is_stub
from .scoring import CheckFailed, Deadlocked, NotDone

__all__ = ["MISREAD", "Case", "Sent", "Run", "Refused", "Reference", "reference", "run", "run_groups", "group_reference",
           "GROUP_CASE"]

DTYPE = torch.float64
_STAGE = threading.local()  # which of the learner's calls this simulated rank is in, read by the message watcher


@dataclass(frozen=True)
class Case:
    """One layer and one batch per rank: ``sizes[r]`` tokens on rank r."""

    ep: int
    n_experts: int
    k: int
    factor: float | None
    sizes: tuple[int, ...]
    skew: bool = False
    d: int = 8
    seed: int = 7

    def __str__(self) -> str:
        regime = "dropless" if self.factor is None else f"capacity {self.factor:g}"
        return (f"ep={self.ep}, E={self.n_experts}, k={self.k}, {regime}{', skewed' if self.skew else ''}, "
                f"tokens {'/'.join(map(str, self.sizes))}")

    @property
    def local(self) -> int:
        return self.n_experts // self.ep


class Sent(NamedTuple):
    """One message a rank sent: in ``stage`` ("dispatch", "combine", "backward"), ``src`` to ``dst``."""

    stage: str | None
    src: int
    dst: int
    numel: int
    nbytes: int
    floating: bool
    kind: str


class Reference(NamedTuple):
    """The answer to a case, from the one-process MoE; per rank unless said otherwise."""

    outs: list            # each rank's output (tokens, d)
    ungated: list         # the same without the gates (to name that mistake)
    twice: list           # the same with each row times its gate twice (to name that one)
    x_grads: list
    router_grad: torch.Tensor   # summed over the ranks' batches
    w1_grad: torch.Tensor       # all E experts'
    w2_grad: torch.Tensor
    counts: list          # counts[i][j]: rows rank i sends rank j (its assignments to j's experts)
    arrivals: list        # arrivals[j][e]: the rows rank j's local expert e must get, from every rank
    by_sender: list       # rank j's rows as they arrive, in pieces: by sender, then expert (any order in each)
    wrong_owner: list     # rank j's rows if expert e lived on rank e % ep (every ep-th expert)
    per: list             # per[j]: rows for each of rank j's experts
    misread: dict         # a capacity rule misread (MISREAD) -> arrivals as that rule gives them, where they differ


def _moe(case: Case) -> MoE:
    moe = MoE(case.d, 2 * case.d, case.n_experts, case.k, case.factor, seed=case.seed).to(DTYPE)
    if case.skew:
        moe.router.bias[0] = 10.0  # above any probability: expert 0 is every token's first choice
    return moe


def _batches(case: Case) -> tuple[list, list]:
    """Each rank's tokens and the upstream gradient of its output."""
    xs, grads = [], []
    for rank, n in enumerate(case.sizes):
        g = torch.Generator().manual_seed(1000 * case.seed + rank)
        xs.append(torch.randn(n, case.d, generator=g, dtype=DTYPE))
        grads.append(torch.randn(n, case.d, generator=g, dtype=DTYPE))
    return xs, grads


@lru_cache(maxsize=None)
def reference(case: Case) -> Reference:
    moe = _moe(case)
    xs, grads = _batches(case)
    outs, x_grads, ungated, twice, routings = [], [], [], [], []
    for x, grad in zip(xs, grads):
        leaf = x.clone().requires_grad_()
        out, _ = moe(leaf)
        (out * grad).sum().backward()
        outs.append(out.detach())
        x_grads.append(leaf.grad)
        with torch.no_grad():
            routing = route(moe.router, x, case.n_experts, case.factor)[2]
            y = moe.experts(x[routing.token], routing.per_expert.tolist())
            ungated.append(torch.zeros_like(x).index_add(0, routing.token, y))
            twice.append(torch.zeros_like(x).index_add(0, routing.token, y * routing.gate.unsqueeze(1) ** 2))
        routings.append(routing)
    ep, local = case.ep, case.local

    def rows_of(i, expert):
        return xs[i][routings[i].token[routings[i].expert == expert]]

    counts = [[int((routings[i].expert // local == j).sum()) for j in range(ep)] for i in range(ep)]
    arrivals = [[torch.cat([rows_of(i, j * local + e) for i in range(ep)]) for e in range(local)] for j in range(ep)]
    by_sender = [[rows_of(i, j * local + e) for i in range(ep) for e in range(local)] for j in range(ep)]
    wrong_owner = [torch.cat([rows_of(i, e * ep + j) for e in range(local) for i in range(ep)]) for j in range(ep)]
    per = [[len(rows) for rows in arrivals[j]] for j in range(ep)]
    misread = {}
    for name in MISREAD if case.factor is not None else ():
        with torch.no_grad():
            kept = [_misread(name, moe.router, x, case) for x in xs]
        wrong = [[torch.cat([xs[i][kept[i].token[kept[i].expert == j * local + e]] for i in range(ep)])
                  for e in range(local)] for j in range(ep)]
        if any(len(w) != len(a) or not torch.equal(w, a) for j in range(ep) for w, a in zip(wrong[j], arrivals[j])):
            misread[name] = wrong
    return Reference(outs, ungated, twice, x_grads, moe.router.score.weight.grad, moe.experts.w1.grad, moe.experts.w2.grad,
                     counts, arrivals, by_sender, wrong_owner, per, misread)


#: Capacity rules a learner may write in place of ``ceil(factor·k·T/E)`` on each rank's own T tokens, first choices
#: first: none applied, rounded down, T counted over every rank's tokens, the lines formed token by token.
MISREAD = ("not_applied", "rounded_down", "over_the_world", "token_order")


def _misread(name: str, router, x, case: Case) -> Routing:
    """Rank's routing of ``x`` under the misread capacity rule ``name`` (:data:`MISREAD`)."""
    _, chosen, gates = router(x)
    tokens, k = chosen.shape
    counted = sum(case.sizes) if name == "over_the_world" else tokens
    rounded = math.floor if name == "rounded_down" else math.ceil
    capacity = tokens * k if name == "not_applied" else rounded(case.factor * k * counted / case.n_experts)
    line = chosen.flatten() if name == "token_order" else chosen.t().flatten()  # who stands first in each line
    place = torch.zeros_like(line)
    for expert in range(case.n_experts):
        place[line == expert] = torch.arange(int((line == expert).sum()))
    keep = (place < capacity).view(tokens, k) if name == "token_order" else (place < capacity).view(k, tokens).t()
    return Routing(chosen, gates, keep, case.n_experts)


def _rows_and_counts(returned, case: Case):
    """dispatch's ``(rows, rows_per_local_expert, plan)``, the counts as ints, or a ValueError saying what it is."""
    if not isinstance(returned, tuple) or len(returned) != 3:
        raise ValueError(f"dispatch returned {type(returned).__name__}, not (rows, rows_per_local_expert, plan)")
    rows, per, plan = returned
    if not isinstance(rows, torch.Tensor):
        raise ValueError(f"dispatch's rows are a {type(rows).__name__}, not a tensor")
    try:
        per = [int(n) for n in per]
    except (TypeError, ValueError):
        raise ValueError(f"dispatch's rows_per_local_expert is {per!r}, not a list of E/ep = {case.local} "
                         f"counts") from None
    return rows, per, plan


class Agreement:
    """The grader's own word between simulated ranks (not a message: nothing is counted): every rank goes on to
    combine, or to backward, only if every rank can. One rank skipping a step its peers take would leave them
    waiting on its all-to-all. A rank that raised never comes: the others stop quietly (the simulator reports it).

    By round, not a reusable barrier: a round every rank reached answers the same whatever happens after it (a
    barrier aborted by a fast rank's error could still break a slow rank that had in fact passed it: a report
    that depended on timing). A rank waits here as in a receive, through the simulator's ``block``, so a rank
    stuck in a receive that a rank waiting here never sent is a deadlock, found at once."""

    def __init__(self, ranks: int):
        self.ranks, self.rounds, self.failed = ranks, {}, False

    def all(self, rank: int, step: str, ok: bool) -> bool:
        world = comm.current_transport().world
        with world.cond:
            votes = self.rounds.setdefault(step, {})
            votes[rank] = ok
            world.cond.notify_all()
            world.block(rank, f"the grader, after its {step} returned",
                        lambda: len(votes) == self.ranks or self.failed)
            if len(votes) < self.ranks:
                raise Stopped
            return all(votes.values())

    def fail(self) -> None:
        """This rank raised: every rank waiting here stops (called on the raising rank's thread)."""
        self.failed = True
        world = getattr(comm.current_transport(), "world", None)
        if world is not None:
            with world.cond:
                world.cond.notify_all()


class Stopped(Exception):
    """Another rank raised before this one's round was complete."""


def _rank(rank, ep, dispatch, combine, case, routers, experts, xs, grads, agreement):
    """One rank: route, the learner's dispatch, this rank's experts, the learner's combine, backward; another rank's
    error ends it quietly (the simulator reports that one)."""
    try:
        return _steps(rank, dispatch, combine, case, routers[rank], experts[rank], xs[rank], grads[rank], agreement)
    except Stopped:
        return None
    except BaseException:
        agreement.fail()
        raise
    finally:
        _STAGE.name = None


def _steps(rank, dispatch, combine, case, router, mine, x, grad, agreement):
    x = x.clone().requires_grad_()
    _, chosen, gates = router(x)
    _STAGE.name = "dispatch"
    rows, per, plan = _rows_and_counts(dispatch(x, chosen, gates, case.n_experts, case.factor, None), case)
    result = {"rows": rows.detach().clone(), "per": per, "out": None}
    fits = rows.dim() == 2 and rows.shape[1] == case.d and len(per) == case.local and sum(per) == rows.shape[0]
    if not agreement.all(rank, "dispatch", combine is not None and fits and min(per, default=0) >= 0):
        return result  # combine not written, or nothing the experts could run on: the checks say which
    _STAGE.name = "combine"
    out = combine(mine(rows, per), plan, x.shape[0], None)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"combine returned {type(out).__name__}, not a tensor of (tokens, d)")
    result["out"] = out.detach().clone()
    _STAGE.name = "backward"
    if agreement.all(rank, "combine", out.requires_grad and out.shape == x.shape):
        (out * grad).sum().backward()
    return {**result, "x_grad": x.grad, "router_grad": router.score.weight.grad, "w1_grad": mine.w1.grad,
            "w2_grad": mine.w2.grad}


class Run(NamedTuple):
    case: Case
    ranks: list        # per rank: rows, per, out (None: combine not run), and the gradients
    sent: list         # every message, as Sent
    ref: Reference
    combined: bool     # False: combine is still the stub


class Refused(str):
    """Why no case can run: the learner called torch.distributed's collective or the library's own answer."""


MISMATCH = ("a rank cannot know how many rows arrive from another: only the sender does. Exchange the counts "
            "first (one per expert: you need them to regroup too), and size each receive from them")


def _mismatch(said: str) -> str | None:
    """The simulator's "a receive does not fit what was sent", in rows, with what to do about it."""
    found = re.search(r"rank (\d+) posted a receive of (\d+) \S+ elements from rank (\d+), which sent (\d+)", said)
    if not found:
        return None
    rank, wanted, sender, sent = found.groups()
    where = re.search(r"\((in \w+, line \d+)\)", said)
    return (f"rank {rank} sized its receive from rank {sender} for {wanted} elements, but rank {sender} sent {sent}"
            f"{f' ({where[1]})' if where else ''}: {MISMATCH}")


def run(ctx, submission, case: Case, with_combine: bool = True):
    """The learner's dispatch and combine on ``case`` (once per grading: ``ctx.memo``): a :class:`Run`, or a
    sentence saying why there is none (:class:`Refused`: the same for every case). Not done and a deadlock end the
    check (no other case could do better). ``with_combine=False``: dispatch alone (a combine that raises costs
    dispatch nothing)."""
    def compute():
        combine = None if not with_combine or is_stub(submission.combine) else submission.combine
        moe, sent = _moe(case), []
        routers = [copy.deepcopy(moe.router) for _ in range(case.ep)]
        experts = [moe.experts.part(rank * case.local, case.local) for rank in range(case.ep)]

        def watch(src, dst, message, kind):
            sent.append(Sent(getattr(_STAGE, "name", None), src, dst, message.numel(),
                             message.numel() * message.element_size(), message.is_floating_point(), kind))
        try:
            ranks = ctx.simulate(_rank, case.ep, submission.dispatch, combine, case, routers, experts,
                                 *_batches(case), Agreement(case.ep), on_send=watch, case=str(case))
        except (NotDone, Deadlocked):
            raise
        except CheckFailed as failed:
            said = str(failed)
            if " was called: " in said:  # a forbidden call or a held-back answer: the same in every case
                return Refused(said)
            return _mismatch(said) or said
        return Run(case, ranks, sent, reference(case), combine is not None)
    return ctx.memo(("run", case, with_combine), compute)


GROUP_CASE = Case(2, 4, 2, 1.0, (5, 8, 6, 11), seed=9)  # per global rank's tokens; the ep groups are {0,1}, {2,3}


def _group_rank(rank, world_size, dispatch, combine):
    """Rank ``rank`` of a ``Mesh({"dp": 2, "ep": 2})``: its expert-parallel group is {0, 1} or {2, 3}."""
    case, mesh = GROUP_CASE, Mesh({"dp": 2, "ep": 2})
    group, ep_rank = mesh.group("ep"), mesh["ep"].rank
    moe = _moe(case)
    experts = moe.experts.part(ep_rank * case.local, case.local)
    xs, grads = _batches(case)  # one batch per global rank
    x = xs[rank].clone().requires_grad_()
    _, chosen, gates = moe.router(x)
    rows, per, plan = _rows_and_counts(dispatch(x, chosen, gates, case.n_experts, case.factor, group), case)
    if not (rows.dim() == 2 and rows.shape[1] == case.d and len(per) == case.local and sum(per) == rows.shape[0]):
        raise ValueError(f"the experts could not run on what dispatch returned: rows of shape {tuple(rows.shape)} and "
                         f"rows_per_local_expert {per}, where they take (n, d = {case.d}) rows and one count per "
                         f"local expert (E/ep = {case.local}) adding up to n (see dispatch_rows)")
    out = combine(experts(rows, per), plan, x.shape[0], group)
    (out * grads[rank]).sum().backward()
    return out.detach(), x.grad


def group_reference():
    """Each of the 4 ranks' output and gradient of x from the one-process MoE (its own batch)."""
    moe, (xs, grads) = _moe(GROUP_CASE), _batches(GROUP_CASE)
    answers = []
    for x, grad in zip(xs, grads):
        leaf = x.clone().requires_grad_()
        out, _ = moe(leaf)
        (out * grad).sum().backward()
        answers.append((out.detach(), leaf.grad))
    return answers


def run_groups(ctx, submission):
    """The learner's functions on 4 real ranks, two expert-parallel groups: per rank (output, gradient of x)."""
    return ctx.launch(_group_rank, 4, submission.dispatch, submission.combine)
