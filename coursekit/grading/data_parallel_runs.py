"""What runs on each rank in exercise 02, and the one-process answers it is compared with.

Each rank function trains one case around the learner's function and returns ``(records, traffic, moved)``
and, for the hooks, the all-reduces each step started (:mod:`.data_parallel_watch`), for ZeRO-2 what stays
allocated: the step records of :mod:`coursekit.measure.verify`, what went through ``coursekit.comm``'s
point-to-point calls during backward (or the reduce-scatter), and the parameters the learner's hooks changed.
A case is ``(model name, frozen parameters, world size, steps, global batch)``, for the hooks followed by the
bucket size in elements and whether the ranks form a 2 × 2 mesh whose dp groups average apart (``mesh``: the
two groups train on different batches, so averaging over the whole world shows).
"""

from __future__ import annotations

import functools

import torch

from .. import comm
from ..collectives import owned_segment, ring_all_gather, segment_bounds
from ..comm.mesh import Mesh
from ..models import LanguageData, TeacherData, loss_fn, tiny_mlp, tiny_transformer
from ..parallel.data import shard_batch
from ..measure.verify import FlatShard, record_step, reference_run
from .data_parallel_watch import watching

__all__ = ["MESH", "SHIFT", "setup", "reference", "data_group", "hooks_rank", "micro_batches", "accumulation_rank", "micro_batch_means",
           "zero2_rank"]


MESH = {"dp": 2, "tp": 2}  # the hidden sub-group case: each dp group ([0, 2] and [1, 3]) averages apart
SHIFT = 100                # the second dp group trains on the batches SHIFT steps on


def setup(name: str, freeze: tuple = ()):
    if name == "mlp":
        model, data, make_opt = tiny_mlp(seed=0), TeacherData(), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    else:
        # SGD with momentum: Adam divides by sqrt(v), which turns the rounding noise of a gradient
        # that is almost exactly zero into a visible step, and would fail correct code by chance.
        model, data = tiny_transformer(seed=0), LanguageData(seq_len=12)
        make_opt = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    for n, p in model.named_parameters():
        if n in freeze:
            p.requires_grad_(False)
    return model, data, make_opt


@functools.lru_cache(maxsize=16)
def reference(name, freeze, steps, global_batch, shift=0):
    """One process on the global batches (cached: several checks share a reference; nobody mutates it)."""
    model, data, make_opt = setup(name, freeze)
    optimizer = make_opt([p for p in model.parameters() if p.requires_grad])
    return reference_run(model, optimizer, [data.batch(s + shift, global_batch) for s in range(steps)], loss_fn)


def data_group(rank, world_size, mesh: bool):
    """``(group, rank in it, its size, batch shift)``: the whole world, or this rank's dp group of :data:`MESH`."""
    if not mesh:
        return None, rank, world_size, 0
    grid = Mesh(MESH)
    return grid["dp"], comm.get_rank(grid["dp"]), grid.size("dp"), SHIFT * grid.coordinates()["tp"]


def attached(attach, model, bucket, group):
    """The learner's ``finish``: what ``attach_gradient_averaging`` must return (a function to call)."""
    finish = attach(model, bucket, group=group)
    if not callable(finish):
        raise TypeError(f"attach_gradient_averaging returned {type(finish).__name__}: return finish, the function "
                        f"the training loop calls after each loss.backward() (it waits for the all-reduces)")
    return finish


