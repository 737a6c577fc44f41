"""The course transformer built from the tensor-parallel layers of :mod:`~coursekit.parallel.tensor.core`, and the
``"tensor"`` and ``"dp_tp"`` strategies that train it (seed claims P5, P8).

:func:`parallelize_transformer` turns the dense ``tiny_transformer`` into its tensor-parallel form from the
dense weights (every rank passes the same dense model); :func:`gather_dense` reassembles the dense tensors
from the shards (for checking and checkpoints). Per transformer layer, forward issues 2 all-reduces of
``b·s·h`` elements (attention's and the MLP's **g**) and backward 2 (their **f**); the embedding adds one
forward (its **g**), the tied head one backward (its **f**), and the vocabulary-parallel loss 3 of ``b·s``
forward (:func:`expected_counts` is that formula; :func:`count_communication` counts what a run issued).

    >>> def run(rank, world_size):
    ...     tp = parallelize_transformer(tiny_transformer(seed=0), tp_axis=None)   # the whole world
    ...     return tp.loss(x, y)                                                 # doctest: +SKIP

Strategies for :func:`coursekit.train.train`:

* ``"tensor"``: tensor parallelism along the mesh's ``tp`` axis (``train(..., mesh=mesh)``; no mesh: every
  rank); every rank of the group takes the whole batch.
* ``"dp_tp"``: the data × tensor hybrid on a mesh with axes ``dp`` and ``tp`` (``mesh=``; none given:
  ``train`` builds ``Mesh({"dp": world // tp, "tp": tp})`` from the option ``tp``, default 2). Each
  data-parallel slice of the batch goes to one tensor group; gradients are averaged over the ``dp`` axis only.

Both hand the loop this rank's vocabulary shard of the logits and their own loss (:meth:`Strategy.loss
<coursekit.strategy.Strategy.loss>`): the vocabulary-parallel cross-entropy, so training never gathers the
logits (``b·s·V`` numbers; at a real vocabulary of 50k-250k the largest tensor of the step). Only the record
the equivalence harness compares (``train(..., record=True)``) all-gathers them, after the step, uncounted.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ... import collectives as _collectives
from ... import comm
from ...comm.mesh import as_group, rank_size
from ...strategy import Setup, Strategy, register
from ...comm.traffic import Collective, CollectiveCounts
from ..data import average_gradients
from ...models import Block, Transformer
from ..plan import parallelize_module
from .core import ShardedLinear, VocabParallelEmbedding, gather_from_parallel_region, vocab_parallel_cross_entropy
from .plan import BLOCK_PLAN, TRANSFORMER_PLAN

__all__ = ["parallelize_block", "ParallelBlock", "TensorParallelTransformer", "parallelize_transformer", "gather_dense", "dense_name",
           "shard_dim", "count_communication", "expected_counts", "TensorParallel", "DataTensorParallel"]


@contextmanager
def count_communication() -> Iterator[CollectiveCounts]:
    """Count the collectives issued inside the block, forward and backward, by ``(op, direction)``: a view of
    the one record ``comm`` keeps (:func:`coursekit.comm.record`).

        >>> with count_communication() as counts:             # doctest: +SKIP
        ...     model.loss(x, y).backward()
        >>> counts.calls["all_reduce", "backward"], counts.elements["all_reduce", "forward"]   # doctest: +SKIP
        (5, 40052)
    """
    with comm.record() as traffic:
        yield traffic.collective_counts()


def parallelize_block(dense: Block, group=None, plan: dict | None = None) -> Block:
    """This rank's tensor-parallel shard of one course block: a copy of ``dense`` with :data:`BLOCK_PLAN` applied
    (heads and MLP split over ``group``; the norms whole on every rank), or ``plan``. Its forward is the dense
    block's."""
    return parallelize_module(_copy(dense), BLOCK_PLAN if plan is None else plan, as_group(group))


ParallelBlock = parallelize_block  # the name chapters 05 and 06 call it by


def _copy(module: nn.Module) -> nn.Module:
    """A copy of the dense module to split in place, without the dense gradients (the shards start with none)."""
    module = copy.deepcopy(module)
    for param in module.parameters():
        param.grad = None
    return module


