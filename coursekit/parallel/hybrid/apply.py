"""The composition, one application per parallelism, in torchtitan's order: tensor, sequence, pipeline, data.

Each takes the model and the mesh and returns the model, parallelized along one more axis of the mesh::

    model = apply_tp(model, mesh)                              # chapter 05: Megatron layers on mesh["tp"]
    model = apply_sp(model, mesh, attention)                   # chapter 06: each rank its tokens, ring attention
    model = apply_pp(model, mesh, optimizer_fn, sizes, ...)    # chapters 03-04: this rank's stages, a schedule a step
    model = apply_dp(model, mesh, optimizer_fn, collectives)   # chapter 02: gradients summed over dp × sp, ZeRO-1

An axis of degree 1 leaves the model as it is (``apply_pp`` still cuts it into layers: a pipeline of one stage is
the plain model, forward then backward per micro-batch). :class:`~coursekit.parallel.hybrid.Hybrid` runs the four
in this order and trains what results.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch.nn as nn

from ... import collectives as _collectives
from ...comm.mesh import Mesh
from ...strategy import Setup
from ..data import ShardedOptimizer, all_reduce_flat
from ..pipeline import PipelineParallel
from ..tensor import parallelize_transformer
from .layers import composed_layers

__all__ = ["apply_tp", "apply_sp", "apply_pp", "apply_dp", "DataParallelPipeline"]


def apply_tp(model: nn.Module, mesh: Mesh) -> nn.Module:
    """Chapter 05: the course transformer in its Megatron form on ``mesh["tp"]`` (``tp = 1``: the model itself)."""
    return parallelize_transformer(model, mesh["tp"]) if mesh.size("tp") > 1 else model


def apply_sp(model: nn.Module, mesh: Mesh, attention: Callable, layout: str = "zigzag") -> nn.Module:
    """Chapter 06: the model's layers on this rank's tokens, each attention ``attention(q, k, v)`` -- ring attention
    over ``mesh["sp"]`` -- as an ``nn.Sequential`` a pipeline can cut (``sp = 1``: the model itself)."""
    if mesh.size("sp") == 1:
        return model
    return _sequential(composed_layers(model, sequence=(mesh["sp"].group, layout, attention)))


def apply_pp(model: nn.Module, mesh: Mesh, optimizer_fn: Callable, layers_per_stage: list[int], *,
             schedule="1f1b", stages_per_rank: int = 1, tracer=None) -> PipelineParallel:
    """Chapters 03-04: the model's layers cut into ``pp × stages_per_rank`` stages of ``layers_per_stage`` layers on
    ``mesh["pp"]``; this rank keeps its stages and runs one schedule over the micro-batches of each step."""
    layers = model if isinstance(model, nn.Sequential) else _sequential(
        composed_layers(model, tensor=mesh.size("tp") > 1))
    return PipelineParallel(Setup(layers, optimizer_fn, mesh, tracer, {"schedule": schedule,
                                                                       "stages_per_rank": stages_per_rank,
                                                                       "layers_per_stage": layers_per_stage}))


class DataParallelPipeline:
    """What :func:`apply_dp` returns: the pipelined model, and :meth:`synchronize`, which sums every gradient of this
    rank's stages over the ranks that hold a part of the global batch (``dp × sp``, flattened) and divides by dp:
    the sequence ranks' shares add up, the data slices average."""

    def __init__(self, pipe: PipelineParallel, batch_axis, dp: int, all_reduce: Callable):
        self.pipe, self.batch_axis, self.dp, self.all_reduce = pipe, batch_axis, dp, all_reduce

    def synchronize(self, params: list[nn.Parameter]) -> None:
        """One all-reduce of ``params``' gradients, flattened, divided by dp."""
        all_reduce_flat([p.grad for p in params], self.batch_axis.group, self.all_reduce, divide_by=self.dp)


def apply_dp(pipe: PipelineParallel, mesh: Mesh, optimizer_class: tuple[type, dict] | None = None,
             collectives: str = "ring") -> DataParallelPipeline:
    """Chapter 02: the gradients of ``pipe``'s stages summed over ``dp × sp`` after each step's backwards, and with
    ``optimizer_class`` -- ``(class, defaults)`` -- the optimizer state sharded over ``mesh["dp"]`` (ZeRO-1).
    Every rank calls it (flattening the two axes builds a group)."""
    if optimizer_class is not None:
        cls, defaults = optimizer_class
        pipe.optimizer = ShardedOptimizer([p for _, p in pipe.own], cls, group=mesh["dp"], collectives=collectives,
                                          **defaults)
    return DataParallelPipeline(pipe, mesh.flatten(("dp", "sp")), mesh.size("dp"),
                                _collectives.get_collectives(collectives).all_reduce)


def _sequential(named: list[tuple[str, nn.Module]]) -> nn.Sequential:
    return nn.Sequential(OrderedDict((name.replace(".", "_"), layer) for name, layer in named))
