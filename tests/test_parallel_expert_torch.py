"""torchtitan 0.3.0's dropless MoE with expert parallelism, run for real and held to coursekit's layer.

On ep = 2 and 4 gloo ranks, E = 4 and 8 experts, k = 1 and 2, uneven token counts (5, 8, 6, 11 per rank) and two
skewed cases (every token to expert 0: the other ranks receive nothing, their experts get no rows and a zero
gradient, rank 0's grouped matmul has empty groups): torchtitan's output and gradients (tokens, router, each
rank's experts) equal coursekit's :class:`ExpertParallelMoE` rank by rank and the one-process :class:`MoE`, on
the same weights, tokens and output gradient.

Needs torchtitan, which CI installs into a folder of its own (its ~60 training dependencies are not needed)::

    pip install --no-deps --target DIR torchtitan==0.3.0 spmd_types==0.2.3
    COURSEKIT_TORCHTITAN_PATH=DIR pytest tests/test_parallel_expert_torch.py

``COURSEKIT_TORCHTITAN_PATH`` is put first on ``sys.path`` (the ranks fork and inherit it); without it the tests
import torchtitan from wherever it is installed, and skip if it is nowhere.

Tolerances, derived (u: unit roundoff; ``max|ref|`` stands in for a sum's Σ|terms|, which random data make
comparable):

* fp32 (our GELU MLP through torchtitan's grouped matmul): both sides do the same fp32 operations on the same
  inputs; only the order of additions may differ (blocked matmul against grouped matmul, ``index_add`` against
  ``scatter_add``, the router gradient summed over ranks). A sum of n terms in any order errs by at most
  ``(n-1)·u·Σ|terms|`` (Higham, *Accuracy and Stability*, §4.2), so two orders differ by at most twice that,
  and along a chain of sums the bounds add: ``|diff| ≤ 2·n·u·max|ref|``, u = 2⁻²⁴, n the terms summed along
  the longest chain: forward d + d_ff + k, backward d_ff + d + E (softmax) + the rows summed into a weight
  gradient (≤ k·ΣT) + ep. (Seen: at most 2% of that; bit for bit in 6 of the 8 fp32 cases.)
* bf16 (torchtitan's stock SwiGLU experts, against a SwiGLU variant of ours in fp32): bf16 keeps 8 significant
  bits, u = 2⁻⁸; every rounding to bf16 on an element's path adds at most u of relative error (first order; the
  matmuls accumulate in fp32 and silu computes in fp32 before its one rounding, errors 2¹⁶ times smaller).
  Forward: the casts of x, w1, w3, w2, the outputs a = x·w1 and b = x·w3, silu(a), h = silu(a)·b and
  y = h·w2: 9. Backward, on its longest path (into x, w1 or w3): the output gradient's cast, grad h = grad y·w2,
  grad silu = grad h·b, grad a = silu's backward, and the matmul into x, w1 or w3: 5 more (grad w2 and the
  gates' gradients take fewer). ``|diff| ≤ 14·u·max|ref|``. (Seen: at most a quarter of that.)

Planted bugs, each seen failing here, then restored:

* experts 0 and 1 swapped in the weight mapping -> 10 of 10 cases, e.g. "ep=2 E=4 k=1: output of rank 0 differs
  from coursekit's expert-parallel layer: max |diff| 0.892 > tolerance 1.63e-05 (max |ref| 1.18)"; the weakest,
  "ep=2 E=8 k=1 swiglu-bf16: ... max |diff| 0.239 > tolerance 0.0458";
* the weights viewed, not transposed, into torchtitan's layout -> 10 of 10 cases, the same message;
* the gates renormalised over the top k (``route_norm=True``: for k = 1 every gate 1, as if dropped) -> 10 of
  10 cases, the same message (k = 2: "max |diff| 0.442 > tolerance 1.61e-05");
* the router's bias not copied -> the two skewed cases only: "ep=2 E=4 k=1 skewed: output of rank 0 differs";
* GELU's backward replaced by the identity (forward unchanged) -> the 8 fp32 cases: "ep=2 E=4 k=1: input
  gradient of rank 0 differs from coursekit's expert-parallel layer: max |diff| 0.902 > tolerance 1.76e-05";
* the router gradient taken from rank 0 alone, not summed -> "ep=2 E=4 k=1: the router gradient summed over
  ranks differs from the one-process layer's: max |diff| 2.83 > tolerance 6.88e-05";
* the install command misspelt -> test_without_torchtitan_the_error_names_the_install.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coursekit
from coursekit.parallel.expert import ExpertParallelMoE, Experts, MoE

TITAN_PATH = os.environ.get("COURSEKIT_TORCHTITAN_PATH")
if TITAN_PATH and TITAN_PATH not in sys.path:
    sys.path.insert(0, TITAN_PATH)

D, FF = 16, 32
SIZES = [5, 8, 6, 11]                                   # tokens per rank: uneven
TIMEOUT = 300
U_FP32, U_BF16 = 2.0 ** -24, 2.0 ** -8
BF16_ROUNDINGS = 9 + 5                                  # forward + backward, see the module's docstring
# (ep, E, k, skewed, swiglu): skewed puts every first choice on expert 0 (rank 0's); swiglu runs their stock bf16
CASES = [(2, 4, 1, False, False), (2, 4, 2, False, False), (2, 8, 1, False, False), (2, 8, 2, False, False),
         (2, 4, 1, True, False), (2, 4, 2, False, True), (2, 8, 1, False, True),
         (4, 4, 1, False, False), (4, 8, 2, False, False), (4, 8, 1, True, False)]


def _name(ep, n_experts, k, skewed, swiglu):
    return f"ep={ep} E={n_experts} k={k}{' skewed' if skewed else ''}{' swiglu-bf16' if swiglu else ''}"


class SwiGLUExperts(Experts):
    """Our experts with torchtitan's MLP, ``(silu(x w1) * (x w3)) w2``, in fp32: the reference for its stock one."""

    def __init__(self, w1, w2, w3, first=0):
        super().__init__(w1, w2, first)
        self.w3 = nn.Parameter(w3)

    def part(self, first, count):
        rows = slice(first, first + count)
        return SwiGLUExperts(*(w.detach()[rows].clone() for w in (self.w1, self.w2, self.w3)), self.first + first)

    def forward(self, x, rows_per_expert):
        return torch.cat([(F.silu(p @ self.w1[e]) * (p @ self.w3[e])) @ self.w2[e]
                          for e, p in enumerate(x.split(rows_per_expert))])


