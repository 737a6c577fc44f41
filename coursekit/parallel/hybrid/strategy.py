"""``"hybrid"``: pipeline × data × sequence × tensor parallelism on one mesh -- the capstone's strategy.

Each parallelism of the course is applied in turn to the course transformer, each on its own mesh axis, by the
four functions of :mod:`.apply` -- each takes the model and the mesh and returns the model -- and the pipeline
executor of chapter 04 runs whatever results:

1. ``apply_tp``: with ``tp > 1`` the model becomes its Megatron form on ``mesh["tp"]`` (chapter 05);
2. ``apply_sp``: with ``sp > 1`` every attention becomes ring attention on ``mesh["sp"]`` and each rank keeps
   its tokens (chapter 06; zig-zag layout);
3. ``apply_pp``: the layers (:func:`~coursekit.parallel.hybrid.layers.composed_layers`) are cut into
   ``pp × v`` stages, balanced by the dense model's parameter counts so every rank cuts them alike, and each
   step runs one schedule over the micro-batches on ``mesh["pp"]`` (chapters 03-04). A pipeline of one
   stage is the plain model: forward, then backward, per micro-batch;
4. ``apply_dp``: after the step's backwards, the gradients are all-reduced once over the ranks that hold a
   part of the global batch -- ``dp × sp``, flattened (chapter 02; the sequence ranks' shares add up,
   the slices average) -- and with ``zero=1`` the optimizer state is sharded over ``dp`` (ZeRO-1,
   :class:`~coursekit.parallel.data.ShardedOptimizer`).

The tied embedding's gradient is summed over the pipeline's first and last stage (chapter 03) before the
data-parallel reduce; sums commute, so the order does not matter. Each rank reports the global batch's loss.

Mixed precision (``precision="bf16"`` or ``"fp16"``) is plain data parallelism's on every layout: the step's
forwards run under ``torch.autocast`` (16-bit matmuls: tensor parallelism's all-reduces and ring attention's keys
and values travel in 16 bits; the residual stream, an fp32 embedding plus 16-bit sums, and so the pipeline's
messages stay fp32); the weights, their gradients, the reduce over ``dp × sp`` and Adam stay fp32, and the loss
is taken on fp32 logits. fp16 adds a dynamic loss scale; a step with an inf or NaN gradient on any rank is
skipped on every rank (one all-reduce of a flag over the whole world: each rank holds other gradients).

    >>> train(rank, world_size, "hybrid", model="transformer", mesh=Mesh(mesh_shape(pp=2, dp=2)),
    ...       micro_batches=2, record=False)                              # doctest: +SKIP
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ...comm.mesh import rank_size
from ...models import loss_fn
from ...strategy import Setup, Strategy, register
from ...measure.verify import NamedPart
from ..data import as_policy, autocast, loss_scaler_for, optimizer_class_and_defaults, scaler_counters
from ..pipeline import layer_costs, partition
from ..sequence import AttentionWork, ring_attention, shard_sequence
from ..tensor import dense_name, gather_dense, shard_dim, vocab_parallel_cross_entropy
from .apply import apply_dp, apply_pp, apply_sp, apply_tp
from .degrees import AXES, check_degrees, mesh_shape

__all__ = ["Hybrid"]


@register("hybrid")
class Hybrid(Strategy):
    """The course transformer on a ``pp × dp × sp × tp`` mesh (any degree may be 1).

    Options: ``schedule`` and ``stages_per_rank`` (the pipeline's), ``zero`` (0 or 1: the optimizer state
    sharded over ``dp``), ``layout`` (the sequence split), ``precision`` (None, ``"bf16"``, ``"fp16"``) with
    ``loss_scaler`` (fp16's, as for ``"naive"``), and ``pp``/``sp``/``tp`` to size the mesh when none is given
    (``dp`` is the rest of the world). The loop's ``micro_batches`` is the pipeline's m.
    """

    options = {"pp": 1, "sp": 1, "tp": 1, "zero": 0, "schedule": "1f1b", "stages_per_rank": 1, "layout": "zigzag",
               "kernel": "textbook", "collectives": "ring", "precision": None, "loss_scaler": None}
    axes = AXES

    @classmethod
    def default_mesh(cls, world_size: int, options: dict) -> dict[str, int]:
        pp, sp, tp = (options.get(a, 1) for a in ("pp", "sp", "tp"))
        inner = pp * sp * tp
        if not all(isinstance(d, int) and d >= 1 for d in (pp, sp, tp)) or world_size % inner:
            raise ValueError(f"pp × sp × tp = {pp} × {sp} × {tp} must divide the world size {world_size} "
                             f"(dp is the rest).")
        return mesh_shape(pp, world_size // inner, sp, tp)

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.mesh = setup.mesh
        dense = setup.model
        if not all(hasattr(dense, n) for n in ("tok_emb", "pos_emb", "blocks", "ln_f", "head")):
            raise ValueError("'hybrid' composes the parallelisms of the course transformer: train(..., "
                             "model='transformer') or a function returning tiny_transformer(...).")
        self.dp_axis, self.sp_axis, self.tp_axis = self.mesh["dp"], self.mesh["sp"], self.mesh["tp"]
        self.pp, self.dp, self.sp, self.tp = (self.mesh.size(a) for a in AXES)
        v, schedule = self.option("stages_per_rank"), self.option("schedule")
        shape = dict(zip(self.mesh.axes, self.mesh.shape))  # the form the capstone checked it in, before the ranks
        check_degrees(shape, dist.get_world_size(), n_heads=dense.blocks[0].attn.n_heads,
                      n_layers=len(dense.blocks), vocab_size=dense.tok_emb.num_embeddings,
                      seq_len=dense.max_seq_len, schedule=schedule, stages_per_rank=v,
                      zero=self.option("zero"))
        if self.option("zero") not in (0, 1):
            raise ValueError(f"zero={self.option('zero')}: 'hybrid' shards the optimizer state (zero=1) or nothing; "
                             f"ZeRO-2 and -3 of a whole model are the strategies 'zero2' and 'zero3'.")
        autocast(self.option("precision"), who="'hybrid'")  # refuses a 16-bit reduce before a step, by name
        self.scaler = loss_scaler_for(self.option("precision"), self.option("loss_scaler"))
        self.group = self.dp_axis.group  # the loop's data-parallel group
        self.layout, self.seq_len, self.work = self.option("layout"), 0, AttentionWork()
        sizes = partition(layer_costs(dense, "params"), self.pp * v)  # from the dense model: alike on every rank
        # The four applications (.apply), in torchtitan's order; each takes the model and the mesh.
        self.base = apply_tp(dense, self.mesh)
        model = apply_sp(self.base, self.mesh, self._ring, self.layout)
        self.pipe = apply_pp(model, self.mesh, self.setup.optimizer_fn, sizes, schedule=schedule,
                             stages_per_rank=v, tracer=self.tracer)
        zero1 = optimizer_class_and_defaults(self.setup) if self.option("zero") == 1 else None
        self.data = apply_dp(self.pipe, self.mesh, zero1, self.option("collectives"))
        self.batch_axis = self.data.batch_axis
        names = {id(p): dense_name(n) for n, p in self.base.named_parameters()}
        self.own = [(names[id(p)], p) for _, p in self.pipe.own]  # this rank's parameters, named as in the dense model
        self.optimizer = self.pipe.optimizer

    def _ring(self, q, k, v):
        """Chapter 06's ring attention over ``mesh["sp"]``, its work counted (what :func:`apply_sp` gives the blocks)."""
        self.work.count_call(q, True, self.layout, self.seq_len, self.sp_axis.group)
        return ring_attention(q, k, v, True, self.layout, self.seq_len, self.sp_axis.group, self.option("kernel"))

    # ---------------------------------------------------------------- one step
    @property
    def data_rank(self) -> int:
        return self.dp_axis.rank

    @property
    def data_size(self) -> int:
        return self.dp

    def run_step(self, micro_batches, micro_loss):
        self.seq_len = micro_batches[0][0].shape[1]  # every rank reads the batch: the ring's whole length
        with autocast(self.option("precision"), micro_batches[0][0].device.type):  # fp32 for precision=None
            return self.pipe.run_step(micro_batches, micro_loss)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """On the last stage: the vocabulary-parallel loss (tp), this rank's tokens' share (sp), or the plain one;
        always on fp32 logits. Under fp16 the gradient entering backward is multiplied by the loss scale."""
        output = output.float()
        if self.scaler is not None and output.requires_grad:
            output.register_hook(self.scaler.scale_gradient)  # backward of (loss x scale), the loss itself unscaled
        if self.tp > 1:
            return vocab_parallel_cross_entropy(output, targets, self.base.tok_emb.vocab_start, self.tp_axis.group).mean()
        if self.sp > 1:
            rank, size = rank_size(self.sp_axis.group)
            mine = shard_sequence(targets, 1, rank, size, self.layout)
            summed = F.cross_entropy(output.reshape(-1, output.shape[-1]), mine.reshape(-1), reduction="sum")
            return summed / targets.numel()  # the shares of the sp ranks add up to the micro-batch's mean
        return loss_fn(output, targets)

    def synchronize(self) -> None:
        """Chapter 02: one all-reduce of every gradient over ``dp × sp``, then divided by ``dp`` (:func:`apply_dp`)."""
        with self.span("comm", "all-reduce grads over dp×sp"):
            self.data.synchronize([p for _, p in self.own])

    def step(self) -> None:
        """Adam on this rank's parameters; under fp16, after unscaling, and on no rank if any gradient overflowed."""
        grads = [p.grad for _, p in self.own]
        if self.scaler is None or self.scaler.unscale_and_update(grads, group=None):  # group None: the whole world
            super().step()

    def global_loss(self, local_loss: float) -> float:
        """Σ over ``dp × sp`` of this rank's loss / dp: the sp shares add up, the dp slices average."""
        total = torch.tensor([local_loss / self.dp], dtype=torch.float64)
        if self.batch_axis.size > 1:
            dist.all_reduce(total, group=self.batch_axis.group)
        return total.item()

    # ---------------------------------------------------------------- what the harness and checkpoints see
    def recorded_output(self, outputs):
        return None  # the record compares gradients and parameters; the logits stay where they are

    def _named(self, grads: bool) -> NamedPart:
        """This rank's stages' tensors, named as in the dense model; tp shards gathered (collective over tp)."""
        if self.tp == 1:
            return NamedPart({n: (p.grad if grads else p).detach().clone() for n, p in self.own
                              if not grads or p.grad is not None})
        out = {}
        for stage in self.pipe.mine.values():
            ids = {dense_name(n): id(p) for n, p in stage.named_parameters()}
            whole = {id(p): n for n, p in self.own}
            for name, tensor in gather_dense(stage, grads=grads, group=self.tp_axis.group).items():
                out[whole[ids[name]]] = tensor
        return NamedPart(out)

    def named_shards(self) -> list[tuple[str, nn.Parameter, int | None]]:
        """``(dense name, parameter, dim split over tp or None)`` for this rank's parameters (what a checkpoint saves).

        Each parameter is whole over ``dp`` and ``sp`` (replicas); over ``tp`` it is this rank's contiguous
        ``1/tp`` along that dim (the course splits heads, MLP features and vocabulary rows evenly).
        """
        where = {id(p): (module, name) for module in self.base.modules() for name, p in module.named_parameters(recurse=False)}
        return [(name, p, shard_dim(*where[id(p)]) if self.tp > 1 else None) for name, p in self.own]

    def gradients(self):
        return self._named(grads=True)

    def parameters(self):
        return self._named(grads=False)

    def held_tensors(self):
        return self.pipe.held_tensors()

    def counters(self) -> dict:
        moved = self.record.collective_counts("collectives")  # the gradients' all-reduce over dp × sp
        compute = as_policy(self.option("precision")).compute_dtype(torch.float32)  # what the forwards ran in
        return {**self.pipe.counters(), **scaler_counters(self.scaler), "compute_dtype": str(compute).split(".")[-1],
                "elements_reduced": moved.total("all_reduce"),
                "attention_score_elements": self.work.score_elements}
