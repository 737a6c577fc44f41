"""Model parallelism (inter-layer, "inter-op"): a model's layers cut into contiguous *stages*, one per rank.

The seed's example (claim P3): a two-layer network, the hidden layer on GPU 1 (rank 0) and the output
layer on GPU 2 (rank 1). Forward, rank 0 computes the hidden activations and **sends** them to rank 1,
which computes the output and the loss. Backward, rank 1 computes the gradient of the loss with respect to
the activations it received and sends it **back**; rank 0 carries on backward from there. Each rank holds
only its stage's parameters -- the point of it -- but while one rank computes the other waits: a chain, with
one rank busy at a time (pipelining, :mod:`coursekit.parallel.pipeline`, fills it with micro-batches).

    >>> from coursekit.models import tiny_mlp
    >>> [len(stage) for stage in split(tiny_mlp(n_layers=2), 2)]          # hidden layer | output layer
    [1, 1]
    >>> train(rank, world_size, "model", model="transformer")              # doctest: +SKIP

* :func:`layers` -- a model as the list of layers whose composition is its forward (the transformer:
  embedding | block | ... | block | final norm + head).
* :func:`partition` -- how many layers each stage gets: contiguous, balanced by a cost per layer
  (:func:`layer_costs`: parameter count, or measured forward + backward time).
* :func:`split` -- the stages themselves, sharing the model's parameters.
* :class:`~coursekit.parallel.pipeline.Channel` -- activations forward and gradients back, through
  :mod:`coursekit.comm` (counted), and :func:`~coursekit.parallel.pipeline.sum_tied_gradients`: the tied
  embedding / output head lives on the first and the last stage; each copy gets only its own stage's
  gradient, so the two are summed (Megatron-LM's "embedding group").
* :class:`ModelParallel` -- the strategy ``"model"`` for :func:`coursekit.train.train`.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from ... import comm
from ...models import MLP, Transformer
from ...strategy import Setup, Strategy, register
from ...measure.verify import NamedPart
from .comm import Channel, broadcast_loss, sum_tied_gradients, tied_parameters

__all__ = ["layers", "layer_costs", "partition", "split", "StagedStrategy", "ModelParallel", "Channel",
           "tied_parameters", "sum_tied_gradients", "broadcast_loss"]


# --------------------------------------------------------------------------- layers
class Embedding(nn.Module):
    """The transformer's first layer: token plus position embedding."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.tok_emb, self.pos_emb, self.max_seq_len = model.tok_emb, model.pos_emb, model.max_seq_len

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.shape[1] > self.max_seq_len:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds max_seq_len={self.max_seq_len}.")
        return self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    """The transformer's last layer: final LayerNorm, then the output head (tied to the token embedding)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))


def layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, layer)`` pairs whose composition, in order, is ``model``'s forward; they share its parameters."""
    if isinstance(model, MLP):
        n = len(model.layers)
        return [(f"layers.{i}" + ("+gelu" if i < n - 1 else ""),
                 nn.Sequential(layer, nn.GELU()) if i < n - 1 else layer) for i, layer in enumerate(model.layers)]
    if isinstance(model, Transformer):
        return ([("embedding", Embedding(model))] + [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
                + [("ln_f+head", Head(model))])
    if isinstance(model, nn.Sequential):
        return [(name, layer) for name, layer in model.named_children()]
    raise TypeError(f"cannot cut a {type(model).__name__} into layers: pass the course's MLP or Transformer, "
                    f"or an nn.Sequential whose children run one after the other.")


def _sample_input(model: nn.Module) -> torch.Tensor:
    """A batch of 8 for timing layers: token ids for the transformer and for a model whose first layer is an
    embedding, features for the MLP."""
    if isinstance(model, Transformer):
        return torch.randint(model.tok_emb.num_embeddings, (8, min(31, model.max_seq_len)))
    first = next(m for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding)))
    if isinstance(first, nn.Embedding):
        return torch.randint(first.num_embeddings, (8,))
    return torch.randn(8, first.in_features)


