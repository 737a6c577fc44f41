"""The parts of per-unit ZeRO-3 (:mod:`coursekit.parallel.data.fsdp`): units, their flat buffers, the comm thread.

* :func:`default_units` -- the default policy: every module of an ``nn.ModuleList``;
  :func:`layer_units` -- a finer one: every child of those modules (a block's attention, its MLP's layers).
* :func:`plan_units` -- which trainable parameters each unit holds; the root takes the rest;
  a parameter used outside its unit (a tied weight split between units) is refused.
* :class:`Unit` -- one unit's parameters laid end to end in one flat buffer (each parameter a
  view into it), cut into ring segments; my segment is the parameter the optimiser steps.
* :class:`CommThread` -- one thread that runs this rank's collectives in the order issued, so a
  blocking ring (chapter 01's) moves data while the calling thread computes.
* :func:`gather_whole` -- whole named tensors from every rank's segments, for the record.
* :func:`kept_whole` -- the trainable parameters a user asks to leave unsharded (``replicate=``), and
  :func:`average_whole`, their gradients averaged over the ranks as plain data parallelism does.
"""

from __future__ import annotations

import queue
import threading
from contextlib import nullcontext

import torch
import torch.nn as nn

from ... import comm
from ...comm import state as comm_state
from ...collectives import TORCH, owned_segment, segment_bounds

__all__ = ["default_units", "layer_units", "plan_units", "Unit", "Job", "CommThread", "gather_whole", "kept_whole", "average_whole",
           "cast_whole", "restore_whole"]


def default_units(model: nn.Module) -> list[str]:
    """The default policy: every module held in an ``nn.ModuleList`` (outermost lists only)."""
    names: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(n + ".") for n in names):
            names += [f"{name}.{child}" if name else child for child, _ in module.named_children()]
    return names


_NORMS = tuple(getattr(nn, name) for name in ("LayerNorm", "RMSNorm") if hasattr(nn, name))


def layer_units(model: nn.Module) -> list[str]:
    """Every child of a :func:`default_units` module that holds parameters, in registration order (the
    course's blocks run their children in that order), but its norms: a transformer block's attention and MLP
    layers each a unit. With one prefetch a rank holds two of these at once instead of two whole blocks. The
    norms stay with the root: a unit costs three collectives a step, and a norm holds a few hundred elements."""
    modules = dict(model.named_modules())
    return [f"{unit}.{child}" for unit in default_units(model)
            for child, module in modules[unit].named_children()
            if not isinstance(module, _NORMS) and any(True for _ in module.parameters())]


class Job:
    """A collective queued on the communication thread: ``wait()`` it; ``get_future()`` for the tracer."""

    def __init__(self):
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future

    def wait(self) -> None:
        self.future.wait()  # raises what the collective raised


