"""Exercise 02's hints: the usual mistake behind a wrong gradient, read off the numbers.

A gradient G times too large is a sum, not a mean; parameters that moved during backward were averaged
instead of their gradients; after two backward calls, a gradient that is ``a × (first micro-batch's
average) + b × (second's)`` names how the accumulated gradient was mishandled.
"""

from __future__ import annotations

import torch

from .data_parallel_runs import micro_batch_means

__all__ = ["gradient_hint", "moved_weights", "accumulation_hint"]


def gradient_hint(first, world_size: int, guess_unaveraged: bool) -> str:
    """A guess at the mistake behind the first wrong gradient, from the ratio got / expected."""
    if first.kind != "grad" or not first.expected:
        return ""
    ratio = first.got / first.expected
    if abs(ratio - world_size) < 1e-3 * world_size:
        return " (it is the *sum* over ranks: divide by the world size)"
    if guess_unaveraged and world_size > 1 and abs(ratio * world_size - 1) > 1e-3 and abs(ratio - 1) > 1e-3:
        return " (did this rank keep its own gradient? every gradient must be averaged)"
    return ""


def moved_weights(results) -> str:
    """Hooks that changed the parameters themselves during backward: say so (it explains every later mismatch)."""
    moved = sorted({name for r in results if len(r) > 2 for name in r[2]})
    if not moved:
        return ""
    return (f" — your hooks changed the parameters during loss.backward() ({', '.join(moved[:3])}"
            f"{', …' if len(moved) > 3 else ''}): average each parameter's gradient p.grad, not its weights p.data")


def accumulation_hint(case, results) -> str:
    """Which multiples of the two micro-batches' averaged gradients the learner's step-0 gradient is, if any.

    After two backward calls the gradient must be 1 × (first micro-batch's average) + 1 × (second's);
    fitting ``got ≈ a·first + b·second`` names the usual mistakes: a = 0 (the hook replaced ``p.grad``
    with this backward's average), a = 1/G (the first share divided twice), b = G (a sum, not a mean).
    """
    name, freeze, world_size, _, global_batch = case
    first, second = micro_batch_means(name, freeze, world_size, global_batch)
    got = results[0][0][0]["grads"]
    names = [n for n in first if n in got and got[n].shape == first[n].shape]
    if len(names) != len(first):
        return ""
    m1, m2, g = (torch.cat([t[n].reshape(-1).double() for n in names]) for t in (first, second, got))
    solution = torch.linalg.lstsq(torch.stack([m1, m2], 1), g.unsqueeze(1)).solution.reshape(-1)
    a, b = solution.tolist()
    if (torch.stack([m1, m2], 1) @ solution - g).norm() > 1e-3 * g.norm().clamp_min(1e-12):
        return ""                                      # not a combination of the two: nothing to say
    near = lambda value, target: abs(value - target) <= 1e-3 * max(1.0, abs(target))  # noqa: E731
    if near(a, 1) and near(b, 1):
        return ""
    nice = lambda value: f"{0.0 if abs(value) < 1e-6 else value:.3g}"  # noqa: E731  (rounding noise is 0)
    said = (f" (after the two backward calls of step 0 your gradient is {nice(a)} × the first micro-batch's "
            f"average + {nice(b)} × the second's; expected 1 × + 1 ×")
    if near(a, 0) and near(b, 1):
        return (said + ": your hook replaced p.grad with the average of this backward's gradient, discarding "
                       "what the first backward had accumulated — average the accumulated p.grad in place)")
    if near(a, 1 / world_size) and near(b, 1):
        return said + ": the first micro-batch's share was divided by the world size twice)"
    if world_size > 1 and near(b, world_size):  # (a = G²: the first share summed on both backward calls)
        return said + ": it is the *sum* over ranks: divide by the world size)"
    return said + ")"