class TensorParallelTransformer(Transformer):
    """The course transformer after :data:`TRANSFORMER_PLAN`: the same forward, returning this rank's logits
    ``(b, s, V/t)``; :meth:`loss` is the vocabulary-parallel mean cross-entropy, :meth:`full_logits` all-gathers.

    Not built directly: :func:`parallelize_transformer` gives a split copy of the dense model this class (as
    ``torch.distributed.fsdp.fully_shard`` gives a module its FSDP class), for these two methods.
    """

    group: object
    vocab_size: int

    def full_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """The whole ``(b, s, V)`` logits on every rank (one all-gather; backward keeps this rank's slice)."""
        return gather_from_parallel_region(self(idx), -1, self.group, self.vocab_size)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy, equal to ``loss_fn(dense(idx), targets)``, without gathering the logits."""
        return vocab_parallel_cross_entropy(self(idx), targets, self.tok_emb.vocab_start, self.group).mean()


def parallelize_transformer(dense: Transformer, tp_axis=None, plan: dict | None = None) -> TensorParallelTransformer:
    """This rank's tensor-parallel shard of the course transformer ``dense`` (same weights on every rank):
    a copy with :data:`TRANSFORMER_PLAN` (or ``plan``) applied; ``dense`` itself is left as it was.

    ``tp_axis``: the tensor-parallel group (None: every rank), a process group or ``mesh["tp"]``.
    Raises ``ValueError`` when the degree exceeds the heads, the vocabulary or the MLP width.
    """
    if not isinstance(dense, Transformer):
        raise ValueError(f"parallelize_transformer splits the course transformer (coursekit.models.Transformer, "
                         f"as tiny_transformer(...) builds it), not a {type(dense).__name__}.")
    if dense.head.weight is not dense.tok_emb.weight:
        raise ValueError("parallelize_transformer supports the tied head of the course transformer "
                         "(tie_weights=True): the vocabulary-parallel head reuses the embedding's rows.")
    group = as_group(tp_axis)
    model = parallelize_module(_copy(dense), TRANSFORMER_PLAN if plan is None else plan, group)
    model.__class__ = TensorParallelTransformer
    model.group, model.vocab_size = group, dense.tok_emb.num_embeddings
    return model


def dense_name(name: str) -> str:
    """The dense model's name of a tensor-parallel parameter: the same name (a block that keeps its MLP under
    ``mlp.``, as Megatron's does, loses the prefix)."""
    return name.replace(".mlp.", ".")


def shard_dim(module: nn.Module, param_name: str) -> int | None:
    """Along which dim a parameter is split, or None when every rank holds it whole."""
    if isinstance(module, VocabParallelEmbedding):
        return 0
    if isinstance(module, ShardedLinear) and (param_name == "weight" or module.shard_dim == 0):
        return module.shard_dim
    return None


def gather_dense(model: nn.Module, grads: bool = False, group=None) -> dict[str, torch.Tensor]:
    """The dense model's tensors, named as in ``tiny_transformer``: parameters (or, with ``grads``, gradients).

    Each split tensor is all-gathered over the model's group and every rank's
    rows (or columns) put back where they came from -- for q, k and v by heads.
    Works on any module made of this chapter's layers (``group``: default, the group its layers were built
    with). Collective: call it on every rank of the group. Not counted.
    """
    if group is None:
        group = next((m.group for m in model.modules() if isinstance(m, (ShardedLinear, VocabParallelEmbedding))),
                     None)
    group = as_group(group)
    rank, size = rank_size(group)
    out = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            tensor = param.grad if grads else param.detach()
            if tensor is None:
                continue
            full_name = dense_name(f"{module_name}.{name}" if module_name else name)
            dim = shard_dim(module, name)
            if dim is None or size == 1:
                out[full_name] = tensor.clone()
                continue
            indices = _everyones_index(module, group, size)
            widest = max(len(i) for i in indices)
            padded = F.pad(tensor, [0, 0] * (tensor.dim() - 1 - dim) + [0, widest - tensor.shape[dim]]).contiguous()
            pieces = [torch.empty_like(padded) for _ in range(size)]
            dist.all_gather(pieces, padded, group=group)
            full_shape = list(tensor.shape)
            full_shape[dim] = sum(len(i) for i in indices)
            full = tensor.new_empty(full_shape)
            for where, piece in zip(indices, pieces):
                full.index_copy_(dim, where, piece.narrow(dim, 0, len(where)))
            out[full_name] = full
    return out


def _everyones_index(module: nn.Module, group, size: int) -> list[torch.Tensor]:
    """Which dense rows (or columns) every rank of ``group`` holds for ``module``; exchanged once, then cached."""
    if getattr(module, "_everyones_index", None) is None:
        index = module.index
        lengths = [torch.zeros(1, dtype=torch.long) for _ in range(size)]
        dist.all_gather(lengths, torch.tensor([len(index)]), group=group)
        widest = max(int(n) for n in lengths)
        gathered = [torch.empty(widest, dtype=index.dtype) for _ in range(size)]
        dist.all_gather(gathered, torch.cat([index, index.new_zeros(widest - len(index))]), group=group)
        module._everyones_index = [g[:int(n)] for g, n in zip(gathered, lengths)]
    return module._everyones_index


