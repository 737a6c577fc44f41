"""The planner: every valid layout of ``gpus`` GPUs evaluated by the cost model, the fitting ones ranked by step time.

A layout (:class:`~.config.Layout`) is ``dp × tp × pp × sp = gpus``, a ZeRO stage, a pipeline schedule and its
micro-batches, and activation recomputation. :func:`evaluate` prices one -- :func:`~.memory.memory_per_gpu`
and :func:`~.step.step_time` -- and says in one line per decision what its numbers are (:mod:`.reasons`).
:func:`layouts` is the search space, valid layouts only; :func:`brute_force` evaluates all of it;
:func:`plan` returns the same ranking's head faster, by branch and bound (below). Nothing is a rule written
by hand: "tp stays inside a node" is what :func:`~.comm.communication_time` says tp costs across one, "pp only
when it pays" is the bubble and the memory it saves, weighed by the same step time.

Valid, as the frameworks require (each refused by :func:`evaluate` with what to change):

* ``tp`` divides the heads (and so the hidden size) and the vocabulary (Megatron-LM pads it to a multiple of
  128·tp: pass the padded vocabulary), ``pp`` divides the layers (× ``chunks`` for the interleaved schedule),
  ``sp`` divides the sequence;
* ``dp × micro_batches`` divides the global batch; with ``pp > 1``, ``micro_batches ≥ pp`` -- torchtitan
  accepts fewer and hangs, chapter 04's validator refuses it -- and a multiple of ``pp`` for the interleaved
  schedule (its rounds);
* ``ep`` (an MoE's experts over ``ep`` of the ``dp`` ranks, :class:`~.config.Layout`) divides ``dp`` and the
  experts, only for a model with experts (never for a dense one), and with ``tp = sp = 1``; an MoE's experts'
  hidden size divides by ``tp``, and its layers take no Megatron-style ``sequence_parallel``
  (:func:`~.experts.check_experts`);
* ZeRO 2 and 3 only without a pipeline (DeepSpeed's pipeline engine asserts ``zero_optimization_stage() <
  ZeroStageEnum.gradients``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"; ZeRO-2 would
  reduce-scatter every micro-batch's gradients), a ZeRO stage only with ``dp > 1``,
  Megatron's ``sequence_parallel`` only with ``tp > 1``.

The space :func:`layouts` walks: every factorisation of ``gpus`` into valid degrees (for an MoE, every ``ep``
that divides ``dp`` and the experts); ZeRO 0-3; with a pipeline
the four schedules of chapter 04 (interleaved with ``chunks=2``); every number of micro-batches that divides
the data-parallel slice of the batch (at least ``pp``); the three recomputations; ``sequence_parallel`` on and
off when ``tp > 1``. :class:`Space` narrows it (``Space.megatron_2021()``: what Megatron-LM offered in 2021).

How :func:`plan` prunes without changing the answer: a *group* is one choice of degrees and ZeRO stage. Its
model states do not depend on the rest, so a group whose states alone exceed the GPU cannot fit whatever its
micro-batches or recomputation (activations only add). And no layout of a group is faster than
:func:`lower_bound`: the FLOPs without recomputation, the smallest bubble the group's schedules allow, and its
communication at ``m = 1`` without recomputation, the least any ``m`` sends (the same bytes in fewer, larger
messages: one latency instead of ``m``). On hardware priced by shape (:meth:`~.config.Hardware.a100`, the default
for a GPU cluster) the bound's compute is one micro-batch's kernels (larger kernels are never slower a FLOP: the
efficiency curves rise with size), the cheaper of sequence parallelism on or off, its bubble stretching them and
not Adam; with ``overlap="derived"`` its traffic is what :func:`~.overlap.shares` can leave exposed at least.
Groups are visited cheapest bound first; once ``top`` fitting layouts
are found and the next group's bound exceeds the slowest of them, no later group can enter the ranking.
tests/test_costmodel_planner.py checks that ranking equals :func:`brute_force`'s and that every bound holds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterator

from .compute import bubble_fraction, compute_time
from .kernels import kernel_time
from .config import RECOMPUTE, SCHEDULES, Hardware, Layout, ModelConfig
from .gpu_memory import GPUMemory, memory_per_gpu, rank_state_bytes
from .experts import check_experts
from .comm import communication_time
from .reasons import layout_reasons
from .step import TrainingStepTime, step_time

__all__ = ["Candidate", "Space", "evaluate", "check_layout", "layouts", "lower_bound", "states_fit", "plan", "brute_force",
           "ranking_key"]

# Exercise 08 asks for a layout chosen from the numbers: while it is graded, the searches refuse (coursekit.answers).

INTERLEAVED_CHUNKS = 2


@dataclass(frozen=True)
class Candidate:
    """One layout, evaluated: its memory on the most loaded GPU, its step time, whether it fits, and why."""

    layout: Layout
    micro_batch: int             # sequences per micro-batch on one pipeline/data replica
    memory: GPUMemory            # memory_per_gpu(...)
    time: TrainingStepTime       # step_time(...)
    fits: bool                   # memory.total <= hardware.memory
    question: tuple = field(default=(), compare=False, repr=False)   # (config, hardware, global_batch, assumptions)

    @property
    def seconds(self) -> float:
        """The step time, ``time.total``."""
        return self.time.total

    @cached_property
    def reasons(self) -> tuple[str, ...]:
        """One line per decision, from the numbers (:func:`~.reasons.layout_reasons`); computed when first read,
        since a search evaluates far more layouts than anyone reads the reasons of."""
        config, hardware, global_batch, assumptions = self.question
        return layout_reasons(config, self.layout, hardware, global_batch, self.memory, self.time, self.fits,
                              **dict(assumptions))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_layout(config: ModelConfig, layout: Layout, global_batch: int, gpus: int | None = None,
                 attention: str = "ring") -> None:
    """Raise ``ValueError`` saying what to change when ``layout`` cannot run ``config`` (the module docstring's list;
    with ``attention="ulysses"`` also: ``tp × sp`` divides the heads, as its all-to-all gives each rank whole heads)."""
    t, p, m = layout.tp, layout.pp, layout.micro_batches
    if gpus is not None and layout.gpus != gpus:
        raise ValueError(f"dp × tp × pp × sp = {layout.gpus} GPUs, not {gpus}: choose degrees whose product is {gpus}.")
    if config.heads % t or config.vocab % t:
        raise ValueError(f"tp = {t} must divide the heads ({config.heads}) and the vocabulary ({config.vocab}): "
                         f"each rank takes whole heads and an equal share of the vocabulary; use a tp that divides "
                         f"both (pad the vocabulary to a multiple of 128·tp as Megatron-LM does).")
    v = layout.chunks if layout.schedule == "interleaved" else 1
    if config.layers % (p * v):
        raise ValueError(f"pp = {p}{f' × {v} chunks' if v > 1 else ''} must divide the layers ({config.layers}): "
                         f"every stage needs the same number of layers; use a pp that divides {config.layers}.")
    if attention == "ulysses" and config.heads % (t * layout.sp):
        raise ValueError(f"Ulysses hands each of tp × sp = {t * layout.sp} ranks whole heads: it must divide the heads "
                         f"({config.heads}); use a smaller sp, or ring attention.")
    if config.seq_len % layout.sp:
        raise ValueError(f"sp = {layout.sp} must divide the sequence ({config.seq_len} tokens): each rank takes an "
                         f"equal block; use an sp that divides {config.seq_len}.")
    if global_batch % (layout.dp * m):
        raise ValueError(f"global_batch {global_batch} does not split into dp = {layout.dp} slices of m = {m} "
                         f"micro-batches: use a global batch that is a multiple of {layout.dp * m}, or change m.")
    if p > 1 and m < p:
        raise ValueError(f"m = {m} micro-batches < pp = {p} stages: the pipeline never fills (torchtitan hangs "
                         f"there; chapter 04's validator refuses it): raise micro_batches to at least {p}.")
    if p > 1 and layout.schedule == "interleaved" and m % p:
        raise ValueError(f"the interleaved schedule runs rounds of pp = {p} micro-batches: m = {m} is not a "
                         f"multiple of {p}; use m = {p * max(1, m // p)} or {p * (m // p + 1)}.")
    if p > 1 and layout.zero >= 2:
        raise ValueError(f"ZeRO-{layout.zero} shards the gradients, which a pipeline accumulates over its "
                         f"micro-batches: DeepSpeed refuses ZeRO 2-3 with pipeline parallelism; use zero <= 1.")
    check_experts(config, layout)


def evaluate(config: ModelConfig, layout: Layout, hardware: Hardware, global_batch: int,
             **assumptions) -> Candidate:
    """Price ``layout``: :func:`~.memory.memory_per_gpu` and :func:`~.step.step_time` (``assumptions`` go to
    the latter: overlaps, ``attention``...), whether it fits ``hardware.memory``, and the reasons.

    Refuses an invalid layout (:func:`check_layout`): e.g. ``m < p``, or a tp that does not divide the heads.
    """
    check_layout(config, layout, global_batch, attention=assumptions.get("attention", "ring"))
    micro_batch = global_batch // (layout.dp * layout.micro_batches)
    memory = memory_per_gpu(config, layout, micro_batch, imbalance=assumptions.get("imbalance", 1.0))
    time = step_time(config, layout, hardware, global_batch, **assumptions)
    fits = memory.total <= hardware.memory
    return Candidate(layout, micro_batch, memory, time, fits,
                     (config, hardware, global_batch, tuple(sorted(assumptions.items()))))


@dataclass(frozen=True)
class Space:
    """Which choices the search may make (every valid one by default). ``megatron_2021()`` is what Megatron-LM
    offered when Narayanan et al. 2021 ran GPT-3 175B: tp × pp × dp, 1F1B or interleaved, no ZeRO, no context
    or sequence parallelism, full recomputation or none (selective came with Korthikanti et al. 2022), no
    expert parallelism (Megatron Core's MoE came later)."""

    zero: tuple[int, ...] = (0, 1, 2, 3)
    schedules: tuple[str, ...] = SCHEDULES
    recompute: tuple[str, ...] = RECOMPUTE
    sequence_parallel: tuple[bool, ...] = (False, True)
    max_sp: int | None = None           # None: any sp that divides the sequence
    max_ep: int | None = None           # None: any ep that divides dp and the experts (an MoE's only)

    @classmethod
    def megatron_2021(cls) -> "Space":
        return cls(zero=(0,), schedules=("1f1b", "interleaved"), recompute=("none", "full"),
                   sequence_parallel=(False,), max_sp=1, max_ep=1)


def _degrees(config: ModelConfig, gpus: int, space: Space, attention: str) -> Iterator[tuple[int, int, int, int]]:
    for tp in _divisors(gpus):
        if config.heads % tp or config.vocab % tp or (config.experts and config.expert_ffn % tp):
            continue
        for pp in _divisors(gpus // tp):
            if config.layers % pp:
                continue
            for sp in _divisors(gpus // (tp * pp)):
                if attention == "ulysses" and config.heads % (tp * sp):
                    continue
                if config.seq_len % sp == 0 and (space.max_sp is None or sp <= space.max_sp):
                    yield gpus // (tp * pp * sp), tp, pp, sp


def _eps(config: ModelConfig, dp: int, tp: int, sp: int, space: Space) -> list[int]:
    """The expert-parallel degrees of a group: 1 for a dense model, else every ep dividing dp and the experts."""
    if not config.experts or tp > 1 or sp > 1:
        return [1]
    return [ep for ep in _divisors(dp) if config.experts % ep == 0 and (space.max_ep is None or ep <= space.max_ep)]


def _groups(config: ModelConfig, gpus: int, global_batch: int, space: Space, attention: str) -> Iterator[Layout]:
    """One layout per group (degrees and ZeRO stage), the rest at its defaults."""
    for dp, tp, pp, sp in _degrees(config, gpus, space, attention):
        if global_batch % dp:
            continue
        for ep, zero in itertools.product(_eps(config, dp, tp, sp, space), space.zero):
            if (zero and dp == 1) or (pp > 1 and zero >= 2):
                continue
            yield Layout(dp=dp, tp=tp, pp=pp, sp=sp, zero=zero, ep=ep)


def _members(config: ModelConfig, group: Layout, global_batch: int, space: Space) -> Iterator[Layout]:
    """Every valid layout of a group: schedules, micro-batches, recomputation, sequence_parallel."""
    p = group.pp
    schedules = space.schedules if p > 1 else ("1f1b",)
    sp_choices = space.sequence_parallel if group.tp > 1 and not config.experts else (False,)
    for schedule, m, recompute, sp_on in itertools.product(schedules, _divisors(global_batch // group.dp),
                                                           space.recompute, sp_choices):
        chunks = INTERLEAVED_CHUNKS if schedule == "interleaved" else 1
        if p > 1 and (m < p or (chunks > 1 and (m % p or config.layers % (p * chunks)))):
            continue
        yield replace(group, schedule=schedule, micro_batches=m, chunks=chunks, recompute=recompute,
                      sequence_parallel=sp_on)


def layouts(config: ModelConfig, hardware: Hardware, gpus: int, global_batch: int,
            space: Space = Space(), attention: str = "ring") -> Iterator[Layout]:
    """The search space: every valid layout of ``gpus`` GPUs for ``global_batch`` sequences (module docstring).

    ``hardware`` does not change which layouts are valid; it is here so that every planner function is asked
    the same question. ``space`` narrows the choices (:class:`Space`); ``attention``, the sp axis's (step_time's
    assumption), decides whether sp must leave whole heads (Ulysses).
    """
    for group in _groups(config, gpus, global_batch, space, attention):
        yield from _members(config, group, global_batch, space)


def ranking_key(candidate: Candidate) -> tuple:
    """Fitting first, then fastest (to 9 significant digits: equal times in float rounding are a tie), then the
    least memory, then the layout's fields: one total order, so two searches can be compared exactly."""
    layout = candidate.layout
    return (not candidate.fits, float(f"{candidate.seconds:.9g}"), float(f"{candidate.memory.total:.9g}"),
            (layout.dp, layout.tp, layout.pp, layout.sp, layout.zero, layout.schedule, layout.micro_batches,
             layout.recompute, layout.sequence_parallel, layout.ep))


def brute_force(config: ModelConfig, hardware: Hardware, gpus: int, global_batch: int, space: Space = Space(),
                **assumptions) -> list[Candidate]:
    """Every layout of :func:`layouts` evaluated, sorted by :func:`ranking_key` (fitting and fastest first)."""
    return sorted((evaluate(config, layout, hardware, global_batch, **assumptions)
                   for layout in layouts(config, hardware, gpus, global_batch, space,
                                         assumptions.get("attention", "ring"))), key=ranking_key)


def states_fit(config: ModelConfig, group: Layout, hardware: Hardware) -> bool:
    """Whether the group's model states alone (no activations) fit: if not, none of its layouts does."""
    for stage in {0, group.pp - 1}:
        if rank_state_bytes(config, group, stage).total > hardware.memory:
            return False
    return True


def lower_bound(config: ModelConfig, group: Layout, hardware: Hardware, global_batch: int, space: Space = Space(),
                **assumptions) -> float:
    """Seconds no layout of ``group`` (its degrees and ZeRO stage) beats: the module docstring's bound."""
    fractions = [bubble_fraction(layout) for layout in _members(config, group, global_batch, space)]
    smallest = min(fractions, default=0.0)
    sp_choices = space.sequence_parallel if group.tp > 1 and not config.experts else (False,)
    if hardware.by_shape and assumptions.get("efficiency") is None:
        # kernels by size: one micro-batch (the largest kernels, never slower a FLOP) without recomputation, the
        # cheaper of sequence parallelism on or off; the bubble stretches the micro-batches' part, not Adam's
        kernels = min((kernel_time(config, replace(group, recompute="none", sequence_parallel=on), hardware,
                                   global_batch) for on in sp_choices), key=lambda k: k.total)
        compute = kernels.optimizer + kernels.pipelined / (1 - smallest)
    else:
        compute = compute_time(config, replace(group, recompute="none"), hardware, global_batch,
                               assumptions.get("efficiency"), assumptions.get("imbalance", 1.0)).compute / (1 - smallest)
    comm = {k: v for k, v in assumptions.items()
            if k in ("attention", "gather_logits", "vocab_parallel_loss", "imbalance")}
    shares = {axis: assumptions.get(f"{axis}_overlap", 0.0) for axis in ("dp", "tp", "pp", "sp", "ep")}
    if assumptions.get("overlap") == "derived":   # what overlap.shares can hide at most
        shares = {"dp": 1.0, "tp": 1.0 if assumptions.get("tp_comm_overlap") else 0.0, "pp": 1.0, "sp": 0.0, "ep": 0.0}
    exposed = min(sum(getattr(seconds, axis) * (1 - share) for axis, share in shares.items())
                  for seconds in (communication_time(config, replace(group, micro_batches=1, sequence_parallel=on),
                                                     hardware, global_batch // group.dp,
                                                     assumptions.get("bytes_per_element", 2), **comm)
                                  for on in sp_choices))
    return compute + exposed


def plan(config: ModelConfig, hardware: Hardware, gpus: int, global_batch: int, top: int = 10,
         space: Space = Space(), **assumptions) -> list[Candidate]:
    """The ``top`` fastest layouts that fit, fastest first: ``brute_force(...)``'s fitting head, found by branch
    and bound (the module docstring): groups whose model states do not fit are skipped, the rest visited
    cheapest :func:`lower_bound` first, stopping when the bound passes the ``top``-th best."""
    if top < 1:
        raise ValueError(f"top must be >= 1 (got {top}).")
    groups = [g for g in _groups(config, gpus, global_batch, space, assumptions.get("attention", "ring"))
              if states_fit(config, g, hardware)]
    bounds = sorted((lower_bound(config, g, hardware, global_batch, space, **assumptions), i)
                    for i, g in enumerate(groups))
    best: list[Candidate] = []
    for bound, i in bounds:
        if len(best) >= top and bound > best[-1].seconds * (1 + 1e-8):   # ranking_key's 9 digits
            break
        for layout in _members(config, groups[i], global_batch, space):
            candidate = evaluate(config, layout, hardware, global_batch, **assumptions)
            if candidate.fits:
                best.append(candidate)
        best = sorted(best, key=ranking_key)[:top]
    return best