def _moe(n_experts, k, skewed, swiglu):
    moe = MoE(D, FF, n_experts, k=k, seed=7)
    moe.router.bias[0] = 10.0 if skewed else 0.0
    if swiglu:
        w3 = torch.randn(n_experts, D, FF, generator=torch.Generator().manual_seed(8)) / D ** 0.5
        moe.experts = SwiGLUExperts(moe.experts.w1.detach(), moe.experts.w2.detach(), w3)
    return moe


def _data(rank, n_tokens):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n_tokens, D, generator=g), torch.randn(n_tokens, D, generator=g)   # tokens, output grad


def _both_ways(rank, world_size, cases):
    """On every rank, for each case: coursekit's expert-parallel layer and torchtitan's, same weights and tokens."""
    from coursekit.parallel.expert.torch import torchtitan_moe, torchtitan_step

    results = {}
    for case in cases:
        _, n_experts, k, skewed, swiglu = case
        moe = _moe(n_experts, k, skewed, swiglu)
        x, grad_out = _data(rank, SIZES[rank])
        ours = ExpertParallelMoE(moe)
        xo = x.clone().requires_grad_()
        out, _ = ours(xo)
        out.backward(grad_out)                          # the output's gradient alone: torchtitan has no aux loss
        experts = {w: getattr(ours.experts, w).grad for w in ("w1", "w2", "w3") if hasattr(ours.experts, w)}
        theirs_out, theirs = torchtitan_step(torchtitan_moe(moe, w3=getattr(moe.experts, "w3", None)), x, grad_out)
        results[case] = {"ours": {"out": out.detach(), "x": xo.grad, "router": ours.router.score.weight.grad,
                                  **experts},
                         "theirs": {"out": theirs_out, **theirs}}
    return results


