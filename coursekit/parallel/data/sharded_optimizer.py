"""ZeRO stage 1 as an optimiser: :class:`ShardedOptimizer`, shaped like PyTorch's ``ZeroRedundancyOptimizer``.

:class:`coursekit.parallel.data.ZeRO` wraps the *model*; this is a ``torch.optim.Optimizer`` over a plain
model you call yourself. Your data parallelism (torch DDP, :class:`~coursekit.parallel.data.DataParallel`,
:func:`~coursekit.parallel.data.average_gradients`) has already averaged the gradients, so every rank holds
them whole; only the optimiser state is sharded::

    model = DataParallel(tiny_transformer(seed=0))            # or torch DDP
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = ShardedOptimizer([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                           torch.optim.AdamW, lr=1e-3)
    loss_fn(model(x), y).backward()           # averaged by the time backward returns (as torch DDP)
    opt.step()                                # step my segments, all-gather all of them
    opt.zero_grad()

**What is sharded.** Each param group's trainable parameters lie end to end in one flat buffer (each
parameter becomes a view into it, as with ``ZeroRedundancyOptimizer(parameters_as_bucket_view=True)``),
cut into ``N`` segments as chapter 01's ring cuts a tensor: rank ``r`` owns segment ``(r + 1) % N``, where
the ring's reduce-scatter leaves the complete sum -- :class:`ZeRO`'s layout. The wrapped optimiser
``self.optim`` sees one parameter per group, my segment (a view into the buffer), and keeps state for it
only (``self.state`` is that state). Bytes per rank: AdamW ``8·s_g + 4`` for a group whose segment has
``s_g`` elements (fp32 ``exp_avg``, ``exp_avg_sq`` and a 4-byte ``step``) against ``8Ψ + 4·tensors``
unsharded; SGD with momentum ``4·s_g``. Frozen parameters (``requires_grad=False`` when their group is
added) stay out of the buffers: no state, never updated.

**What moves.** ``step()`` copies my segment of the averaged gradients, steps it, and **all-gathers** each
group's buffer so the replicas are identical again: ``(N−1)·Ψ`` elements per step (``collectives="ring"``:
chapter 01's ring, counted by ``coursekit.comm.record``; ``"torch"``: gloo's). Added to the all-reduce's
``2(N−1)Ψ`` that is ``3(N−1)Ψ``, one all-gather more than :class:`ZeRO`, which reduce-scatters instead of
all-reducing: the price of leaving your data parallelism as it is (``ZeroRedundancyOptimizer`` pays it
too). In return the gradients are whole on every rank, so ``clip_grad_norm_`` works as usual.

**Why only element-wise optimisers are exact.** A segment cuts parameters apart and glues pieces of
different ones together. SGD, Adam, AdamW, ... update each element from its own gradient and state, so
their result on segments is the unsharded one; LBFGS (a line search over all parameters), Adafactor (row
and column statistics) or Muon (whole matrices) cannot work on a piece and are refused.
(``ZeroRedundancyOptimizer`` keeps parameters whole, so it only needs a per-parameter optimiser.) And as a
segment is stepped as one tensor, within a group every trainable parameter has a gradient, or none has.

**Checkpoints**, as in ``ZeroRedundancyOptimizer``: ``consolidate_state_dict(to=0)`` on every rank, then
``state_dict()`` on rank ``to`` is the *full* state in the plain optimiser's format (``exp_avg`` shaped
like its parameter). No world size is in it: ``load_state_dict`` on the ranks of any ``N``, or on a plain
``torch.optim.AdamW``, takes its part and continues exactly.

===========================================  ==================================================
coursekit                                    ``torch.distributed.optim``
===========================================  ==================================================
``ShardedOptimizer``                         ``ZeroRedundancyOptimizer``
``optimizer_class``, ``**defaults``          ``optimizer_class``, ``**defaults``
``group`` (process group or mesh axis)       ``process_group``
segment ``(r + 1) % N`` of a flat buffer     whole parameters, assigned greedily by size
always flat views                            ``parameters_as_bucket_view=True``
all-gather (``collectives="ring"|"torch"``)  one broadcast per rank
``consolidate_state_dict(to=0)``             ``consolidate_state_dict(to=0)``
``state_dict()`` / ``load_state_dict()``     the same (full state on ``to``; each rank loads its part)
``self.optim``                               ``self.optim`` (this rank's local optimiser)
strategy ``"sharded_optimizer"``             ``"torch_zero1"`` (DDP + ZeroRedundancyOptimizer)
--                                           ``overlap_with_ddp``
===========================================  ==================================================
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from ...collectives import Collectives, get_collectives, owned_segment, segment_bounds
from ...comm.mesh import as_group, rank_size
from ...strategy import Setup, register
from .replicated import Bucketed
from .torch import optimizer_class_and_defaults

__all__ = ["ShardedOptimizer", "ShardedOptimizerStrategy", "ELEMENTWISE"]

# torch's optimisers that update every element from its own gradient and state alone.
ELEMENTWISE = tuple(getattr(torch.optim, n) for n in ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam",
                                                      "RMSprop", "Adagrad", "Adadelta", "Rprop", "ASGD"))
_NOT_ELEMENTWISE = {
    "LBFGS": "it treats all parameters as one vector (line search, curvature pairs over every element)",
    "Adafactor": "it factors a matrix's second moment into row and column statistics of the whole tensor",
    "Muon": "it orthogonalises each whole weight matrix",
    "SparseAdam": "it needs sparse gradients of whole embedding rows, not slices of a dense buffer",
}
_SCALAR_KEYS = ("step", "eta", "mu", "mu_product")  # per-tensor state that is not per-element


def _check_elementwise(optimizer_class: type, elementwise: bool) -> None:
    name = getattr(optimizer_class, "__name__", repr(optimizer_class))
    if name in _NOT_ELEMENTWISE:
        raise ValueError(f"{name} cannot be sharded into flat segments: {_NOT_ELEMENTWISE[name]}, while each "
                         f"rank sees only a slice of the parameters, cut across tensors. Use an element-wise "
                         f"optimiser (SGD, Adam, AdamW, ...).")
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError(f"optimizer_class must be a torch.optim.Optimizer subclass such as torch.optim.AdamW, "
                        f"not {optimizer_class!r} (pass the class, not an instance).")
    if not (elementwise or issubclass(optimizer_class, ELEMENTWISE)):
        raise ValueError(f"{name} is not one of torch's element-wise optimisers {[c.__name__ for c in ELEMENTWISE]};"
                         f" a segment cuts tensors apart, so the update must treat each element on its own. "
                         f"If {name} does, pass elementwise=True.")


class _FlatGroup:
    """One param group's trainable parameters end to end in one buffer (each a view into it); my segment."""

    def __init__(self, params: list[nn.Parameter], index: int, rank: int, world_size: int):
        self.params = [p for p in params if p.requires_grad]
        self.frozen = [p for p in params if not p.requires_grad]
        self.index = index
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) > 1:
            raise ValueError(f"param group {index} mixes dtypes/devices {sorted(map(str, kinds))}: its parameters "
                             f"share one flat buffer. Put parameters of each dtype in a param group of their own.")
        dtype, device = next(iter(kinds)) if kinds else (torch.float32, torch.device("cpu"))
        self.offsets, self.numel = [], 0
        for p in self.params:
            self.offsets.append(self.numel)
            self.numel += p.numel()
        self.start, self.stop = segment_bounds(self.numel, world_size)[owned_segment(rank, world_size)]
        self.flat = torch.empty(self.numel, dtype=dtype, device=device)
        with torch.no_grad():
            for p, offset in zip(self.params, self.offsets):
                self.flat[offset:offset + p.numel()].copy_(p.reshape(-1))
                p.data = self.flat[offset:offset + p.numel()].view_as(p)
        self.shard = nn.Parameter(self.flat[self.start:self.stop])  # a view: stepping it updates the model

    def segment_of(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """My segment of ``tensors`` (one per parameter, shaped like it) laid end to end."""
        out = torch.empty(self.stop - self.start, dtype=self.flat.dtype, device=self.flat.device)
        for t, offset in zip(tensors, self.offsets):
            a, b = max(offset, self.start), min(offset + t.numel(), self.stop)
            if a < b:
                out[a - self.start:b - self.start].copy_(t.reshape(-1)[a - offset:b - offset])
        return out

    def gradient_segment(self) -> torch.Tensor | None:
        """My segment of the gradients, or None when no parameter of the group has one (then it is skipped)."""
        for p in self.frozen:
            if p.grad is not None:
                raise RuntimeError(f"a parameter of param group {self.index} (shape {tuple(p.shape)}) has a "
                                   f"gradient but was frozen when the group was added, so it has no place in the "
                                   f"flat buffer. Unfreeze before building the optimiser (or add_param_group).")
        for p, offset in zip(self.params, self.offsets):
            if p.data_ptr() != self.flat[offset:].data_ptr():
                raise RuntimeError(f"a parameter of param group {self.index} (shape {tuple(p.shape)}) no longer "
                                   f"lives in the optimiser's flat buffer (model.to()? p.data = ...?): build the "
                                   f"optimiser after moving the model.")
        missing = [p for p in self.params if p.grad is None]
        if len(missing) == len(self.params):
            return None
        if missing:
            raise RuntimeError(f"param group {self.index}: {len(missing)} of {len(self.params)} trainable "
                               f"parameters have no gradient (first: shape {tuple(missing[0].shape)}). A segment "
                               f"is stepped as one tensor and cannot skip part of itself as torch optimisers skip "
                               f"a parameter: freeze it, give it a param group of its own, or give it a zero "
                               f"gradient (zero_grad(set_to_none=False); AdamW then still decays and moves it).")
        return self.segment_of([p.grad for p in self.params])


def _hyper(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


def _per_element(key: str, value: Any) -> bool:
    """Is this state entry one value per element (sharded), rather than one per tensor (``step``)?"""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and key not in _SCALAR_KEYS


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer_class`` with its state sharded over the ranks of ``group`` (ZeRO-1); see the module docstring.

    Args:
        params: parameters or param groups (dicts), as for any torch optimiser.
        optimizer_class: an element-wise ``torch.optim.Optimizer`` subclass, e.g. ``torch.optim.AdamW``.
        group: the data-parallel process group, or a mesh axis (``mesh["dp"]``); None: all ranks.
        collectives: ``"ring"`` (chapter 01's, counted) or ``"torch"`` for the all-gather.
        elementwise: vouch that an ``optimizer_class`` torch does not ship is element-wise.
        **defaults: the optimiser's arguments (``lr=1e-3, weight_decay=0.1``, ...).
    """

    def __init__(self, params: Iterable, optimizer_class: type[torch.optim.Optimizer], group=None,
                 collectives: str | Collectives = "ring", elementwise: bool = False, **defaults: Any):
        _check_elementwise(optimizer_class, elementwise)
        self.process_group = as_group(group)
        self.rank, self.world_size = rank_size(self.process_group)
        self.comm = get_collectives(collectives)
        self.optim: torch.optim.Optimizer | None = None
        self._flats: list[_FlatGroup] = []
        self._consolidated: dict | None = None
        super().__init__(params, defaults)  # calls add_param_group for every group
        self.optim = optimizer_class([{**_hyper(g), "params": [f.shard]} for g, f in zip(self.param_groups,
                                                                                         self._flats)], **defaults)
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            outer.update(_hyper(inner))  # show the optimiser's own defaults (betas, eps, ...) too
        self.state = self.optim.state  # this rank's state, keyed by its segments

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (its own flat buffer, cut into segments); the same call on every rank."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self._flats.append(_FlatGroup(group["params"], len(self._flats), self.rank, self.world_size))
        if self.optim is not None:
            self.optim.add_param_group({**_hyper(group), "params": [self._flats[-1].shard]})
            group.update(_hyper(self.optim.param_groups[-1]))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        """Step my segment of every group on the averaged gradients, then all-gather every group's buffer."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for outer, inner, flat in zip(self.param_groups, self.optim.param_groups, self._flats):
            inner.update(_hyper(outer))  # e.g. an LR scheduler changed the outer groups
            gradient = flat.gradient_segment()
            flat.shard.grad = gradient if gradient is not None and gradient.numel() else None
        self.optim.step()
        for flat in self._flats:
            flat.shard.grad = None  # the segment's gradient was a copy: free it
            if self.world_size > 1 and flat.numel:
                self.comm.all_gather(flat.shard.data, flat.flat, group=self.process_group)
        return loss

    # ---------------------------------------------------------------- checkpoints
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's segment state on rank ``to`` of the group (call it on every rank)."""
        if not 0 <= to < self.world_size:
            raise ValueError(f"consolidate_state_dict(to={to}): the group has ranks 0..{self.world_size - 1}.")
        local = self.optim.state_dict()["state"]  # {group index: state of my segment}
        if self.world_size == 1:
            pieces = [local]
        else:
            pieces = [None] * self.world_size if self.rank == to else None
            dist.gather_object(local, pieces, group=self.process_group, group_dst=to)
        self._consolidated = self._assemble(pieces) if self.rank == to else None

    def _assemble(self, pieces: list[dict]) -> dict:
        """The plain optimiser's state dict from every rank's segment states (segment k is rank (k-1)%N's)."""
        index = {id(p): i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
        owners, state = [(k - 1) % self.world_size for k in range(self.world_size)], {}
        for g, flat in enumerate(self._flats):
            present = [pieces[r][g] for r in owners if pieces[r].get(g)]  # an empty segment has no state
            if not present:
                continue
            sharded = {key for key, value in present[0].items() if _per_element(key, value)}
            full = {key: torch.cat([s[key].reshape(-1) for s in present]) if key in sharded else _copy(value)
                    for key, value in present[0].items()}
            for p, offset in zip(flat.params, flat.offsets):
                state[index[id(p)]] = {key: v[offset:offset + p.numel()].view_as(p).clone() if key in sharded
                                       else _copy(v) for key, v in full.items()}
        groups = [{**_hyper(g), "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups]
        return {"state": state, "param_groups": groups}

    def state_dict(self) -> dict:
        """The full state (plain optimiser format) consolidated on this rank by :meth:`consolidate_state_dict`."""
        if self._consolidated is None:
            raise RuntimeError(f"the optimiser state is sharded: call consolidate_state_dict(to={self.rank}) on "
                               f"every rank first, then state_dict() on rank {self.rank} of the group.")
        return self._consolidated

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full state dict (from :meth:`state_dict`, any world size, or a plain optimiser): my segment."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, self.param_groups)):
            raise ValueError("the state dict's param groups do not match this optimiser's (number of groups, or "
                             "of parameters in a group): build the optimiser with the same groups.")
        saved_index = {id(p): i for s, g in zip(saved_groups, self.param_groups) for i, p in zip(s["params"],
                                                                                                 g["params"])}
        local = {}
        for g, (saved, group, flat) in enumerate(zip(saved_groups, self.param_groups, self._flats)):
            group.update(_hyper(saved))
            states = [state_dict["state"].get(saved_index[id(p)]) for p in flat.params]
            if not any(states):
                continue
            if not all(states):
                raise ValueError(f"param group {g}: some parameters have optimiser state and some have none; a "
                                 f"segment's state is one tensor, so it needs all of them or none.")
            local[g] = {}
            for key, value in states[0].items():
                if _per_element(key, value):
                    local[g][key] = flat.segment_of([s[key] for s in states])
                elif any(not torch.equal(torch.as_tensor(s[key]), torch.as_tensor(value)) for s in states):
                    raise ValueError(f"param group {g}: {key!r} differs between its parameters; one segment "
                                     f"holds one {key!r} for all of them.")
                else:
                    local[g][key] = _copy(value)
        held = {g: s for g, s in local.items() if self._flats[g].stop > self._flats[g].start}  # empty: none
        self.optim.load_state_dict({"state": held, "param_groups": [{**_hyper(g), "params": [i]} for i, g in
                                                                    enumerate(self.param_groups)]})
        self.state = self.optim.state  # load_state_dict made a new one


@register("sharded_optimizer")
class ShardedOptimizerStrategy(Bucketed):
    """ZeRO-1 as an optimiser in the loop: bucketed :class:`DataParallel` averages the gradients, then
    :class:`ShardedOptimizer` (the loop's optimiser class and arguments) steps my segments and all-gathers."""

    options = {**Bucketed.options, "collectives": "ring"}

    def __init__(self, setup: Setup):
        self.setup = setup
        optimizer_class, defaults = optimizer_class_and_defaults(setup)  # as "torch_zero1" reads them
        group, collectives = setup.group("dp"), self.option("collectives")
        super().__init__(replace(setup, optimizer_fn=lambda params: ShardedOptimizer(
            params, optimizer_class, group=group, collectives=collectives, **defaults)))
