"""The slowest expert sets the pace: an expert-parallel layer's step time against its routing's imbalance.

Two ranks, each holding half the experts and ``tokens`` tokens of its own. A :class:`FixedRouter` decides where
the tokens go: a share ``s`` of every rank's tokens to the experts of rank 0, the rest to rank 1's. Rank 0 then
computes ``2·s·tokens`` rows and rank 1 ``2·(1 − s)·tokens``; the *imbalance* is the busier rank's rows over the
mean, ``2·max(s, 1 − s)``: 1 when the load is even, 2 when one rank does all of it. A step waits for its
slowest rank (combine needs every rank's outputs), so if computing dominates, the step time grows as the
imbalance does. The experts are wide (``d_model`` 512, ``d_ff`` 2,048 by default) so that it does.

:func:`imbalance_times` times forward and backward of one :class:`ExpertParallelMoE` for every share in each
iteration, back to back, so that each iteration's ratios to the even load are paired, and the part of an
even step its experts take, timed alone at an even load and at twice it: :func:`predicted_ratio` adds the
experts' extra time for the busiest rank's extra rows.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..parallel.expert.core import ExpertParallelMoE, MoE

__all__ = ["FixedRouter", "routed_share", "imbalance_times", "predicted_ratio", "median_ratios"]


class FixedRouter(nn.Module):
    """A router that ignores its input: token ``t`` goes to expert ``chosen[t]`` with gate 1."""

    def __init__(self, chosen: torch.Tensor, n_experts: int):
        super().__init__()
        self.chosen, self.n_experts, self.k = chosen.view(-1, 1), n_experts, 1

    def forward(self, x: torch.Tensor):
        probs = F.one_hot(self.chosen[:, 0], self.n_experts).to(x.dtype)
        return probs, self.chosen, torch.ones_like(self.chosen, dtype=x.dtype)


def routed_share(tokens: int, share: float, n_experts: int, ep: int = 2) -> torch.Tensor:
    """Each token's expert: the first ``round(share · tokens)`` to rank 0's experts, the rest to the other ranks',
    spread over each rank's experts in turn."""
    local = n_experts // ep
    to_first = round(share * tokens)
    first = torch.arange(to_first) % local
    rest = local + torch.arange(tokens - to_first) % (n_experts - local)
    return torch.cat([first, rest])


def imbalance_times(rank: int, world_size: int, shares: list[float], tokens: int = 512, d_model: int = 512,
                    d_ff: int = 2048, n_experts: int = 4, iterations: int = 7) -> dict[str, list[float]]:
    """Seconds of forward + backward at each share, per iteration (one core per rank); and this rank's experts
    timed alone, forward + backward, on an even load's rows (``"experts"``) and on twice as many
    (``"experts ×2"``). Run under ``launch``."""
    torch.set_num_threads(1)
    moe = MoE(d_model, d_ff, n_experts, k=1)
    layers = {}
    for share in shares:
        layer = ExpertParallelMoE(moe, group=None)
        layer.router = FixedRouter(routed_share(tokens, share, n_experts, world_size), n_experts)
        layers[share] = layer
    x = torch.randn(tokens, d_model, generator=torch.Generator().manual_seed(rank), requires_grad=True)
    loads = {"experts": tokens, "experts ×2": 2 * tokens}      # an even load: `tokens` rows per rank
    rows = {name: torch.randn(n, d_model, requires_grad=True) for name, n in loads.items()}
    times: dict = {share: [] for share in shares} | {name: [] for name in loads}
    # Gradients accumulate from one step to the next: setting them to None would free and allocate tens of
    # megabytes a step, and time the allocator rather than the experts.
    for iteration in range(iterations + 1):                 # the first is a warm-up
        for share, layer in layers.items():
            dist.barrier()
            begin = time.perf_counter()
            out, _ = layer(x)
            out.square().mean().backward()
            dist.barrier()                                  # the step ends when the slowest rank does
            if iteration:
                times[share].append(time.perf_counter() - begin)
        for name, n in loads.items():
            begin = time.perf_counter()
            layers[shares[0]].experts(rows[name], [n // 2, n - n // 2]).square().mean().backward()
            if iteration:
                times[name].append(time.perf_counter() - begin)
    return times


def predicted_ratio(times: dict, imbalance: float) -> float:
    """What the busiest rank's load predicts for the step time, over the even step's: the even step plus the
    experts' extra time for ``imbalance`` times the even rows (measured alone: the time that grows with the
    rows, ``experts ×2 − experts`` per extra even load; the experts' weight gradients cost the same at any load)."""
    even = statistics.median(times[next(iter(times))])
    per_load = statistics.median(times["experts ×2"]) - statistics.median(times["experts"])
    return 1 + per_load / even * (imbalance - 1)


def median_ratios(times: dict[float, list[float]]) -> dict[float, tuple[float, float, float]]:
    """Per share: the median, lowest and highest of the per-iteration ratio to the first share's time."""
    base = times[next(iter(times))]
    out = {}
    for share, values in times.items():
        if not isinstance(share, float):      # the experts timed alone
            continue
        ratios = sorted(a / b for a, b in zip(values, base))
        out[share] = statistics.median(ratios), ratios[0], ratios[-1]
    return out
