"""What runs on each rank in exercise 09 (find the bug), and the one-process runs each fix is held to.

Exercise 09 shows three broken programs, each run for real, with the report coursekit gives. The learner
fixes one function of each; the rest of the program is the harness here, the same for the broken program
(the notebook launches it to show the report) and for the fix (the grader launches it to judge it):

* program A, ``train_step(rank, world_size, model, optimizer, inputs, targets) -> float``: one step of data
  parallelism on this rank's share of the batch; it returns the *global* batch's mean loss on every rank.
  :func:`data_parallel_rank` trains the course MLP with it; :func:`data_parallel_reference` is one process on
  the whole batch.
* program B, ``ring_sum(rank, world_size, tensor) -> Tensor``: the sum of every rank's tensor, each piece
  passed round the ring. :func:`ring_rank` runs it on small integers (every sum exact) through a
  :class:`RingWatch`, which names a message that leaves the ring before it can hang.
* program C, ``make_replica(rank, world_size) -> nn.Module``: this rank's replica, ready to train. Each rank
  then draws its own samples from its own random stream (as a per-rank seeded sampler does) and trains with
  averaged gradients (:func:`replica_rank`); :func:`replica_reference` is one process from rank 0's weights,
  on every rank's samples together.

Everything a rank sends goes through :mod:`coursekit.comm` (the grader switches ``torch.distributed``'s
collectives off), so it is counted and every stuck rank says what it waits on.
"""

from __future__ import annotations

import contextlib
import copy
import io

import torch

from .. import comm
from ..comm import state as comm_state
from ..collectives import ring_all_reduce
from ..models import TeacherData, loss_fn, tiny_mlp
from ..parallel.data import average_gradients
from ..measure.verify import Report, compare, record_step, reference_run
from .model_parallel_ranks import returned_value
from .ring_judge import ring_input
from .watch import Watch

__all__ = ["LR", "STEPS", "GLOBAL_BATCH", "POOL", "LOCAL_BATCH", "LIBRARY_PHASES", "RingMistake", "RingWatch",
           "data_parallel_rank", "data_parallel_reference", "ring_rank", "replica_start_rank", "replica_rank",
           "replica_reference", "replicas_compared", "REPLICA_SEED", "drawn_replica", "start_difference"]

LR = 0.1
STEPS = 2             # optimiser steps of programs A and C
GLOBAL_BATCH = 12     # program A: splits evenly over 2, 3 and 4 ranks (the mean of the ranks' means is exact)
POOL = 64             # program C: the samples every rank draws from
LOCAL_BATCH = 4       # program C: samples each rank draws a step
# The labels coursekit's own collectives give their messages: a ring_sum that calls one wrote no ring.
LIBRARY_PHASES = ("check lengths", "reduce-scatter", "all-gather", "exchange", "gather", "broadcast")


# ----------------------------------------------------------------------------- program A
def data_parallel_rank(rank, world_size, train_step, steps=STEPS, global_batch=GLOBAL_BATCH, quiet=False):
    """Train the course MLP with ``train_step`` on this rank's share of each batch; the step records (the loss
    ``train_step`` returned), its own loss each step (for the feedback) and what it returned. ``quiet``: what
    ``train_step`` prints is dropped (the grader's table is not the place for rank 0's log)."""
    model = tiny_mlp(seed=0)  # the same weights on every rank: program A's bug is elsewhere
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    records, own, returned = [], [], []
    for step in range(steps):
        inputs, targets = TeacherData().batch(step, global_batch)
        x, y = inputs.tensor_split(world_size)[rank], targets.tensor_split(world_size)[rank]
        with torch.no_grad():
            own.append(loss_fn(model(x), y).item())
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            answer = returned_value(train_step(rank, world_size, model, optimizer, x, y))
        returned.append(answer)
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        records.append(record_step(None, answer if isinstance(answer, float) else float("nan"), grads, model))
    return {"records": records, "own": own, "returned": returned}


def data_parallel_reference(steps=STEPS, global_batch=GLOBAL_BATCH) -> list[dict]:
    """One process, the whole batch, the same model and optimiser."""
    model = tiny_mlp(seed=0)
    data = TeacherData()
    return reference_run(model, torch.optim.SGD(model.parameters(), lr=LR),
                         [data.batch(s, global_batch) for s in range(steps)], loss_fn)


# ----------------------------------------------------------------------------- program B
class RingMistake(Exception):
    """A message that leaves the ring (to the rank it also receives from, or to a rank that does not exist)."""


WRAP = ("the ring does not wrap around: the last rank sends to rank world_size (or rank 0 receives from rank -1), "
        "which does not exist; take the neighbours modulo the world size: (rank + 1) % world_size")


class RingWatch(Watch):
    """``coursekit.comm`` watched for program B: each rank must send to one neighbour and receive from the other.

    A send to the rank this rank also receives from (or a receive from the rank it sends to) would hang at
    three ranks or more; it is refused at once with what the rank does, in words that do not depend on the
    rank (every rank of one program makes the same mistake, and any of them may be the one reported).
    Messages of coursekit's own collectives are not vetted: they are judged by their labels.
    """

    def __init__(self, rank: int, world_size: int):
        super().__init__()
        self.me, self.size = rank, world_size
        self.sends_to: set[int] = set()
        self.receives_from: set[int] = set()

    def vet(self, tensor, peer: int, what: str) -> None:
        if comm_state.kind() == "control" or comm_state.state.phase in LIBRARY_PHASES:
            return
        if not 0 <= peer < self.size:
            raise RingMistake(WRAP)
        offset = (peer - self.me) % self.size
        (self.sends_to if what.startswith("send") else self.receives_from).add(offset)
        if self.size >= 3 and self.sends_to & self.receives_from:
            raise RingMistake(same_neighbour(offset, self.size))