def expected_counts(batch: int, seq: int, d_model: int, n_layers: int, degree: int,
                    vocab: int | None = None, gathered_logits: bool = False) -> CollectiveCounts:
    """The formula: the collectives one forward and backward of the course transformer issue at ``degree``.

    Per layer 2 all-reduces of ``b·s·h`` forward and 2 backward; the embedding
    one forward, the head one backward; then either the vocabulary-parallel
    loss's 3 of ``b·s`` forward (what the strategies ``"tensor"`` and ``"dp_tp"``
    issue in training), or (``gathered_logits``) one all-gather of ``b·s·V``
    (what a loss on whole logits would cost instead).
    """
    if degree == 1:
        return CollectiveCounts([])
    bsh, bs = batch * seq * d_model, batch * seq
    layers = [Collective("all_reduce", direction, bsh, 4) for _ in range(2 * n_layers + 1)
              for direction in ("forward", "backward")]
    loss = ([Collective("all_gather", "forward", bs * vocab, 4)] if gathered_logits else
            [Collective("all_reduce", "forward", bs, 4)] * 3)
    return CollectiveCounts(layers + loss)


# --------------------------------------------------------------------------
# Strategies for coursekit.train.train.
# --------------------------------------------------------------------------
@register("tensor")
class TensorParallel(Strategy):
    """Megatron tensor parallelism along the mesh's ``tp`` axis (every rank of it sees the whole batch)."""

    options = {}
    axes = ("tp",)

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.tp_group, self.dp_axis = self._axes(setup)
        self.group = self.dp_axis.group if self.dp_axis is not None else None  # the loop's data-parallel group
        self.model = self.parallelize(_check_model(setup.model))

    def parallelize(self, model: nn.Module) -> nn.Module:
        """This rank's shard of the course transformer (a subclass may apply another plan)."""
        return parallelize_transformer(model, self.tp_group)

    def _axes(self, setup: Setup):
        """The tensor-parallel group and the data-parallel axis (None: no data parallelism)."""
        return setup.group("tp"), None

    @property
    def data_rank(self) -> int:
        return 0 if self.dp_axis is None else self.dp_axis.rank

    @property
    def data_size(self) -> int:
        return 1 if self.dp_axis is None else self.dp_axis.size

    @contextmanager
    def micro_batch_context(self, last: bool):
        """Traced, each collective of the micro-batch's forward and backward is a span (the loop records them)."""
        first = len(self.record.collectives)
        yield
        if self.tracer is not None:
            self.tracer.collectives(self.record.collectives[first:])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs)  # this rank's logits, (b, s, V/t)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The vocabulary-parallel mean cross-entropy from this rank's logits: 3 all-reduces of ``b·s``."""
        return vocab_parallel_cross_entropy(output, targets, self.model.tok_emb.vocab_start, self.tp_group).mean()

    def recorded_output(self, outputs):
        """The whole logits for the record only: all-gathered after the step, not counted."""
        with torch.no_grad():
            return torch.cat([gather_from_parallel_region(out, -1, self.tp_group, self.model.vocab_size)
                              for out in outputs])

    def gradients(self):
        return gather_dense(self.model, grads=True)

    def parameters(self):
        return gather_dense(self.model)

    def counters(self) -> dict:
        counts = self.record.collective_counts()
        return {**counts.as_dict(), "tp_comm_seconds": counts.seconds}


@register("dp_tp")
class DataTensorParallel(TensorParallel):
    """Data × tensor parallelism on a 2-D mesh: tensor groups inside, gradients averaged over ``dp`` only."""

    options = {"tp": 2, "collectives": "ring"}
    axes = ("dp", "tp")  # no mesh given: Mesh({"dp": world // tp, "tp": tp}), from the option tp

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.all_reduce = _collectives.get_collectives(self.option("collectives")).all_reduce

    def _axes(self, setup: Setup):
        return setup.group("tp"), setup.axis("dp")

    def synchronize(self) -> None:
        with self.span("comm", "all-reduce grads over dp"):
            average_gradients(self.model, group=self.dp_axis, all_reduce=self.all_reduce)

    def counters(self) -> dict:
        dp = self.record.collective_counts("collectives")  # the gradients' all-reduces over dp
        return {**super().counters(), "elements_reduced": dp.total("all_reduce"), "dp_comm_seconds": dp.seconds}


def _check_model(model: nn.Module) -> nn.Module:
    if not all(hasattr(model, name) for name in ("tok_emb", "pos_emb", "blocks", "ln_f", "head")):
        raise ValueError("the tensor-parallel strategies parallelize the course transformer: train(..., "
                         "model='transformer') or a function returning tiny_transformer(...).")
    return model

