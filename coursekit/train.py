"""One training loop for every strategy of the course.

:func:`train` runs ``steps`` optimiser steps on one rank with the strategy
named (``"single"``, ``"naive"``, ``"bucketed"``, ``"zero1"`` … — see
:data:`coursekit.strategy.STRATEGIES`) and records what the equivalence
harness (:mod:`coursekit.measure.verify`), the timelines (:mod:`coursekit.measure.trace`) and
the memory accounting need. A strategy plugs in through the small interface
of :class:`coursekit.strategy.Strategy`; adding one never changes this loop.

The process groups come from one :class:`~coursekit.comm.mesh.Mesh` (``mesh=``): each strategy takes
the axes it needs by name, and when none is given this loop is the one place that builds the mesh
a strategy on several axes asks for (:func:`coursekit.strategy.mesh_for`).

    >>> import coursekit
    >>> def run(rank, world_size):
    ...     return train(rank, world_size, strategy="zero2", steps=3)["losses"]
    >>> per_rank = coursekit.launch(run, 2)                       # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import sys
import time
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn

from . import comm
from . import parallel  # noqa: F401  (registers the strategies of every chapter)
from .comm.devices import device
from .measure.memory import PeakMemory
from .comm.mesh import Mesh
from .parallel.data import shard_batch
from .strategy import STRATEGIES, Setup, Strategy, get_strategy, mesh_for
from .measure.trace import Tracer
from .measure.verify import record_step

__all__ = ["train", "make_model", "make_optimizer_fn", "OptionError"]


def make_model(model: str | Callable[[], nn.Module], seed: int):
    """``"mlp"`` or ``"transformer"`` (with their data), or a function returning a module (no data)."""
    from . import models

    if callable(model):
        return model(), None
    if model == "mlp":
        return models.tiny_mlp(seed=seed), models.TeacherData(seed=seed)
    if model == "transformer":
        return models.tiny_transformer(seed=seed), models.LanguageData(seed=seed)
    raise ValueError(f"model={model!r}: use 'mlp', 'transformer', or a function returning a module.")


def make_optimizer_fn(optimizer: str, lr: float):
    """``"adam"`` or ``"sgd"`` (momentum 0.9), as a function of the parameters it will update."""
    if optimizer == "adam":
        return lambda params: torch.optim.Adam(params, lr=lr)
    if optimizer == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise ValueError(f"optimizer={optimizer!r}: use 'adam' or 'sgd' (with momentum 0.9).")


class OptionError(TypeError, ValueError):
    """An option the strategy does not read. A ``ValueError`` (the value of ``strategy`` and the options do not
    go together) and, as Python says of any keyword a function does not take, a ``TypeError``."""


def _takers(option: str) -> list[str]:
    """The strategies that read ``option``, in the order they registered."""
    return [name for name, cls in STRATEGIES.items() if option in cls.options]


def _check_options(strategy: str, options: dict) -> None:
    """Each option must be one ``strategy`` reads: another strategy's option, or a typo, is refused by name
    (an option nobody reads would otherwise be ignored silently: ``precision="bf16"`` on ``"tensor"`` ran fp32)."""
    takes = sorted(get_strategy(strategy).options)
    here = f"strategy={strategy!r} takes " + (", ".join(f"{o}=" for o in takes) if takes else "no option")
    for option in sorted(set(options) - set(takes)):
        takers = _takers(option)
        if takers:
            raise OptionError(f"strategy={strategy!r} does not read {option}=: it is an option of "
                              f"{', '.join(map(repr, takers))}. Drop it, or train with one of those; {here}.")
        known = sorted({o for cls in STRATEGIES.values() for o in cls.options})
        close = difflib.get_close_matches(option, known, n=1)
        raise OptionError(f"train() got unknown option(s) [{option!r}]: no strategy reads it"
                          f"{f' (did you mean {close[0]}=?)' if close else ''}; {here}.")


def train(rank: int, world_size: int, strategy: str = "naive", model: str | Callable[[], nn.Module] = "mlp",
          data=None, steps: int = 3, global_batch: int = 16, micro_batches: int = 1, optimizer: str = "adam",
          lr: float = 1e-3, seed: int = 0, mesh: Mesh | None = None, record: bool = True, trace: bool = False,
          freeze: tuple[str, ...] = (), count_traffic: bool = False, progress: bool = False,
          on_start: Callable[[Strategy], int] | None = None, on_step: Callable | None = None, **options) -> dict:
    """Train for ``steps`` steps with one ``strategy`` and return what happened on this rank.

    Run it on every rank (``coursekit.launch(lambda r, n: train(r, n, "zero2"), 4)``) or, with
    ``strategy="single"``, as the single-process reference (rank 0 of 1).

    Args:
        strategy: a name in :data:`coursekit.strategy.STRATEGIES`.
        model: ``"mlp"``, ``"transformer"`` or a zero-argument function returning a module (then pass ``data``).
        data: an object with ``batch(step, batch_size) -> (inputs, targets)``; default: the model's.
        global_batch: samples per optimiser step over the data-parallel ranks (need not divide by them).
        micro_batches: gradient accumulation: each rank splits its slice into this many micro-batches
            and communicates once per step.
        mesh: the :class:`~coursekit.comm.mesh.Mesh` to run on; the strategy takes the axes it needs by name
            (:attr:`Strategy.axes <coursekit.strategy.Strategy.axes>`): ``"dp"`` for data parallelism
            (``"naive"``, ``"bucketed"``, ``"zero1"`` …), ``"tp"`` for ``"tensor"``, ``"sp"`` for
            ``"ring_attention"``, ``"pp"`` for ``"pipeline"``, both ``"dp"`` and ``"tp"`` for ``"dp_tp"``,
            ``"dp"`` and ``"sp"`` for ``"sequence_data"``; a missing axis is an error that names both
            lists. Axes it does not take are left alone (each of their groups trains on its own).
            None (the default): a one-axis strategy runs over every rank, and ``"dp_tp"`` (option ``tp``)
            and ``"sequence_data"`` (option ``sp``) get ``Mesh({"dp": world_size // tp, "tp": tp})``
            (``sp`` alike), built here.
        freeze: names of parameters to freeze (``requires_grad=False``) before training.
        count_traffic: record chapter 01's traffic counter around the steps (``result["traffic"]``).
        progress: show a progress bar (``tqdm``) on rank 0.
        on_start, on_step: ``on_start(strategy)`` before the first step returns the step to start from (a resumed
            run's); ``on_step(step, loss, seconds, strategy)`` after each step (a checkpoint, a log line).
        **options: the strategy's own options, e.g. ``collectives="ring"`` or ``"torch"``,
            ``bucket_cap_mb=0.1`` (or ``bucket_elements=25_000``) and ``overlap=True`` for ``"bucketed"``.

    Returns a dict with ``records`` (one :func:`coursekit.measure.verify.record_step` per step),
    ``losses``, ``spans`` (if ``trace``; every rank's, on the shared clock), ``memory`` (bytes
    held after the last step, by kind), ``peak_memory`` (the most held at any measured moment, by
    kind, and ``total``: see :class:`coursekit.measure.memory.PeakMemory`), ``step_times``, ``traffic``
    and the strategy's counters.
    """
    _check_arguments(strategy, world_size, micro_batches, options)
    net, default_data = make_model(model, seed)
    net, data = net.to(device()), data or default_data  # the rank's GPU under NCCL (coursekit.comm.devices), else the CPU
    if data is None:
        raise ValueError("pass data= (an object with batch(step, batch_size)) when model is a function.")
    for name, p in net.named_parameters():
        if name in freeze:
            p.requires_grad_(False)
    tracer, mesh = Tracer(rank) if trace else None, mesh_for(strategy, world_size, options, mesh)
    runner = get_strategy(strategy)(Setup(net, make_optimizer_fn(optimizer, lr), mesh, tracer, options))
    if tracer is not None:
        tracer.start(runner.group)
    steps = range(on_start(runner) if on_start is not None else 0, steps)
    result = _loop(runner, data, steps, global_batch, micro_batches, record, count_traffic, progress and rank == 0,
                   on_step)
    result["spans"] = tracer.gather(runner.group) if tracer is not None else None
    result["numel"] = sum(p.numel() for p in net.parameters() if p.requires_grad)
    result.update(runner.counters())
    result.setdefault("elements_reduced", None)
    return result


def _check_arguments(strategy: str, world_size: int, micro_batches: int, options: dict) -> None:
    """What ``train`` refuses before it builds anything, each error saying what to pass instead."""
    if "group" in options:
        raise TypeError("train() takes mesh= (a coursekit.comm.mesh.Mesh), not group=: each strategy takes the axes it "
                        "needs from it by name, e.g. train(rank, world_size, 'zero2', mesh=Mesh({'dp': 2, 'tp': 2})) "
                        "runs ZeRO-2 along mesh['dp'].")
    _check_options(strategy, options)
    if strategy == "single" and world_size != 1:
        raise ValueError("strategy='single' is the one-process reference: run it with world_size=1.")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be at least 1 (got {micro_batches}).")


def _loop(runner: Strategy, data, steps: range, global_batch: int, micro_batches: int, record: bool,
          count_traffic: bool, progress: bool, on_step=None) -> dict:
    """The steps themselves: forward and backward per micro-batch, synchronise, step, record."""
    out: dict = {"records": [], "losses": [], "step_times": [], "memory": {}}
    # Memory at its peak, not after the step: the loop measures after backward, after synchronising and
    # after the step; a strategy that frees memory inside backward brings its own meter (``runner.peak``),
    # noted at its own peak moments (ZeRO-2 just before it drops a bucket).
    peak = getattr(runner, "peak", None) or PeakMemory()
    bar = _progress_bar(len(steps), type(runner).__name__) if progress else None
    with comm.record() if count_traffic else nullcontext(None) as traffic:
        for step in steps:  # the data of a step is a function of its number: a resumed run reads on
            begin = time.perf_counter()
            batch = [t.to(device()) for t in data.batch(step, global_batch)]
            with comm.record(runner.record):  # what the step sends: the strategy's counters read it
                outputs, local_loss = _forward_backward(runner, *batch, micro_batches)
                peak.note(runner.held_tensors())
                runner.synchronize()
                peak.note(runner.held_tensors())
                runner.step()
            loss = runner.global_loss(local_loss)  # the same on every rank
            out["losses"].append(loss)
            if record:  # gradients after the step: optimisers do not change .grad
                output = runner.recorded_output(outputs)
                out["records"].append(record_step(output, loss, runner.gradients(), runner.parameters()))
            out["step_times"].append(time.perf_counter() - begin)
            out["memory"] = peak.note(runner.held_tensors())  # bytes held right after the step, by kind
            runner.zero_grad()
            if on_step is not None:
                on_step(step, loss, out["step_times"][-1], runner)
            if bar is not None:
                bar.set_postfix(loss=f"{loss:.3f}")
                bar.update()
    if bar is not None:
        bar.close()
    out["traffic"] = traffic
    out["peak_memory"] = dict(peak.by_kind, total=peak.total)
    return out


def _forward_backward(runner: Strategy, inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int):
    """This rank's slice of the global batch, cut into micro-batches; each one forward and backward.

    Each micro-batch's loss (``runner.loss``: by default ``loss_fn`` on the whole output) is scaled so
    that the sum over micro-batches, averaged over the data-parallel ranks, is exactly the mean loss of
    the global batch (see :func:`shard_batch`).
    """
    local_x, local_y, weight = shard_batch(inputs, targets, runner.data_rank, runner.data_size)
    micro = list(zip(local_x.tensor_split(micro_batches), local_y.tensor_split(micro_batches)))
    if any(x.shape[0] == 0 for x, _ in micro):
        raise ValueError(f"data rank {runner.data_rank} has {local_x.shape[0]} samples, fewer than micro_batches="
                         f"{micro_batches}; use a larger global batch or fewer micro-batches.")

    def micro_loss(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return runner.loss(out, y) * weight * x.shape[0] / local_x.shape[0]

    if runner.run_step is not None:  # the strategy runs the whole step (a pipeline schedule)
        output, local_loss = runner.run_step(micro, micro_loss)
        return ([] if output is None else [output]), local_loss
    outputs, local_loss = [], 0.0
    for i, (x, y) in enumerate(micro):
        last = i == len(micro) - 1
        with runner.micro_batch_context(last):
            with runner.span("forward", f"micro {i}"):
                out = runner.forward(x)
                loss = micro_loss(out, x, y)
            with runner.backward_context(last), runner.span("backward", f"micro {i}"):
                loss.backward()
        outputs.append(out.detach())
        local_loss += loss.item()
    return outputs, local_loss


def _progress_bar(steps: int, name: str):
    from tqdm import tqdm  # the text bar, not tqdm.auto: a forked rank must not try to draw a widget

    # In a rank, stderr is a pipe to the notebook; the bar's \r updates travel through it live.
    return tqdm(total=steps, desc=name, file=sys.stderr, ascii=False, dynamic_ncols=False, ncols=80)
