"""Exercise 06's merge cases, and what a wrong merge did: the sentences ``merge_exact`` and the ring's checks add.

Each case is two partial attention results over 3 + 3 keys of one random problem (:func:`merge_case`), the
second part's scores shifted against the first. Which cases tell which merge apart:

* equal parts: averaging is right (a precondition);
* one part 30 higher: the other weighs e^−30, so keeping only the larger part, or rescaling without normalising,
  is right to rounding (preconditions);
* 1.5 apart, either way: every wrong weighting shows;
* large scores, 800 in float64 and 100 in float32: e^lse overflows (e^709 and e^88 are the largest), so a merge
  that exponentiates the log-sum-exps without subtracting their maximum first gives inf / inf = NaN, where the
  right one is exact. Attention scores that large are what training meets, in float32 and bf16 (the ring's own
  cases, random scores of a few units, never do).
"""

from __future__ import annotations

import torch

from ..answers import held_back

__all__ = ["MERGE_CASES", "MERGE_PRECONDITIONS", "merge_case", "merge_mistake", "merge_is_right", "tolerance", "is_large",
           "RESCALE", "NO_RESCALE", "PICKS_LARGER", "NOT_NORMALISED", "OVERFLOWS", "WRONG_MERGE"]

F64, F32 = torch.float64, torch.float32
# (name, shifts of the two parts' scores (None: equal parts), dtype); the first three are preconditions
MERGE_CASES = (("parts with equal scores", None, F64),
               ("the second part's scores 30 higher", (0.0, 30.0), F64),
               ("the first part's scores 30 higher", (0.0, -30.0), F64),
               ("the second part's scores 1.5 higher", (0.0, 1.5), F64),
               ("the first part's scores 1.5 higher", (0.0, -1.5), F64),
               ("scores near 800 (float64), the second part's 1.5 higher", (800.0, 801.5), F64),
               ("scores near 100 (float32), the first part's 1.5 higher", (101.5, 100.0), F32))
MERGE_PRECONDITIONS = 3
LARGE = 100.0  # a case whose scores are shifted at least this much tells an overflowing merge

RESCALE = ("Weigh each part by its share of the total, e^(lse_i − lse) with lse = log(e^lse1 + e^lse2) "
           "(torch.logaddexp) — in max/sum terms l_i·e^(m_i − m)/l")
NO_RESCALE = ("your merge is right when both parts have the same log-sum-exp but not when they differ: it does not "
              "rescale by the running max. " + RESCALE)
PICKS_LARGER = ("your merge keeps only the part with the larger log-sum-exp: right when the other part's weight is "
                "negligible (e^−30), not when the two are close. Both parts count. " + RESCALE)
NOT_NORMALISED = ("your merge weighs the two parts by factors that do not sum to one (query 0: {:.3g} + {:.3g} = "
                  "{:.3g}): it rescales them but does not normalise (divide by the total weight). " + RESCALE)
OVERFLOWS = ("merge overflows for large scores: subtract the running maximum before exp. e^lse is inf once lse "
             "passes 709 in float64 (88 in float32), and inf / inf is NaN; e^(lse_i − lse), with lse = "
             "torch.logaddexp(lse1, lse2) (or m = max(lse1, lse2), lse = m + log(e^(lse1 − m) + e^(lse2 − m))), "
             "never exceeds 1")
WRONG_MERGE = "your merge is wrong (see merge_exact), and the ring merges with it: fix merge first"


def is_large(shifts) -> bool:
    return shifts is not None and max(abs(s) for s in shifts) >= LARGE


def tolerance(dtype) -> float:
    return 1e-9 if dtype == F64 else 1e-4


def merge_case(shifts, dtype):
    """``(parts, expected o, expected lse)``: the parts ``(o1, lse1, o2, lse2)`` in ``dtype``, the answer in float64."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 6, 4, generator=g, dtype=F64) for _ in range(3))
    scores = q @ k.transpose(-1, -2)
    if shifts is None:
        scores = torch.cat([scores[..., :3], scores[..., :3]], dim=-1)
        v = torch.cat([v[:, :3], v[:, :3]], dim=1)
    else:
        scores[..., :3] += shifts[0]
        scores[..., 3:] += shifts[1]
    parts = []
    for s, vv in ((scores[..., :3], v[:, :3]), (scores[..., 3:], v[:, 3:])):
        lse = s.logsumexp(-1)
        parts += [(torch.exp(s - lse.unsqueeze(-1)) @ vv).to(dtype), lse.to(dtype)]
    return tuple(parts), scores.softmax(-1) @ v, scores.logsumexp(-1)


def merge_mistake(o, o1, lse1, o2, lse2) -> str | None:
    """What a wrong merge did, when its output is a per-query mix w1·o1 + w2·o2 of the parts (else None)."""
    if not torch.isfinite(o).all():
        return None
    parts = torch.stack([o1, o2], dim=-1)                                # (..., L, d, 2): d equations, 2 weights
    weights = torch.linalg.lstsq(parts, o.unsqueeze(-1)).solution        # (..., L, 2, 1)
    if not torch.allclose(parts @ weights, o.unsqueeze(-1), atol=1e-9):
        return None
    weights = weights.squeeze(-1)
    larger = (lse1 >= lse2).to(o.dtype)
    if torch.allclose(weights, torch.stack([larger, 1 - larger], dim=-1), atol=1e-6):
        return PICKS_LARGER
    total = weights.sum(-1)
    if not torch.allclose(total, torch.ones_like(total), atol=1e-6):
        w1, w2 = weights.flatten(0, -2)[0].tolist()
        return NOT_NORMALISED.format(w1, w2, w1 + w2)
    return NO_RESCALE


def merge_is_right(merge) -> bool:
    """Whether ``merge`` gets the two float64 cases 1.5 apart right (what the ring's scores need: they are small)."""
    for _, shifts, dtype in MERGE_CASES[MERGE_PRECONDITIONS:]:
        if is_large(shifts):
            continue
        parts, expected, _ = merge_case(shifts, dtype)
        try:
            with held_back("06_ring_attention"):
                o, _ = merge(*parts)
            if not torch.allclose(o, expected, atol=tolerance(dtype)):
                return False
        except Exception:
            return False
    return True