def _one_process(case):
    """The one-process layer on every rank's tokens: outputs and input gradients per rank, weight gradients."""
    ep, n_experts, k, skewed, swiglu = case
    moe = _moe(n_experts, k, skewed, swiglu)
    per_rank = []
    for rank in range(ep):
        x, grad_out = _data(rank, SIZES[rank])
        x.requires_grad_()
        out, _ = moe(x)
        out.backward(grad_out)
        per_rank.append({"out": out.detach(), "x": x.grad})
    weights = {"router": moe.router.score.weight.grad, "w1": moe.experts.w1.grad, "w2": moe.experts.w2.grad}
    if swiglu:
        weights["w3"] = moe.experts.w3.grad
    return per_rank, weights


def _tolerance(case, ref):
    ep, n_experts, k, _, swiglu = case
    if swiglu:
        return BF16_ROUNDINGS * U_BF16 * ref.abs().max().item()
    n = (D + FF + k) + (FF + D + n_experts + k * sum(SIZES[:ep]) + ep)
    return 2 * n * U_FP32 * ref.abs().max().item()


def _check(case, got, want, what):
    tol = _tolerance(case, want)
    diff = (got - want).abs().max().item()
    assert diff <= tol, (f"{_name(*case)}: {what}: max |diff| {diff:.3g} > tolerance {tol:.3g} "
                         f"(max |ref| {want.abs().max().item():.3g})")


@pytest.fixture(scope="module")
def results():
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (see this module's docstring)")
    pytest.importorskip("spmd_types", reason="spmd_types is not installed (see this module's docstring)")
    found = {}
    for ep in sorted({c[0] for c in CASES}):
        ranks = coursekit.launch(_both_ways, ep, [c for c in CASES if c[0] == ep], timeout=TIMEOUT)
        found.update({case: [r[case] for r in ranks] for case in ranks[0]})
    return found


@pytest.mark.parametrize("case", CASES, ids=[_name(*c).replace(" ", "-") for c in CASES])
def test_torchtitan_expert_parallel_moe_equals_coursekit(results, case):
    """Rank by rank against our expert-parallel layer (output, token gradient, this rank's experts' gradients,
    this rank's part of the router gradient), then against the one-process layer (outputs, token gradients,
    every expert's gradient from the rank that holds it, the router's summed over ranks)."""
    ep, n_experts = case[:2]
    ranks, (per_rank, weights) = results[case], _one_process(case)
    local = n_experts // ep
    for r, rank in enumerate(ranks):
        theirs, ours = rank["theirs"], rank["ours"]
        for what in theirs:
            _check(case, theirs[what], ours[what], f"{_label(what)} of rank {r} differs from coursekit's "
                                                   f"expert-parallel layer")
        for what in ("out", "x"):
            _check(case, theirs[what], per_rank[r][what], f"{_label(what)} of rank {r} differs from the "
                                                          f"one-process layer")
        for w in set(weights) - {"router"}:
            _check(case, theirs[w], weights[w][r * local:(r + 1) * local],
                   f"rank {r}'s {w} gradient differs from the one-process layer's")
    router = sum(rank["theirs"]["router"] for rank in ranks)
    _check(case, router, weights["router"], "the router gradient summed over ranks differs from the one-process "
                                            "layer's")


def _label(what):
    return {"out": "output", "x": "input gradient", "router": "router gradient"}.get(what, f"{what} gradient")


def test_without_torchtitan_the_error_names_the_install(monkeypatch):
    import importlib.util

    from coursekit.parallel.expert.torch import TORCHTITAN_INSTALL, torchtitan_moe

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchtitan" else real(name, *a))
    with pytest.raises(ImportError, match="pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3"):
        torchtitan_moe(MoE(D, FF, 4))
    assert TORCHTITAN_INSTALL == "pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3"