def _backward(model, loss, finish, moved: set, during: comm.Traffic) -> list:
    """``loss.backward()`` then ``finish()``, watched: the all-reduces started, and the parameters changed."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    log: list = []
    with comm.record() as traffic, watching(log):
        loss.backward()
        finish()
    during.transfers += traffic.transfers
    moved |= {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    return log


def hooks_rank(rank, world_size, attach, name, freeze, steps, global_batch, bucket, mesh=False):
    model, data, make_opt = setup(name, freeze)
    group, dp_rank, dp_size, shift = data_group(rank, world_size, mesh)
    finish = attached(attach, model, bucket, group)
    optimizer = make_opt([p for p in model.parameters() if p.requires_grad])
    records, during, moved, issued = [], comm.Traffic(), set(), []
    for step in range(steps):
        x, y, weight = shard_batch(*data.batch(step + shift, global_batch), dp_rank, dp_size)
        optimizer.zero_grad(set_to_none=True)
        output = model(x)
        loss = loss_fn(output, y) * weight
        issued.append(_backward(model, loss, finish, moved, during))
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        records.append(record_step(output, loss.item() / dp_size, grads, model))  # summed over the group below
    return records, during, sorted(moved), issued


def micro_batches(inputs, targets, weight):
    """A rank's shard as two micro-batches, each weighted by its share: the two losses add up to the shard's."""
    parts = list(zip(inputs.tensor_split(2), targets.tensor_split(2)))
    return [(x, y, weight * x.shape[0] / inputs.shape[0]) for x, y in parts]


def accumulation_rank(rank, world_size, attach, name, freeze, steps, global_batch, bucket, mesh=False):
    """Gradient accumulation: two micro-batches per rank, two ``loss.backward()`` (each followed by ``finish()``)
    before each optimiser step."""
    model, data, make_opt = setup(name, freeze)
    finish = attached(attach, model, bucket, None)
    optimizer = make_opt([p for p in model.parameters() if p.requires_grad])
    records, moved, during = [], set(), comm.Traffic()
    for step in range(steps):
        x, y, weight = shard_batch(*data.batch(step, global_batch), rank, world_size)
        optimizer.zero_grad(set_to_none=True)
        outputs, total = [], 0.0
        for micro_x, micro_y, micro_weight in micro_batches(x, y, weight):
            output = model(micro_x)
            loss = loss_fn(output, micro_y) * micro_weight
            _backward(model, loss, finish, moved, during)   # accumulates into p.grad; the hooks run each time
            outputs.append(output.detach())
            total += loss.item()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        records.append(record_step(torch.cat(outputs), total / world_size, grads, model))
    return records, None, sorted(moved)


@functools.lru_cache(maxsize=8)
def micro_batch_means(name, freeze, world_size, global_batch):
    """Step 0's gradient of each micro-batch, averaged over the ranks (one process): the two parts of the answer."""
    model, data, _ = setup(name, freeze)
    inputs, targets = data.batch(0, global_batch)
    means = []
    for micro in range(2):
        model.zero_grad(set_to_none=True)
        for rank in range(world_size):
            x, y, weight = micro_batches(*shard_batch(inputs, targets, rank, world_size))[micro]
            (loss_fn(model(x), y) * weight / world_size).backward()
        means.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
    return means


def zero2_rank(rank, world_size, reduce_scatter_gradients, name, freeze, steps, global_batch):
    """A whole ZeRO-2 training loop around the learner's reduce-scatter."""
    model, data, make_opt = setup(name, freeze)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    layout = [(n, tuple(p.shape)) for n, p in named]
    numel = sum(p.numel() for _, p in named)
    start, stop = segment_bounds(numel, world_size)[owned_segment(rank, world_size)]
    flat = torch.cat([p.detach().reshape(-1) for _, p in named])
    offset = 0
    for _, p in named:  # parameters become views into one flat buffer
        p.data = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    shard = torch.nn.Parameter(flat[start:stop])
    optimizer = make_opt([shard])
    records, traffic_per_step, still_held = [], [], []
    for step in range(steps):
        x, y, weight = shard_batch(*data.batch(step, global_batch), rank, world_size)
        output = model(x)
        loss = loss_fn(output, y) * weight
        loss.backward()
        with comm.record() as traffic:
            try:
                mine = reduce_scatter_gradients(model)
            except AttributeError as error:
                if "NoneType" not in str(error) or not any(not p.requires_grad for p in model.parameters()):
                    raise
                raise AttributeError(f"{error}: a frozen parameter (requires_grad=False) has no gradient, p.grad is "
                                     f"None: flatten only the trainable parameters") from None
        traffic_per_step.append(traffic)
        if not isinstance(mine, torch.Tensor):
            raise TypeError(f"reduce_scatter_gradients returned {type(mine).__name__}, expected a tensor")
        # What stays allocated: the p.grad not freed, and the storage behind the returned segment (a view into
        # the flat buffer of every gradient keeps all of it alive).
        still_held.append({"grads": sum(p.grad.numel() for _, p in named if p.grad is not None),
                           "returned": mine.numel(),
                           "storage": mine.untyped_storage().nbytes() // mine.element_size()})
        mine = mine.detach().reshape(-1)
        if mine.numel() != stop - start:
            everything = sum(p.numel() for p in model.parameters())
            a, b = segment_bounds(everything, world_size)[owned_segment(rank, world_size)]
            frozen = (f" — that is its segment of all {everything} parameters, frozen ones included: flatten only "
                      f"those with requires_grad") if everything != numel and mine.numel() == b - a else ""
            raise ValueError(f"rank {rank} returned {mine.numel()} elements; it owns segment "
                             f"{owned_segment(rank, world_size)} = elements {start}:{stop} ({stop - start}) "
                             f"of the {numel} flattened gradients of the trainable parameters{frozen}")
        shard.grad = mine.clone()
        optimizer.step()
        ring_all_gather(flat[start:stop], flat)  # (not counted: outside the recorded block)
        for _, p in named:
            p.grad = None
        frozen = {n: p.data for n, p in model.named_parameters() if not p.requires_grad}
        records.append(record_step(output, loss.item() / world_size, FlatShard(layout, start, shard.grad),
                                   FlatShard(layout, start, shard.data, frozen)))
    return records, comm.Traffic.merge(traffic_per_step), (), still_held  # () : no weights moved during backward
