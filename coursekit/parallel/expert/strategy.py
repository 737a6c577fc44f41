"""``"expert"``: a mixture-of-experts model trained with its experts spread over ``ep`` ranks, and ``dp`` copies.

The mesh is ``dp × ep`` and holds the whole world. Every rank takes its own slice of the global batch (all
``dp·ep`` of them: expert parallelism splits the data too). In each MoE block a rank keeps the router whole
and ``E / ep`` experts (:class:`~coursekit.parallel.expert.core.ExpertParallelMoE`); its tokens travel to their
experts' ranks along ``ep`` and back.

After backward two kinds of parameters are averaged over two groups (Megatron-LM's and DeepSpeed's "expert data
parallel" group):

* the dense ones (embedding, norms, routers, head) are replicas on every rank: summed over the whole world;
* an expert lives on the ``dp`` ranks that share its ``ep`` coordinate; its gradient already holds every token
  of its ``ep`` group (they came to it), so it is summed over ``dp`` only.

Both are then divided by the world size: the global batch's mean loss is the mean over all ranks' slices.

Load balance, two ways: ``aux_weight`` adds the Switch Transformer's balance loss to the training loss (each
rank's on its own tokens); ``bias_rate`` nudges every router's bias after each step by the global batch's counts
of tokens per expert, summed over the world, so every rank keeps the same bias (DeepSeek-V3; torchtitan does the
same with an all-reduce of the counts).

    >>> train(rank, world_size, "expert", ep=2, model=lambda: tiny_moe(), data=LanguageData())   # doctest: +SKIP
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ... import collectives as _collectives
from ...models import loss_fn
from ...strategy import Setup, Strategy, register
from ..data import all_reduce_flat
from .core import ExpertParallelMoE, nudge_bias

__all__ = ["ExpertParallel"]


@register("expert")
class ExpertParallel(Strategy):
    """Options: ``ep`` (experts split over this many ranks; ``dp`` is the rest of the world), ``aux_weight`` (the
    balance loss's weight in the training loss) and ``bias_rate`` (the routers' bias nudge per step); 0: off."""

    options = {"ep": 1, "aux_weight": 0.0, "bias_rate": 0.0}
    axes = ("dp", "ep")

    def __init__(self, setup: Setup):
        super().__init__(setup)
        model, mesh = setup.model, setup.mesh
        if not hasattr(model, "moes"):
            raise ValueError("'expert' spreads the experts of a mixture-of-experts model: train(..., "
                             "model=lambda: tiny_moe(...), data=...) (coursekit.parallel.expert.model).")
        self.world = dist.get_world_size()
        if mesh.size("dp") * mesh.size("ep") != self.world:
            raise ValueError(f"'expert' runs on a dp × ep mesh of the whole world: dp = {mesh.size('dp')} × ep = "
                             f"{mesh.size('ep')} is not {self.world} ranks; use axes dp and ep only.")
        self.ep_axis, self.dp_axis = mesh["ep"], mesh["dp"]
        model.moes = nn.ModuleList(ExpertParallelMoE(moe, self.ep_axis.group) for moe in model.moes)
        experts = {id(p) for moe in model.moes for p in moe.experts.parameters()}
        self.expert_params = [p for p in model.parameters() if id(p) in experts]
        self.dense_params = [p for p in model.parameters() if id(p) not in experts]
        self.all_reduce = _collectives.get_collectives("ring").all_reduce

    # every rank its own slice of the batch: dp × ep slices
    @property
    def data_rank(self) -> int:
        return dist.get_rank()

    @property
    def data_size(self) -> int:
        return self.world

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_fn(output, targets) + self.option("aux_weight") * self.model.aux

    def synchronize(self) -> None:
        """Dense gradients summed over the world, experts' over ``dp``; both divided by the world size."""
        with self.span("comm", "all-reduce dense grads"):
            all_reduce_flat([p.grad for p in self.dense_params], None, self.all_reduce)
        with self.span("comm", "all-reduce expert grads over dp"):
            all_reduce_flat([p.grad for p in self.expert_params], self.dp_axis.group, self.all_reduce)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.div_(self.world)

    def step(self) -> None:
        super().step()
        if self.option("bias_rate"):
            for moe in self.model.moes:  # the global batch's counts: every rank nudges its router alike
                counts = moe.chosen_counts.clone()
                if self.world > 1:
                    dist.all_reduce(counts)
                nudge_bias(moe.router, counts, self.option("bias_rate"))

    def counters(self) -> dict:
        """``experts_here``: the experts of each MoE layer this rank holds (``E / ep``); ``compute_dtype``: the
        weights' own (this strategy does not cast)."""
        return {"experts_here": len(self.model.moes[0].experts.w1),
                "compute_dtype": str(next(self.model.parameters()).dtype).split(".")[-1]}

    def global_loss(self, local_loss: float) -> float:
        total = torch.tensor([local_loss / self.world], dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(total)
        return total.item()

    # ---------------------------------------------------------------- what the harness sees: whole experts
    def _whole(self, grads: bool) -> dict[str, torch.Tensor]:
        experts = {id(p) for p in self.expert_params}
        out = {}
        for name, p in self.model.named_parameters():
            t = p.grad if grads else p
            if t is None:
                continue
            t = t.detach()
            if id(p) in experts and self.ep_axis.size > 1:  # this rank's rows of the expert dim: gather them
                parts = [torch.empty_like(t) for _ in range(self.ep_axis.size)]
                dist.all_gather(parts, t.contiguous(), group=self.ep_axis.group)
                t = torch.cat(parts)
            out[name] = t.clone()
        return out

    def gradients(self):
        return self._whole(grads=True)

    def parameters(self):
        return self._whole(grads=False)