class CommThread:
    """One thread runs this rank's collectives in the order issued, counted as if this thread sent them.

    :meth:`run` queues a collective and returns its :class:`Job`, drawn on ``tracer`` as a ``comm``
    span from issue to completion; with ``asynchronous=False`` it waits right there instead (one
    blocking span) and returns None. :meth:`wait` waits for a job, drawn as an ``idle`` span.
    """

    def __init__(self, tracer=None, asynchronous: bool = True):
        self.tracer, self.asynchronous = tracer, asynchronous
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, daemon=True, name="coursekit-fsdp-comm")
        self.thread.start()

    def run(self, name: str, fn) -> Job | None:
        if self.asynchronous:
            job = self._submit(fn)
            return self.tracer.comm(job, name) if self.tracer is not None else job
        with self.tracer.blocking(name) if self.tracer is not None else nullcontext():
            self._submit(fn).wait()
        return None

    def wait(self, job: Job | None, name: str) -> None:
        if job is None:
            return
        with self.tracer.span("idle", name) if self.tracer is not None else nullcontext():
            job.wait()
            if self.tracer is not None:
                self.tracer.waited(job)

    def _submit(self, fn) -> Job:
        job = Job()  # the transport (real ranks or simulator) and comm.record()'s recorders follow the work
        self.jobs.put((fn, job, comm_state.active(), comm_state.recorders()))
        return job

    def _work(self) -> None:
        while (item := self.jobs.get()) is not None:
            fn, job, transport, recorders = item
            try:
                with comm.using(transport, recorders=recorders):
                    fn()
                job.future.set_result(None)
            except BaseException as error:  # noqa: BLE001  (handed to whoever waits)
                job.future.set_exception(error)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after the jobs queued so far, and wait for it: a rank that leaves with the thread
        still alive can die at exit ("terminate called without an active exception", SIGABRT: seen in 6 of
        16 runs of ranks started by ``torch.multiprocessing.spawn``, none once the thread was joined)."""
        self.jobs.put(None)
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)


class Unit:
    """One unit's trainable parameters: a flat buffer (views for every parameter) and my segment of it.

    With ``dtype`` (mixed precision) the flat buffer -- what is gathered and computed with -- is in ``dtype``
    and my segment stays in the parameters' own dtype: the fp32 master the optimiser steps.
    """

    def __init__(self, name: str, module: nn.Module, named: list[tuple[str, nn.Parameter]], rank: int, size: int,
                 dtype: torch.dtype | None = None):
        if len({p.dtype for _, p in named}) > 1:
            raise ValueError(f"unit {name!r}: one flat buffer needs one dtype for all its parameters.")
        self.name, self.module, self.names = name, module, [n for n, _ in named]
        self.params = [p for _, p in named]
        self.shapes = [p.shape for p in self.params]
        self.numel = sum(p.numel() for p in self.params)
        self.start, self.stop = segment_bounds(self.numel, size)[owned_segment(rank, size)]
        master = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.flat = master if dtype is None else master.to(dtype)
        self.empty = self.flat.new_empty(0)
        self.show(full=True)
        self.shard = nn.Parameter(master[self.start:self.stop].clone())  # what the optimiser steps
        self.flat_grad: torch.Tensor | None = None
        self.gather: Job | None = None   # all-gather issued, not yet waited
        self.reduce: Job | None = None   # reduce-scatter issued, not yet waited
        self.reduced: torch.Tensor | None = None
        self.sending: torch.Tensor | None = None  # the gradient as it is reduced (a cast copy, mixed precision)
        self.pending: set[int] = set()    # parameters whose gradient this backward has not yet accumulated
        self.in_backward = False

    @property
    def gathered(self) -> bool:
        return self.flat.untyped_storage().nbytes() > 0

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every parameter's piece of a flat tensor laid out as this unit's buffer, by name."""
        out, offset = {}, 0
        for name, shape in zip(self.names, self.shapes):
            out[name] = flat[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
        return out

    def pieces(self) -> list[tuple[int, int]]:
        """For each parameter, the part of *my segment* that holds its elements: ``(lo, hi)`` in the segment.

        The parameter's flattened elements ``[offset, offset + numel)`` meet my segment ``[start, stop)`` in
        one run (possibly empty): a parameter wholly outside my segment gets ``(k, k)``, zero elements.
        """
        out, offset = [], 0
        for shape in self.shapes:
            lo, hi = max(offset, self.start), min(offset + shape.numel(), self.stop)
            lo = min(lo, self.stop)
            out.append((lo - self.start, max(hi, lo) - self.start))
            offset += shape.numel()
        return out

    def show(self, full: bool) -> None:
        """Point every parameter at its view of the full buffer, or, while freed, at an empty tensor: a view
        of freed storage would crash the process when read (autograd's saved views share the storage, so
        they see the next gather)."""
        for p, view in zip(self.params, self.views(self.flat).values()):
            p.data = view if full else self.empty


def plan_units(model: nn.Module, unit_names: list[str], whole: dict[str, nn.Parameter] | None = None
               ) -> list[tuple[str, nn.Module, list]]:
    """(name, module, trainable named parameters) per unit, the root last; each tied parameter in one unit only.
    Parameters in ``whole`` (kept unsharded) belong to no unit."""
    modules = dict(model.named_modules())
    names = {id(p): n for n, p in model.named_parameters()}  # a tied weight under its first name
    owner: dict[int, str] = {id(p): "" for p in (whole or {}).values()}
    plan = []
    for unit in unit_names:
        if not unit or any(unit.startswith(other + ".") for other in unit_names):
            raise ValueError(f"units: {unit!r} is the whole model or lies inside another unit; units must not nest.")
    for unit in [*unit_names, ""]:
        if unit not in modules:
            raise ValueError(f"units: {unit!r} is not a module of the model (try {default_units(model)[:3]}).")
        mine = [(names[id(p)], p) for p in modules[unit].parameters() if p.requires_grad and id(p) not in owner]
        owner.update((id(p), unit) for _, p in mine)
        plan.append((unit or "root", modules[unit], mine))
    for where, module in modules.items():  # a parameter is used by modules of its own unit only
        for p in module.parameters(recurse=False):
            unit = owner.get(id(p), "")
            if unit and not (where == unit or where.startswith(unit + ".")):
                raise ValueError(f"parameter {names[id(p)]!r} (unit {unit!r}) is also used by module {where!r} "
                                 f"outside that unit (a tied weight?): put both modules in one unit, or leave "
                                 f"them to the root unit.")
    return [(n, m, named) for n, m, named in plan if named]


def gather_whole(units: list[Unit], pick, group) -> dict[str, torch.Tensor]:
    """Every unit's segments ``pick(unit)`` gathered into whole named tensors, with torch's collectives
    (outside chapter 01's counted traffic: for the record only)."""
    out = {}
    for unit in units:
        mine = pick(unit)
        flat = torch.empty(unit.numel, dtype=mine.dtype, device=mine.device)
        TORCH.all_gather(mine, flat, group=group)
        out.update(unit.views(flat))
    return out


def kept_whole(model: nn.Module, replicate) -> dict[str, nn.Parameter]:
    """The trainable parameters to leave unsharded: ``replicate`` is None (none), parameter names, or a
    function ``(name, parameter) -> bool`` -- e.g. ``lambda name, p: p.ndim == 1`` keeps every norm weight and
    bias whole, as Stanford CS336's FSDP assignment does (small tensors: sharding them saves little memory and
    costs a collective each)."""
    if replicate is None:
        return {}
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if callable(replicate):
        return {n: p for n, p in named.items() if replicate(n, p)}
    unknown = sorted(set(replicate) - set(named))
    if unknown:
        raise ValueError(f"replicate: {unknown} are not trainable parameters of the model (e.g. {sorted(named)[:3]}).")
    return {n: named[n] for n in replicate}


def average_whole(params: list[nn.Parameter], all_reduce, group, size: int, reduce_dtype=None) -> None:
    """Average the gradients of parameters kept whole over the ``size`` ranks of ``group`` (plain data
    parallelism: one all-reduce each, in ``reduce_dtype`` if given); a parameter without one counts as zero,
    as in DDP."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        summed = p.grad if reduce_dtype in (None, p.grad.dtype) else p.grad.to(reduce_dtype)
        all_reduce(summed, group=group)
        p.grad.copy_(summed).div_(size)


def cast_whole(params, masters: dict, dtype: torch.dtype) -> None:
    """Mixed precision for the parameters kept whole: they compute in ``dtype``, as the units do (a layer's
    weight and bias must agree). Each fp32 master is kept aside in ``masters`` (``id(p) -> data``) -- once:
    several forwards may come before one backward -- and the parameter's data is cast."""
    for p in params:
        if id(p) not in masters and p.dtype != dtype:
            masters[id(p)] = p.data
            p.data = p.data.to(dtype)


def restore_whole(params, masters: dict) -> None:
    """Each parameter :func:`cast_whole` cast back to its master, its gradient (if any) in the master's dtype:
    what the optimiser then steps."""
    for p in params:
        master = masters.pop(id(p), None)
        if master is not None:
            grad, p.grad = p.grad, None
            p.data = master
            p.grad = None if grad is None else grad.to(master.dtype)
