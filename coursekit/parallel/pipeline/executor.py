"""The ``"pipeline"`` strategy, and :func:`execute`: the core's executor (:mod:`.core`), measured.

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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ...strategy import Setup, register
from ...measure.trace import span
from .comm import Channel, broadcast_loss, sum_tied_gradients
from .core import Step, run_schedule
from .model import StagedStrategy
from .schedules import Action, Schedule, make_schedule
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
    """:func:`~coursekit.parallel.pipeline.core.run_schedule`, measured: the last stage's outputs, the loss
    summed, and what this rank kept (:class:`ExecutorStats`); with a ``tracer``, every action a span.

    ``check``: validate the schedule first (everything that would go wrong, found before anything runs).
    """
    if check:
        validate(schedule)
    meter = _Meter(schedule, stages, micro_batches, tracer)
    outs, loss = run_schedule(schedule, rank, stages, micro_batches, micro_loss, channel, around=meter)
    return outs, loss, meter.stats


_KIND = {"F": "forward", "B": "backward", "W": "weight", "SEND_F": "comm", "SEND_B": "comm"}  # RECV: the channel's


class _Meter:
    """Around each action of the core's executor: its span, and the activations its micro-batch keeps."""

    def __init__(self, schedule: Schedule, stages: dict[int, nn.Module], micro_batches, tracer):
        exclude = {p.untyped_storage().data_ptr() for stage in stages.values() for p in stage.parameters()}
        exclude |= {t.untyped_storage().data_ptr() for batch in micro_batches for t in batch}
        self.saved, self.stats = _SavedTensors(exclude, alias=schedule.split_backward), ExecutorStats()
        self.tracer = tracer

    @contextmanager
    def __call__(self, action: Action, step: Step):
        op, key = action.op, (action.stage, action.micro_batch)
        with span(self.tracer, _KIND[op], str(action)) if op in _KIND else nullcontext():
            if op == "F":  # watch what autograd saves for this micro-batch's backward
                self.saved.current = key
                with torch.autograd.graph.saved_tensors_hooks(self.saved.pack, lambda t: t):
                    yield
            else:
                yield
        if op == "F":
            self.stats.activation_bytes[key] = self.held().get(key, 0)
        elif op == "B" and step.split:  # what B keeps for W can raise the peak; an unsplit B only frees
            self.saved.keep(key, step.for_w[key].kept())
            self.held()
        self.stats.actions += 1

    def held(self) -> dict[tuple[int, int], int]:
        """Bytes alive per (stage, micro-batch) now; the peaks updated (after each F and each split B)."""
        held, stats = self.saved.alive(), self.stats
        stats.peak_in_flight = max(stats.peak_in_flight, len(held))
        stats.peak_activation_bytes = max(stats.peak_activation_bytes, sum(held.values()))
        return held


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

