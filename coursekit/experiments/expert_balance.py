"""Load balance, measured (chapter 07): how evenly a router spreads tokens, with and without a balancing force.

The data are drawn as words are, by Zipf's law: a few kinds of token are most of the text (the i-th most
frequent kind ``∝ 1 / i``), so a router that sends each kind to "its" expert loads some experts far more than
others. Each token is a vector near its kind's centre; its target is a fixed random MLP's output (the teacher).
The model (:class:`MoERegressor`) is two MoE blocks ``x + moe(norm(x))``: a token a full expert drops skips
the block, so dropping costs accuracy. It runs on one process; its routing equals expert parallelism's (the
chapter shows that equality on real ranks).

* :func:`train_moe` -- Adam on the task, with no balancing, the Switch balance loss (``aux_weight``) or the
  bias nudge (``bias_rate``), and optionally a capacity factor. Returns the imbalance over the steps (the busiest
  expert's tokens over the mean, on a fixed evaluation batch), the share of assignments dropped, the loss.
* :func:`tokens_per_expert` -- each block's count of assignments per expert on the evaluation batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..parallel.expert.core import MoE, keep_within_capacity, nudge_bias

__all__ = ["ZipfTeacher", "MoERegressor", "BalanceRun", "train_moe", "tokens_per_expert", "imbalance"]


class ZipfTeacher:
    """Vectors near ``kinds`` centres, the i-th centre drawn with weight ``1 / i`` (Zipf's law); each vector's
    target is a fixed random MLP's output (the *teacher*: 32 -> 256 -> 32)."""

    def __init__(self, kinds: int = 256, d_model: int = 32, seed: int = 0):
        g = self.generator = torch.Generator().manual_seed(1000 + seed)
        self.weights = 1.0 / torch.arange(1, kinds + 1, dtype=torch.float64)
        self.centres = torch.randn(kinds, d_model, generator=g)
        self.w1 = torch.randn(d_model, 256, generator=g) / d_model ** 0.5
        self.w2 = torch.randn(256, d_model, generator=g) / 256 ** 0.5
        self.eval = self.sample(4096)                       # the evaluation batch: the same for every run of a seed

    def sample(self, n: int) -> torch.Tensor:
        kind = torch.multinomial(self.weights, n, replacement=True, generator=self.generator)
        return self.centres[kind] + 0.3 * torch.randn(n, self.centres.shape[1], generator=self.generator)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x @ self.w1) @ self.w2


def imbalance(counts: torch.Tensor) -> float:
    """The busiest expert's assignments over the mean: 1 when even, ``E`` when one expert takes all."""
    counts = counts.float()
    return (counts.max() / counts.mean()).item()


class MoERegressor(nn.Module):
    """``blocks`` MoE blocks ``x + moe(norm(x))`` on ``d_model``-wide vectors; :attr:`aux` sums their balance losses."""

    def __init__(self, d_model: int = 32, d_ff: int = 64, n_experts: int = 8, k: int = 1, blocks: int = 2,
                 capacity_factor: float | None = None, seed: int = 0):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(blocks))
        self.moes = nn.ModuleList(MoE(d_model, d_ff, n_experts, k, capacity_factor, seed=seed + 1 + i)
                                  for i in range(blocks))
        self.aux = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.aux = x.new_zeros(())
        for norm, moe in zip(self.norms, self.moes):
            out, aux = moe(norm(x))
            x, self.aux = x + out, self.aux + aux
        return x


@torch.no_grad()
def _routed(model: MoERegressor, x: torch.Tensor):
    """Each block's choices ``(T, k)`` and which of them its capacity keeps, on ``x``."""
    out = []
    for norm, moe in zip(model.norms, model.moes):
        _, chosen, _ = moe.router(norm(x))
        out.append((chosen, keep_within_capacity(chosen, moe.n_experts, moe.capacity_factor)))
        x = x + moe(norm(x))[0]
    return out


def tokens_per_expert(model: MoERegressor, x: torch.Tensor) -> list[torch.Tensor]:
    """Each block's count of assignments per expert (before capacity) on ``x``."""
    return [torch.bincount(chosen.flatten(), minlength=moe.n_experts)
            for (chosen, _), moe in zip(_routed(model, x), model.moes)]


def dropped_share(model: MoERegressor, x: torch.Tensor) -> float:
    """The share of the assignments on ``x`` that the blocks' capacity drops."""
    keeps = [keep for _, keep in _routed(model, x)]
    return 1 - sum(k.sum().item() for k in keeps) / sum(k.numel() for k in keeps)


@dataclass
class BalanceRun:
    steps: list[int] = field(default_factory=list)          # the steps at which the evaluation batch was routed
    imbalance: list[float] = field(default_factory=list)    # ... the most imbalanced block's imbalance then
    loss: list[float] = field(default_factory=list)         # training loss, each step
    counts: list[torch.Tensor] = field(default_factory=list)  # per block, on the evaluation batch, after training
    dropped: float = 0.0                                    # the share of assignments dropped, after training
    eval_loss: float = 0.0                                  # the loss on the evaluation batch, after training


def train_moe(seed: int = 0, steps: int = 300, aux_weight: float = 0.0, bias_rate: float = 0.0,
              capacity_factor: float | None = None, batch: int = 256, n_experts: int = 8, k: int = 1,
              lr: float = 1e-2, record_every: int = 10) -> BalanceRun:
    """Train :class:`MoERegressor` on :class:`ZipfTeacher` for ``steps`` Adam steps; see the module's docstring."""
    data = ZipfTeacher(seed=seed)
    model = MoERegressor(n_experts=n_experts, k=k, capacity_factor=capacity_factor, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    run = BalanceRun()
    for step in range(steps + 1):
        if step % record_every == 0 or step == steps:
            run.steps.append(step)
            run.imbalance.append(max(imbalance(c) for c in tokens_per_expert(model, data.eval)))
        if step == steps:
            break
        x = data.sample(batch)
        loss = F.mse_loss(model(x), data.target(x))
        optimizer.zero_grad()
        (loss + aux_weight * model.aux).backward()
        optimizer.step()
        if bias_rate:                                        # this step's counts, block by block
            for moe, counts in zip(model.moes, tokens_per_expert(model, x)):
                nudge_bias(moe.router, counts, bias_rate)
        run.loss.append(loss.item())
    run.counts = tokens_per_expert(model, data.eval)
    run.dropped = dropped_share(model, data.eval)
    with torch.no_grad():
        run.eval_loss = F.mse_loss(model(data.eval), data.target(data.eval)).item()
    return run