def layer_costs(model: nn.Module, by: str = "params", sample: torch.Tensor | None = None,
                repeats: int = 5) -> list[float]:
    """A cost per layer: its parameter count (a tied weight counts in both layers that hold it), or
    (``by="time"``) its forward + backward time on ``sample``: the least of ``repeats`` runs, on one thread as
    a rank computes, in that thread's CPU time (other processes sharing the cores do not count)."""
    named = layers(model)
    if by == "params":
        return [float(sum(p.numel() for p in layer.parameters())) for _, layer in named]
    if by != "time":
        raise ValueError(f"by={by!r}: balance stages by 'params' (parameter count) or 'time' (measured).")
    x, costs, threads = _sample_input(model) if sample is None else sample, [], torch.get_num_threads()
    torch.set_num_threads(1)  # with two, the caller's thread spun for milliseconds waiting for a descheduled one
    try:
        for _, layer in named:
            x = x.detach().requires_grad_(x.is_floating_point())
            times = []
            for _ in range(repeats):
                begin = time.thread_time()
                out = layer(x)
                out.float().sum().backward()
                times.append(time.thread_time() - begin)
            costs.append(min(times))
            x = out
    finally:
        torch.set_num_threads(threads)
    for p in model.parameters():  # timing left gradients behind
        p.grad = None
    return costs


def partition(costs: Sequence[float], n_stages: int) -> list[int]:
    """Layers per stage: contiguous, every stage non-empty, the largest stage cost as small as it can be.

    The "linear partition" problem, solved exactly by dynamic programming (a few layers: instant).

        >>> partition([1, 4, 4, 1], 2), partition([3, 1, 1, 1], 2)
        ([2, 2], [1, 3])
    """
    n = len(costs)
    if n < n_stages:
        raise ValueError(f"{n} layers cannot fill {n_stages} stages: each stage needs at least one layer.")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]  # best[k][j]: first j layers in k stages
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    sizes, j = [], n
    for k in range(n_stages, 0, -1):
        sizes.append(j - cut[k][j])
        j = cut[k][j]
    return sizes[::-1]


def split(model: nn.Module, n_stages: int, by: str = "params", layers_per_stage: Sequence[int] | None = None,
          sample: torch.Tensor | None = None) -> list[nn.Sequential]:
    """Cut ``model`` into ``n_stages`` contiguous stages (``nn.Sequential`` of its layers, sharing its parameters).

    Balanced by :func:`layer_costs` (``by="params"`` or ``"time"``), or as given by ``layers_per_stage``.
    A stage left empty, or more stages than layers, is refused with a sentence saying what to change.
    """
    named = layers(model)
    names, n = [name for name, _ in named], len(named)
    if n < n_stages:
        raise ValueError(f"{type(model).__name__} has {n} layers ({', '.join(names)}) but {n_stages} stages were "
                         f"asked for: each stage needs at least one layer. Use at most {n} ranks (stages), or a "
                         f"model with at least {n_stages} layers.")
    if layers_per_stage is None:
        layers_per_stage = partition(layer_costs(model, by, sample), n_stages)
    sizes = list(layers_per_stage)
    if len(sizes) != n_stages or sum(sizes) != n or min(sizes) < 1:
        empty = [k for k, size in enumerate(sizes) if size < 1]
        why = (f"stage {empty[0]} would be empty" if empty else
               f"{len(sizes)} counts for {n_stages} stages" if len(sizes) != n_stages else
               f"they add up to {sum(sizes)}, the model has {n} layers ({', '.join(names)})")
        raise ValueError(f"layers_per_stage={sizes}: {why}. Give each of the {n_stages} stages at least one layer, "
                         f"{n} in all, e.g. {partition([1.0] * n, n_stages)}.")
    stages, start = [], 0
    for size in sizes:
        stages.append(nn.Sequential(*(layer for _, layer in named[start:start + size])))
        start += size
    return stages


