"""Pipeline parallelism: one executor that runs any valid schedule (:mod:`coursekit.parallel.pipeline.schedules`).

Model parallelism (:mod:`coursekit.parallel.pipeline.model`) is a chain: one rank computes while the others wait.
Pipelining (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2021) cuts the batch into ``m`` micro-batches
so that while stage 1 works on micro-batch 0, stage 0 already starts micro-batch 1 (seed claim P7). *Which*
rank does *what* and *when* is the schedule -- plain data, a list of actions per rank -- and this module
only carries it out, action by action:

* ``F(s, i)``: forward of micro-batch ``i`` through stage ``s`` (its input: the batch on stage 0, else what
  ``RECV_F`` received or, when stage ``s-1`` is on this rank too, its output). On the last stage it also
  computes the micro-batch's loss, scaled as the training loop does (the sum over micro-batches is the
  loss of the whole batch), so the gradients *accumulate* to exactly one process's.
* ``B(s, i)``: backward of stage ``s``. When the schedule also has ``W`` actions (zero bubble, Qi et al.
  2023) the backward is split (:mod:`coursekit.parallel.pipeline.split_backward`): ``B`` computes only
  the gradient of the stage's *input*, which the previous stage waits for, recording on its way down the
  gradient that reaches each layer's output (``dY``); ``W(s, i)`` later computes the *weight* gradients
  from those alone (``dW = dYᵀ·X``, ``db = Σ dY``), added into ``.grad``. B and W together do the work of
  one backward. On the first stage, whose input needs no gradient, B has nothing to do and W runs the
  whole backward (as ``torch.distributed.pipelining`` does).
* ``SEND_F``/``SEND_B``: :func:`coursekit.comm.isend` (non-blocking; all waited at the end of the step);
  ``RECV_F``/``RECV_B``: blocking :func:`coursekit.comm.recv` -- or, on a ``Channel(post_ahead=True)``, an
  ``irecv`` posted before the compute in front of it (:meth:`_Step.post_ahead`), collected at the RECV.
  Messages between two ranks match in order.

Every action is a span on the shared clock (``F3@s1`` of kind ``forward``, ``B`` of kind ``backward``, ``W``
of kind ``weight``, receives as ``idle``), so the measured Gantt chart can be drawn under the planned one.
Memory is measured, not assumed: every tensor autograd saves during ``F(s, i)`` (parameters and the batch
itself excluded), and every gradient a split B keeps for its W, is watched through a weak reference, so a
micro-batch counts as *held* until those tensors are really freed -- the activations GPipe keeps for all
``m`` micro-batches, 1F1B for at most ``min(p - r, m)``, ZB-H1 until each micro-batch's W.

    >>> train(rank, world_size, "pipeline", model="transformer", micro_batches=4, schedule="1f1b")  # doctest: +SKIP
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ...strategy import Setup, register
from .comm import Channel, broadcast_loss, sum_tied_gradients
from .model import StagedStrategy
from .schedules import Action, Schedule, make_schedule
from .split_backward import backward_input, backward_weight
from .validator import validate

__all__ = ["ExecutorStats", "execute", "PipelineParallel"]


@dataclass
class ExecutorStats:
    """What one step of the executor measured on this rank."""

    actions: int = 0
    peak_in_flight: int = 0            # most micro-batch-stage pairs whose saved activations were alive at once
    peak_activation_bytes: int = 0     # most bytes alive at once: saved tensors and W's kept gradients (each storage once)
    activation_bytes: dict = field(default_factory=dict)   # (stage, micro-batch) -> bytes saved by its F


class _SavedTensors:
    """Weak references to the tensors autograd saves for backward, by (stage, micro-batch)."""

    def __init__(self, exclude: set[int], alias: bool = True):
        self.alias = alias           # keep a detached alias (needed when the backward is split, see pack)
        self.exclude = exclude       # storages not to count: parameters, the batch
        self.refs: dict[tuple[int, int], list] = {}
        self.current: tuple[int, int] | None = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """Watch ``t``; autograd keeps an alias of it (``detach``: the same storage, no ``grad_fn``).

        Keeping ``t`` itself would tie a node to its own output (output -> grad_fn -> saved output), a cycle
        through C++ that Python's collector cannot see: the graph would outlive a split B whose trunk W
        never runs again. Autograd's own saving keeps no such reference either.
        """
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.exclude:
            return t
        if self.alias:
            t = t.detach()
        self.refs.setdefault(self.current, []).append((weakref.ref(t), ptr, t.untyped_storage().nbytes()))
        return t

    def keep(self, key: tuple[int, int], tensors: list[torch.Tensor]) -> None:
        """Count ``tensors`` (what a split B keeps for W) as held by ``key`` while they are alive."""
        for t in tensors:
            storage = t.untyped_storage()
            self.refs.setdefault(key, []).append((weakref.ref(t), storage.data_ptr(), storage.nbytes()))

    def alive(self) -> dict[tuple[int, int], int]:
        """Bytes still held per (stage, micro-batch), each storage once; forgets what was freed."""
        out, seen = {}, set()
        for key in list(self.refs):
            live = [(ref, ptr, nbytes) for ref, ptr, nbytes in self.refs[key] if ref() is not None]
            if live:
                self.refs[key] = live
                out[key] = sum(nbytes for _, ptr, nbytes in live if not (ptr in seen or seen.add(ptr)))
            else:
                del self.refs[key]
        return out


def execute(schedule: Schedule, rank: int, stages: dict[int, nn.Module], micro_batches, micro_loss,
            channel: Channel, tracer=None, check: bool = True) -> tuple[list[torch.Tensor], float, ExecutorStats]:
    """Run ``schedule.actions[rank]`` in order; return the last stage's outputs, the loss summed, the stats.

    ``stages`` maps each global stage this rank holds to its module; ``micro_batches`` is the list of
    ``(inputs, targets)``; ``micro_loss(output, inputs, targets)`` the scaled loss of one. Gradients
    accumulate into the stages' ``.grad`` (call ``zero_grad`` between steps).
    """
    if check:
        validate(schedule)
    step = _Step(schedule, rank, stages, micro_batches, micro_loss, channel, tracer)
    ahead = getattr(channel, "post_ahead", False)  # a channel of receives posted before the compute
    for position, action in enumerate(schedule.actions[rank]):
        step.run(action)
        if ahead:
            step.post_ahead(position)
    channel.wait()
    outs = [step.results[i] for i in sorted(step.results)]
    return outs, step.loss_sum, step.stats


class _Step:
    """One step of :func:`execute` on one rank: what each action leaves for the actions after it.

    Keyed by ``(stage, micro-batch)``: the inputs and outputs of each forward, what ``RECV_F`` received,
    the output gradients (from ``RECV_B`` or this rank's next stage), the input gradients ``SEND_B`` sends,
    and -- when the backward is split -- what ``W`` needs after ``B``.
    """

    def __init__(self, schedule: Schedule, rank: int, stages: dict[int, nn.Module], micro_batches, micro_loss,
                 channel: Channel, tracer):
        self.schedule, self.rank, self.stages, self.channel, self.tracer = schedule, rank, stages, channel, tracer
        self.micro_batches, self.micro_loss = micro_batches, micro_loss
        self.last, self.split = schedule.n_stages - 1, schedule.split_backward
        self.owner = schedule.stage_owner
        self.key = [tuple(x.shape) for x, _ in micro_batches]  # both ends of a link know a micro-batch's shape
        exclude = {p.untyped_storage().data_ptr() for stage in stages.values() for p in stage.parameters()}
        exclude |= {t.untyped_storage().data_ptr() for batch in micro_batches for t in batch}
        self.saved, self.stats = _SavedTensors(exclude, alias=self.split), ExecutorStats()
        self.inputs, self.outputs, self.received, self.grads, self.to_send, self.for_w = {}, {}, {}, {}, {}, {}
        self.results, self.loss_sum = {}, 0.0
        self.receives = [k for k, a in enumerate(schedule.actions[rank]) if a.op in ("RECV_F", "RECV_B")]
        self.ahead = 0  # index in self.receives of the next receive neither posted ahead nor run

    def post_ahead(self, position: int) -> None:
        """After the action at ``position``: post the next receive ahead (one at a time), once its buffer can
        be made -- so the message can land while this rank computes (see :class:`Channel`)."""
        actions, receives = self.schedule.actions[self.rank], self.receives
        while self.ahead < len(receives) and receives[self.ahead] <= position:
            self.ahead += 1       # run before it could be posted: recv() received it the plain way
        if self.ahead == len(receives) or (self.ahead and receives[self.ahead - 1] > position):
            return                # all done, or the one posted before is not collected yet
        a = actions[receives[self.ahead]]
        s, i = a.stage, a.micro_batch
        if a.op == "RECV_F":
            posted = self.channel.post(self.owner(s - 1), (s - 1, self.key[i]))
        else:
            posted = (s, i) in self.outputs and self.channel.post(self.owner(s + 1), None, like=self.outputs[(s, i)])
        self.ahead += posted

    def run(self, action: Action) -> None:
        op, s, i = action.op, action.stage, action.micro_batch
        name = str(action)
        if op == "F":
            self.forward(s, i, name)
        elif op == "B":
            self.backward(s, i, name)
        elif op == "W":
            self.weight_gradients(s, i, name)
        elif op == "SEND_F":
            with _span(self.tracer, "comm", name):
                self.channel.isend(self.outputs[(s, i)].detach(), self.owner(s + 1), key=(s, self.key[i]))
        elif op == "SEND_B":
            with _span(self.tracer, "comm", name):
                self.channel.isend(self.to_send.pop((s, i)), self.owner(s - 1))
        elif op == "RECV_F":
            self.received[(s, i)] = self.channel.recv(self.owner(s - 1), (s - 1, self.key[i]), name=name)
        elif op == "RECV_B":
            self.grads[(s, i)] = self.channel.recv(self.owner(s + 1), None, like=self.outputs[(s, i)], name=name)
        else:
            raise ValueError(f"rank {self.rank}: unknown action {action}")
        self.stats.actions += 1
        if op.startswith("SEND"):
            self.channel.prune()

    def forward(self, s: int, i: int, name: str) -> None:
        if s == 0:
            x = self.micro_batches[i][0]
        else:  # from RECV_F, or this rank's own stage s-1: a new leaf either way, so stages backward apart
            x = (self.received.pop((s, i)) if self.owner(s - 1) != self.rank else self.outputs[(s - 1, i)].detach())
            x.requires_grad_(True)
        self.saved.current = (s, i)
        with (_span(self.tracer, "forward", name),
              torch.autograd.graph.saved_tensors_hooks(self.saved.pack, lambda t: t)):
            out = self.stages[s](x)
            if s == self.last:
                self.results[i] = out.detach()
                out = self.micro_loss(out, *self.micro_batches[i])
                self.loss_sum += out.item()
        self.inputs[(s, i)], self.outputs[(s, i)] = x, out
        self.stats.activation_bytes[(s, i)] = self.held().get((s, i), 0)

    def held(self) -> dict[tuple[int, int], int]:
        """Bytes alive per (stage, micro-batch) now; the peaks updated (called after each F and each B)."""
        held, stats = self.saved.alive(), self.stats
        stats.peak_in_flight = max(stats.peak_in_flight, len(held))
        stats.peak_activation_bytes = max(stats.peak_activation_bytes, sum(held.values()))
        return held

    def backward(self, s: int, i: int, name: str) -> None:
        x, out = self.inputs.pop((s, i)), self.outputs.pop((s, i))
        grad = None if s == self.last else self.grads.pop((s, i))
        with _span(self.tracer, "backward", name):
            if self.split:  # the input gradient only; what W needs stays, the rest of the graph goes
                (dx,), work = backward_input([out], [grad], [x], self.stages[s].parameters())
                self.for_w[(s, i)] = work
                self.saved.keep((s, i), work.kept())
            else:           # input and weight gradients; the graph (and its saved activations) is freed
                torch.autograd.backward(out, grad)
                dx = x.grad if x.requires_grad else None
        del x, out, grad
        if s > 0 and self.owner(s - 1) == self.rank:
            self.grads[(s - 1, i)] = dx           # this rank's stage s-1 carries on from here
        elif s > 0:
            self.to_send[(s, i)] = dx             # for SEND_B
        if self.split:  # what B keeps for W can raise the peak; an unsplit B only frees
            self.held()

    def weight_gradients(self, s: int, i: int, name: str) -> None:
        with _span(self.tracer, "weight", name):
            backward_weight(self.for_w.pop((s, i)))


def _span(tracer, kind: str, name: str):
    return nullcontext() if tracer is None else tracer.span(kind, name)


@register("pipeline")
class PipelineParallel(StagedStrategy):
    """Stages ``r, r+p, ...`` on rank ``r``; each step runs one schedule over the loop's micro-batches.

    Options: ``schedule`` -- ``"gpipe"``, ``"1f1b"``, ``"interleaved"``, ``"zb_h1"`` or a
    :class:`~coursekit.parallel.pipeline.Schedule` of your own (validated before it runs);
    ``stages_per_rank`` (v, for ``"interleaved"``); ``partition_by`` / ``layers_per_stage`` as ``"model"``.
    The loop's ``micro_batches`` is m.
    """

    options = {**StagedStrategy.options, "schedule": "1f1b", "stages_per_rank": 1}

    def __init__(self, setup: Setup):
        schedule = setup.options.get("schedule", "1f1b")
        v = schedule.stages_per_rank if isinstance(schedule, Schedule) else setup.options.get("stages_per_rank", 1)
        super().__init__(setup, stages_per_rank=v)
        self.v, self._schedules, self.stats = v, {}, []

    def schedule_for(self, m: int) -> Schedule:
        if m not in self._schedules:
            choice = self.option("schedule")
            if isinstance(choice, Schedule):
                if (choice.n_ranks, choice.n_micro_batches) != (self.size, m):
                    raise ValueError(f"schedule {choice.name!r} is for p={choice.n_ranks}, m={choice.n_micro_batches}; "
                                     f"this run has p={self.size} ranks and m={m} micro-batches.")
                validate(choice)
            else:
                choice = make_schedule(choice, self.size, m, self.v)
            self._schedules[m] = choice
        return self._schedules[m]

    def run_step(self, micro_batches, micro_loss):
        schedule = self.schedule_for(len(micro_batches))
        outs, total, stats = execute(schedule, self.rank, self.mine, micro_batches, micro_loss, self.channel,
                                     self.tracer, check=False)
        self.stats.append(stats)
        sum_tied_gradients(self.tied, owner=schedule.stage_owner, group=self.group)
        loss = broadcast_loss(total, src=schedule.stage_owner(schedule.n_stages - 1), group=self.group)
        return (torch.cat(outs) if outs else None), loss

    def counters(self) -> dict:
        return {"peak_in_flight": max((s.peak_in_flight for s in self.stats), default=0),
                "peak_activation_bytes": max((s.peak_activation_bytes for s in self.stats), default=0),
                "activation_bytes": self.stats[-1].activation_bytes if self.stats else {},
                "actions_per_step": self.stats[-1].actions if self.stats else 0}

