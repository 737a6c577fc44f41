"""ZeRO-3 one unit at a time, as FSDP2's ``fully_shard`` on each block: the full model never exists on a rank.

:mod:`coursekit.parallel.data.zero`'s stage 3 gathers the *whole* model for the
forward pass, so its peak is a full copy. Here the model is cut into
**units**: each unit is a module (by default every module of an
``nn.ModuleList``: each transformer block, each MLP layer) whose trainable
parameters live in one flat buffer of their own, cut into ``N`` segments as
chapter 01's ring cuts it (rank ``r`` owns segment ``(r + 1) % N``). What no
unit holds (embeddings, final norm, head) is the **root** unit. Between uses
a rank holds only its segment of every unit. Each unit lives through::

    all-gather ─ forward ─ free ··· all-gather ─ backward ─ free, reduce-scatter its gradient

* just before the unit's forward its parameters are all-gathered; right after
  it they are freed (the storage resized to 0 bytes; each parameter then reads
  as an empty tensor: :meth:`ShardedUnits.full_parameters` gathers them);
* when backward reaches the unit (a hook on its output's gradient) they are
  all-gathered again; when its last gradient has accumulated they are freed
  and its flat gradient is reduce-scattered: my segment, divided by ``N``, is
  what my optimiser steps (the optimiser sees only the segments). One
  reduce-scatter is in flight at a time: issuing the next one first waits for
  it, adds its result to my segment's gradient and frees its full buffer;
* after backward, until the next gather, each parameter *is* its piece of my segment (1-D: its flattened
  elements that fall in my segment, possibly none) and its ``.grad`` the same piece of the averaged gradient,
  views of the segment: ``for p in model.parameters(): p.grad`` works between steps.

**Prefetch.** Unit ``i``'s forward issues unit ``i+1``'s all-gather; unit
``i``'s backward issues the all-gather of the unit before it (the reverse of
this step's forward order). The collectives run on one communication thread
in the order issued (the same on every rank, so the rings match), and move
while this thread computes: the thread makes chapter 01's blocking ring
asynchronous, as a GPU's communication stream does. The price: two full units.

**Peak parameter bytes** per rank during a step (measured at every gather and
free, :attr:`ShardedUnits.peak_param_bytes`)::

    Σ my segments + frozen + root + max over consecutive units (u_i + u_{i+1})

The root is gathered for the whole forward (and again for the whole backward):
it holds the **tied** embedding/head weight, used by the first and the last
layer, and a parameter must stay gathered from its first use to its last (a
parameter used by a module outside its unit raises ``ValueError``). The
whole-model ``ZeRO(stage=3)`` (``"zero3"``) peaks at ``Σ segments + Ψ``. The
gradients peak at the root's full gradient, the unit being filled and the one
being reduce-scattered, beside my segments' gradients
(:func:`coursekit.measure.memory.unit_peak_held_bytes` counts every kind).
**Frozen** parameters are kept whole on every rank, outside every flat buffer:
never sent, never updated.

**Traffic** per step, summed over ranks, with the ring: every unit is
all-gathered twice and reduce-scattered once, ``(N−1)·n_u`` elements each, so
exactly ``3(N−1)Ψ`` whatever the (uneven) segments. Rank ``r`` sends
``3n_u − len_u((r+1) % N) − 2·len_u((r+2) % N)`` of unit ``u``.

The same thing in PyTorch (``tests/test_parallel_fsdp.py`` trains both)::

    coursekit                          FSDP2 (torch.distributed.fsdp)
    ShardedUnits(model, units=...)     fully_shard(block) for each unit, then fully_shard(model)
    a unit / the root unit             a module given to fully_shard / the root module
    unit's flat buffer, ring segment   FSDPParamGroup; each parameter a DTensor, Shard(0) and padded
    prefetch=True                      implicit backward prefetch; set_modules_to_forward_prefetch
    (always) free after forward        reshard_after_forward=True (the root's default is False:
                                       gathered once for forward and backward, 2(N−1)Ψ_root)
    group=                             mesh= (init_device_mesh("cpu", (N,)))
    no_sync()                          set_requires_gradient_sync(False)
    shard_parameters()                 model.parameters() (the DTensor shards)
    full_parameters()                  p.full_tensor()
    frozen: kept whole                 frozen: sharded like the others, not updated
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn as nn

from ...collectives import get_collectives
from ...measure.memory import held_bytes
from ...comm.mesh import as_group, rank_size
from .core import broadcast_parameters
from .precision import LossScaler, MixedPrecision, as_policy, cast_inputs, loss_scaler_for
from .units import (CommThread, Unit, average_whole, cast_whole, default_units, gather_whole, kept_whole,
                    plan_units, restore_whole)

__all__ = ["ShardedUnits", "Unit", "default_units"]


class ShardedUnits(nn.Module):
    """ZeRO-3 by units (see the module docstring): gather, forward, free; gather, backward, free, reduce-scatter.

        >>> model = ShardedUnits(tiny_transformer(seed=0))       # units: blocks.0, blocks.1, root
        >>> optimizer = torch.optim.Adam(model.shard_parameters(), lr=1e-3)
        >>> loss_fn(model(x), y).backward()   # when it returns, every segment's gradient is the average
        >>> optimizer.step(); optimizer.zero_grad()

    Args:
        units: module names, in forward order, or a function of the model giving them (default
            :func:`default_units`; :func:`~coursekit.parallel.data.layer_units` is finer); the rest is the root.
        collectives: ``"ring"`` (chapter 01's, counted by ``comm.record``) or ``"torch"``.
        prefetch: issue the next unit's all-gather ahead and reduce-scatter without waiting (False:
            every collective blocks where it is needed: the baseline prefetch is measured against).
        mp_policy: mixed precision (:class:`~coursekit.parallel.data.MixedPrecision`, ``"bf16"`` or ``"fp16"``),
            as FSDP2's ``mp_policy``: units gathered and computed in ``param_dtype``, my segments an fp32
            master, gradients reduce-scattered in ``reduce_dtype``.
        loss_scaler: fp16's :class:`~coursekit.parallel.data.LossScaler` (None: a dynamic one for fp16; False:
            none). Backward runs on the scaled loss; :meth:`unscale_and_check` (before the optimiser step)
            divides my segments' gradients back and all-reduces whether any rank overflowed.
        replicate: trainable parameters to keep *whole* on every rank, outside every unit: names, or a function
            ``(name, parameter) -> bool`` (:func:`~coursekit.parallel.data.kept_whole`; e.g. ``lambda n, p:
            p.ndim == 1`` for norms and biases). Their gradients are averaged by an all-reduce at the end of
            backward, as plain data parallelism does (FSDP2's nearest is ``fully_shard(ignored_params=...)``,
            which leaves their gradients to you). With ``mp_policy`` they compute in ``param_dtype`` like the
            units (a layer's weight and bias must agree) and keep an fp32 master: the optimiser steps the master.

    An optimiser may take :meth:`shard_parameters` or, as with FSDP2, ``model.parameters()``: after backward
    those are the pieces of my segments (and the whole parameters), so stepping them steps the segments, and
    ``zero_grad()`` over them clears the segments' gradients.
    """

    def __init__(self, module: nn.Module, units: list[str] | None = None, group=None, collectives="ring",
                 tracer=None, prefetch: bool = True, mp_policy: MixedPrecision | str | None = None,
                 loss_scaler: LossScaler | bool | None = None, replicate=None):
        super().__init__()
        self.policy = as_policy(mp_policy)
        self.scaler = loss_scaler_for(self.policy, loss_scaler)
        self.group = as_group(group)
        self.module = broadcast_parameters(module, group=self.group)
        self.rank, self.world_size = rank_size(self.group)
        self.comm, self.prefetch = get_collectives(collectives), prefetch
        self.whole = kept_whole(module, replicate)  # trainable, unsharded: gradients all-reduced
        names = default_units(module) if units is None else units(module) if callable(units) else list(units)
        plan = plan_units(module, names, self.whole)
        self.units = [Unit(n, m, named, self.rank, self.world_size, self.policy.param_dtype) for n, m, named in plan]
        self.root = self.units[-1] if plan and plan[-1][0] == "root" else None
        self.blocks = [u for u in self.units if u is not self.root]  # the units prefetched one by one
        self.frozen = {n: p for n, p in module.named_parameters() if not p.requires_grad}
        for unit in self.blocks:
            unit.module.register_forward_pre_hook(partial(self._before_forward, unit))
            unit.module.register_forward_hook(partial(self._after_forward, unit))
        for unit in self.units:
            for p in unit.params:
                p.register_post_accumulate_grad_hook(partial(self._grad_ready, unit))
        self._thread = CommThread(tracer, asynchronous=prefetch)
        weakref.finalize(self, self._thread.close)
        self._sync, self._order = True, []
        self._in_flight: list[Unit] = []  # units whose reduce-scatter is issued and not yet added (at most one)
        self._settled: list[Unit] = []    # units whose reduced gradient this backward added to my segment
        self._masters: dict[int, torch.Tensor] = {}  # mixed precision: whole parameter -> its fp32 data, while cast
        whole = list(self.frozen.values()) + list(self.whole.values())
        self._fixed = self.peak_param_bytes = held_bytes([u.shard for u in self.units] + whole)
        for unit in self.units:
            self._free(unit)
        self.reset_peak()

    def reset_peak(self) -> int:
        """The peak since the last reset (or construction); start measuring afresh."""
        peak, self.peak_param_bytes = self.peak_param_bytes, self._fixed
        return peak

    def shard_parameters(self) -> list[nn.Parameter]:
        """My segment of every unit, and the parameters kept whole (``replicate``): give these to the optimiser."""
        return [u.shard for u in self.units] + list(self.whole.values())

    def close(self) -> None:
        """Stop and join the communication thread (also done when the model is collected, and at exit)."""
        self._thread.close()

    # ---------------------------------------------------------------- gather, free, measure
    def _issue(self, unit: Unit) -> None:
        """Allocate the unit's full buffer and queue its all-gather (no-op if gathered or on its way)."""
        if unit.gather is not None or unit.gathered:
            return
        unit.flat.untyped_storage().resize_(unit.numel * unit.flat.element_size())
        self._measure()
        unit.gather = self._thread.run(f"all-gather {unit.name}", lambda: self.comm.all_gather(
            unit.shard.data.to(unit.flat.dtype), unit.flat.data, group=self.group))  # mixed: my master, cast

    def _gather(self, unit: Unit) -> None:
        self._issue(unit)
        self._ready(unit)

    def _ready(self, unit: Unit) -> None:
        """Wait for the unit's all-gather; its parameters are full from now on."""
        self._wait(unit, "gather")
        unit.show(full=True)

    def _free(self, unit: Unit) -> None:
        self._wait(unit, "gather")  # never free a buffer the comm thread is still writing
        unit.show(full=False)
        unit.flat.untyped_storage().resize_(0)
        self._measure()

    def _measure(self) -> None:
        alive = self._fixed + sum(u.flat.untyped_storage().nbytes() for u in self.units)
        self.peak_param_bytes = max(self.peak_param_bytes, alive)

    def _wait(self, unit: Unit, which: str) -> None:
        """Wait for the unit's ``"gather"`` or ``"reduce"`` job, if one is on its way."""
        self._thread.wait(getattr(unit, which), f"wait {which} {unit.name}")
        setattr(unit, which, None)

    # ---------------------------------------------------------------- forward
    def forward(self, *args, **kwargs):
        self._order = []
        for unit in self.units:  # zero_grad(set_to_none=True) over model.parameters() cleared my pieces' views:
            if unit.shard.grad is not None and all(p.grad is None for p in unit.params):
                unit.shard.grad = None  # drop the segment's gradient with them, or the next backward adds to it
        if self.policy.mixed and self.policy.cast_forward_inputs:
            args, kwargs = cast_inputs(args, kwargs, self.policy.param_dtype)
        if self.policy.mixed:
            self._cast_whole()
        if self.root is not None:
            self._issue(self.root)
        if self.prefetch and self.blocks:
            self._issue(self.blocks[0])
        if self.root is not None:
            self._ready(self.root)
        output = self.module(*args, **kwargs)
        if self.policy.output_dtype is not None and isinstance(output, torch.Tensor):
            output = output.to(self.policy.output_dtype)
        if torch.is_grad_enabled():
            if not (isinstance(output, torch.Tensor) and output.requires_grad):
                raise ValueError("ShardedUnits gathers the root unit again when backward reaches the model's "
                                 "output, so the module must return one tensor that requires grad.")
            if self.scaler is not None:
                output.register_hook(self.scaler.scale_gradient)  # backward of (loss x scale)
            output.register_hook(self._root_backward)
        if self.root is not None:
            self._free(self.root)
        if not torch.is_grad_enabled():
            self._restore_whole()  # no backward will: the masters come back now
        return output

    def _cast_whole(self) -> None:
        cast_whole(self.whole.values(), self._masters, self.policy.param_dtype)

    def _restore_whole(self) -> None:
        restore_whole(self.whole.values(), self._masters)

    def _before_forward(self, unit: Unit, module, args) -> None:
        self._order.append(unit)
        self._issue(unit)  # usually issued already, by the unit before
        i = self.blocks.index(unit)
        if self.prefetch and i + 1 < len(self.blocks):
            self._issue(self.blocks[i + 1])  # queued behind mine: it moves while I compute
        self._ready(unit)

    def _after_forward(self, unit: Unit, module, args, output) -> None:
        tensors = [output] if isinstance(output, torch.Tensor) else [t for t in output if isinstance(t, torch.Tensor)]
        for t in tensors:
            if t.requires_grad:
                t.register_hook(partial(self._unit_backward, unit))
        self._free(unit)

    # ---------------------------------------------------------------- backward
    def _root_backward(self, grad: torch.Tensor) -> torch.Tensor:
        torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        if self.root is not None:
            self._issue(self.root)
        if self.prefetch and self._order:
            self._issue(self._order[-1])
        if self.root is not None:
            self._start_backward(self.root)
        return grad

    def _unit_backward(self, unit: Unit, grad: torch.Tensor) -> torch.Tensor:
        if not unit.in_backward:
            self._start_backward(unit)
            i = len(self._order) - 1 - self._order[::-1].index(unit)  # its last use in this forward
            if self.prefetch and i > 0:
                self._issue(self._order[i - 1])
        return grad

    def _start_backward(self, unit: Unit) -> None:
        """Gather the unit again and point every ``p.grad`` into its flat gradient buffer."""
        self._gather(unit)
        if unit.flat_grad is None:
            unit.flat_grad = torch.zeros_like(unit.flat)
            self._measure()
        for p, view in zip(unit.params, unit.views(unit.flat_grad).values()):
            p.grad = view
        unit.pending, unit.in_backward = {id(p) for p in unit.params}, True

    def _grad_ready(self, unit: Unit, param: nn.Parameter) -> None:
        unit.pending.discard(id(param))
        if unit.in_backward and not unit.pending:
            self._backward_done(unit)

    def _backward_done(self, unit: Unit) -> None:
        """The unit's gradients are complete: free its parameters, reduce-scatter its gradient."""
        unit.in_backward = False
        self._free(unit)
        if self._sync:
            self._reduce_scatter(unit)

    def _reduce_scatter(self, unit: Unit) -> None:
        """Queue the unit's reduce-scatter, after settling the one in flight: at most one at a time. Mixed
        precision: the gradient is cast to ``reduce_dtype`` here (a copy, held until it is settled), summed in
        it, and my segment kept in the master's dtype."""
        self._settle()
        reduce_dtype = self.policy.reduce(unit.shard.dtype)
        unit.sending = unit.flat_grad.to(reduce_dtype)  # itself when the dtypes agree
        self._measure()
        send = unit.sending

        def work():
            summed = self.comm.reduce_scatter(send, group=self.group)
            unit.reduced = summed.to(unit.shard.dtype).div(self.world_size)

        unit.reduce = self._thread.run(f"reduce-scatter {unit.name}", work)
        self._in_flight.append(unit)

    def _settle(self) -> None:
        """Wait for the reduce-scatters in flight; add each result to my segment's gradient; free the full one."""
        for unit in self._in_flight:
            self._wait(unit, "reduce")
            unit.shard.grad = unit.reduced if unit.shard.grad is None else unit.shard.grad + unit.reduced
            unit.reduced, unit.flat_grad, unit.sending = None, None, None
            for p in unit.params:  # their views kept the full gradient alive
                p.grad = None
            self._settled.append(unit)
        self._in_flight = []

    def _finish_backward(self) -> None:
        """End of backward (queued on autograd's engine): finish every unit, wait for the reduce-scatters."""
        for unit in self.units:
            if unit.in_backward:  # some parameter got no gradient: it counts as zero, as in DDP
                self._backward_done(unit)
            elif self._sync and unit.flat_grad is not None and unit not in self._in_flight:
                self._reduce_scatter(unit)  # accumulated under no_sync, not reached by this backward
        if not self._sync:
            return
        self._settle()
        for unit in self._settled:
            self._expose_pieces(unit)  # the full gradient buffer is freed: only my segment stays
        self._settled = []
        if self.whole:  # on the comm thread too: every rank's collectives in one order
            self._restore_whole()  # mixed precision: the masters back, gradients in fp32 before they are summed
            whole, dtype = list(self.whole.values()), self.policy.reduce_dtype
            self._thread.wait(self._thread.run("all-reduce whole", lambda: average_whole(
                whole, self.comm.all_reduce, self.group, self.world_size, dtype)), "wait all-reduce whole")

    def _expose_pieces(self, unit: Unit) -> None:
        """Each parameter reads, until its next gather, as its piece of my segment; ``.grad`` as the same piece
        of my segment's gradient (views: no bytes added). So ``for p in model.parameters(): p.grad`` works
        between steps, and :func:`~coursekit.parallel.data.clip_grad_norm_` over them sees every element once
        across the ranks. A piece is 1-D: the parameter's flattened elements in my segment (FSDP1's flat
        sharding; FSDP2 cuts each parameter by rows, ``Shard(0)``)."""
        for p, (lo, hi) in zip(unit.params, unit.pieces()):
            p.data = unit.shard.data[lo:hi]
            p.grad = unit.shard.grad[lo:hi]

    def unscale_and_check(self) -> bool:
        """With a loss scaler (fp16): unscale my segments' gradients; False if any rank's overflowed (skip the
        step). One all-reduce of a flag, since each rank sees only its segments. Without one: True."""
        if self.scaler is None:
            return True
        grads = [u.shard.grad for u in self.units] + [p.grad for p in self.whole.values()]
        return self.scaler.unscale_and_update(grads, group=self.group)

    @contextmanager
    def no_sync(self):
        """Backward passes inside keep the full unit gradients (no reduce-scatter): gradient accumulation."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    # ---------------------------------------------------------------- for the record (torch's collectives: not counted)
    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Every averaged gradient, whole (gathered for the record only, outside the counted traffic)."""
        missing = [u.name for u in self.units if u.shard.grad is None]
        if missing:
            raise RuntimeError(f"no gradient segment for unit(s) {missing}: run forward and backward first "
                               f"(or a reduce-scatter never ran).")
        return {**gather_whole(self.units, lambda u: u.shard.grad, self.group),
                **{n: p.grad for n, p in self.whole.items() if p.grad is not None}}

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole, frozen ones included (for the record only)."""
        whole = gather_whole(self.units, lambda u: u.shard.data, self.group)
        return {**whole, **{n: p.data for n, p in {**self.frozen, **self.whole}.items()}}