def _who(offset: int, size: int) -> str:
    return {1: "r+1, its right neighbour", size - 1: "r-1, its left neighbour"}.get(offset, f"r+{offset}")


def same_neighbour(offset: int, size: int) -> str:
    """The sentence for a rank r that sends to and receives from the same rank, r + offset."""
    who = _who(offset, size)
    if offset == size - 1:
        what, fix = f"still sends to {who}, the rank it also receives from", \
            "send to the other neighbour, (rank + 1) % world_size"
    elif offset == 1:
        what, fix = f"receives from {who}, the rank it also sends to", \
            "receive from the other neighbour, (rank - 1) % world_size"
    else:
        what, fix = f"sends to and receives from {who}", \
            "send to (rank + 1) % world_size and receive from (rank - 1) % world_size"
    return (f"world size {size}: rank r {what}; that rank sends on to its own neighbour, so every receive waits "
            f"forever (on 2 ranks both neighbours are the same rank, so it worked there): {fix}")


def ring_rank(rank, world_size, ring_sum, numel, watched=True):
    """``ring_sum`` on this rank's small integers, watched (``watched=False``: as plain ranks run it, hang
    included); what it returned and the labels of coursekit's collectives among its messages."""
    watch = RingWatch(rank, world_size) if watched else comm.current_transport()
    with comm.using(watch), comm.record() as traffic:
        total = ring_sum(rank, world_size, ring_input(rank, numel, torch.float32))
    phases = sorted({t.phase for t in traffic.transfers if t.phase in LIBRARY_PHASES})
    return {"total": total.detach().clone() if isinstance(total, torch.Tensor) else returned_value(total),
            "phases": phases}


# ----------------------------------------------------------------------------- program C
REPLICA_SEED = 1000   # program C: rank r seeds its own random stream with 1000 + r, then builds its replica


def drawn_replica(rank: int) -> torch.nn.Module:
    """The replica rank ``rank`` draws in program C -- its seed, then the model, as ``broken_make_replica`` does --
    built here without touching this process's random stream. Rank 0's is where training must start."""
    with torch.random.fork_rng():
        torch.manual_seed(REPLICA_SEED + rank)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def start_difference(expected: torch.nn.Module, got: torch.nn.Module) -> tuple[str, float, float] | None:
    """The first parameter of ``got`` that is not exactly ``expected``'s: (name, expected value, got value) at the
    element that differs most; None when every parameter is equal."""
    mine = dict(got.named_parameters())
    for name, want in expected.named_parameters():
        have = mine.get(name)
        if have is None or have.shape != want.shape:
            return name, float("nan"), float("nan")
        if not torch.equal(have.detach(), want.detach()):
            at = (have.detach() - want.detach()).abs().argmax()
            return name, want.detach().reshape(-1)[at].item(), have.detach().reshape(-1)[at].item()
    return None


def replica_start_rank(rank, world_size, make_replica):
    """Only ``make_replica`` (for the simulator: it finds a broadcast that deadlocks at once). No training here: a
    matrix multiply in the simulator's threads, in a process forked from one that multiplied matrices before,
    crashed (seen: 2 gradings in 15 died of SIGSEGV in ``Linear.forward``)."""
    make_replica(rank, world_size)


def replica_rank(rank, world_size, make_replica, steps=STEPS):
    """Build this rank's replica with ``make_replica``, then train it with averaged gradients on samples drawn
    from this rank's random stream. Returns its records, the samples drawn, its weights before the first step,
    and how many elements it sent while ``make_replica`` ran."""
    with comm.record() as traffic:
        model = make_replica(rank, world_size)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"make_replica returned {returned_value(model)}, not a torch.nn.Module")
    initial = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    pool_x, pool_y = TeacherData().batch(0, POOL)
    records, drawn = [], []
    for _ in range(steps):
        picked = torch.randint(POOL, (LOCAL_BATCH,))  # this rank's own random stream: its own samples
        drawn.append(picked.tolist())
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(pool_x[picked]), pool_y[picked])
        loss.backward()
        average_gradients(model)                      # chapter 02's ring all-reduce, divided by world_size
        mean_loss = ring_all_reduce(loss.detach().clone()) / world_size
        optimizer.step()
        records.append(record_step(None, mean_loss, model, model))
    return {"records": records, "drawn": drawn, "initial": initial, "sent": traffic.total}


def replica_reference(initial: torch.nn.Module, drawn: list[list[list[int]]], steps=STEPS) -> list[dict]:
    """One process from ``initial`` (rank 0's weights), each step on every rank's samples together
    (``drawn[rank][step]``, in rank order: the mean over them is the mean of the ranks' equal-sized means)."""
    model = copy.deepcopy(initial)
    pool_x, pool_y = TeacherData().batch(0, POOL)
    batches = []
    for step in range(steps):
        picked = torch.tensor([i for per_rank in drawn for i in per_rank[step]])
        batches.append((pool_x[picked], pool_y[picked]))
    return reference_run(model, torch.optim.SGD(model.parameters(), lr=LR), batches, loss_fn)


def replicas_compared(results: list[dict]) -> Report:
    """Every rank's weights before the first step against rank 0's (:func:`coursekit.measure.verify.compare`): the first
    parameter that differs, and on which rank."""
    def start(model):
        return [record_step(None, 0.0, {}, model)]
    return compare(start(results[0]["initial"]), [start(r["initial"]) for r in results], check_output=False)