# --------------------------------------------------------------------------- the strategy
class StagedStrategy(Strategy):
    """What model and pipeline parallelism share: this rank's stages, its parameters only, named as in the model.

    Parameters of other ranks' stages are released (an empty tensor each): a rank holds ``1/G`` of the layers.
    """

    options = {"partition_by": "params", "layers_per_stage": None}
    axes = ("pp",)  # the ranks of the pipeline

    def __init__(self, setup: Setup, stages_per_rank: int = 1):
        super().__init__(setup)  # the group: the ranks of the pipeline
        self.rank, self.size = comm.get_rank(self.group), comm.get_world_size(self.group)
        self.n_stages = self.size * stages_per_rank
        sizes = self.option("layers_per_stage")
        if sizes is None and self.option("partition_by") == "time":  # measured on rank 0, the same for all
            sizes = [partition(layer_costs(self.model, "time"), self.n_stages) if self.rank == 0 else None]
            if self.size > 1:
                dist.broadcast_object_list(sizes, src=self._global(0), group=self.group)
            sizes = sizes[0]
        self.stages = split(self.model, self.n_stages, self.option("partition_by"), sizes)
        self.mine = {s: self.stages[s] for s in range(self.rank, self.n_stages, self.size)}
        names = {id(p): n for n, p in self.model.named_parameters()}
        owned = {id(p) for stage in self.mine.values() for p in stage.parameters()}
        self.own = [(names[id(p)], p) for p in self.model.parameters() if id(p) in owned]
        for p in self.model.parameters():
            if id(p) not in owned:
                p.data = torch.empty(0, dtype=p.dtype)
        self.tied = tied_parameters(self.stages)
        self.optimizer = setup.optimizer_fn([p for _, p in self.own if p.requires_grad])
        self.channel = Channel(self.group, self.tracer)

    def _global(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    @property
    def data_rank(self) -> int:
        return 0  # every stage sees the whole batch

    @property
    def data_size(self) -> int:
        return 1

    def gradients(self):
        return NamedPart({n: p.grad.detach().clone() for n, p in self.own if p.grad is not None})

    def parameters(self):
        return NamedPart({n: p.detach() for n, p in self.own})

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        held = super().held_tensors()
        held["params"] = list(self.model.parameters())  # the other ranks' are released: empty, 0 bytes
        held["grads"] = [p.grad for _, p in self.own if p.grad is not None]
        return held


@register("model")
class ModelParallel(StagedStrategy):
    """Stage ``r`` on rank ``r``; each micro-batch runs the whole chain forward, then the whole chain backward.

    Options: ``partition_by="params"`` or ``"time"``, or ``layers_per_stage=[...]`` (one count per rank).
    """

    def run_step(self, micro_batches, micro_loss):
        first, last = self.rank == 0, self.rank == self.size - 1
        stage, outputs, total = self.stages[self.rank], [], 0.0
        for i, (inputs, targets) in enumerate(micro_batches):
            key = tuple(inputs.shape)  # both neighbours know it: every rank reads the batch
            x = inputs if first else self.channel.recv(self.rank - 1, key, name=f"recv activation {i}")
            x.requires_grad_(not first)
            with self.span("forward", f"F{i}@s{self.rank}"):
                out = stage(x)
                loss = micro_loss(out, inputs, targets) if last else None
            if last:
                outputs.append(out.detach())
                total += loss.item()
                with self.span("backward", f"B{i}@s{self.rank}"):
                    loss.backward()
            else:
                with self.span("comm", f"send activation {i}"):               # a wait if gloo blocks in it
                    self.channel.isend(out.detach(), self.rank + 1, key)         # activations forward
                grad = self.channel.recv(self.rank + 1, key, like=out, name=f"recv gradient {i}")
                with self.span("backward", f"B{i}@s{self.rank}"):
                    out.backward(grad)
            if not first:
                with self.span("comm", f"send gradient {i}"):
                    self.channel.isend(x.grad, self.rank - 1)                    # gradients back
        # The end of the step waits too: for the sends, the tied gradient and the loss, which the last rank
        # broadcasts and the first joins only after its backward -- the last rank's longest wait. Traced as
        # a blocking span, so the timeline draws it (and every other wait) instead of leaving it blank.
        with self.span("comm", "end-of-step sync"):
            self.channel.wait()
            sum_tied_gradients(self.tied, owner=lambda s: s, group=self.group)
            loss = broadcast_loss(total, src=self.size - 1, group=self.group)
        return (torch.cat(outputs) if outputs else None), loss
