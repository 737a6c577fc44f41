"""Calibration: the :class:`Network` whose model reproduces a machine's measured times."""

from __future__ import annotations

import math
from typing import Sequence

from .model import Network
from .replay import collective_time

__all__ = ["fit_alpha_beta", "calibrate"]


def fit_alpha_beta(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Least-squares fit of ``time = α + β·bytes`` per algorithm (α: latency, 1/β: bandwidth)."""
    import numpy as np

    fits = {}
    for name in {r["algorithm"] for r in rows} - {"ping-pong"}:
        mine = [r for r in rows if r["algorithm"] == name]
        if len(mine) < 2:
            continue
        a = np.array([[1.0, r["bytes"]] for r in mine])
        # weight by 1/time so small messages (latency) count as much as large ones (bandwidth)
        w = np.array([1.0 / r["seconds"] for r in mine])
        solution, *_ = np.linalg.lstsq(a * w[:, None], np.array([r["seconds"] for r in mine]) * w, rcond=None)
        fits[name] = (max(0.0, float(solution[0])), max(0.0, float(solution[1])))
    return fits


def calibrate(samples: Sequence[tuple[float, float]], name: str = "ring", world_size: int = 2,
              itemsize: int = 4) -> Network:
    """The :class:`Network` whose model reproduces measured ``(bytes, seconds)`` pairs of one collective.

    ``time = a + c·bytes`` is fitted by :func:`fit_alpha_beta`
    (least squares, weighted by 1/time). The model's own time is linear in
    the bytes too, ``n_α·α + k·bytes/B``; its coefficients ``n_α`` (latency
    terms) and ``k`` (bytes through the busiest side per byte all-reduced)
    are read from the model itself, so ``α = a/n_α`` and ``B = k/c``.
    """
    rows = [{"algorithm": name, "bytes": nbytes, "seconds": seconds} for nbytes, seconds in samples]
    fits = fit_alpha_beta(rows)
    if name not in fits:
        raise ValueError("calibrate needs at least two (bytes, seconds) samples.")
    a, c = fits[name]
    numel = 64 * world_size   # a multiple of G: the bandwidth coefficient is exact
    latency_terms = collective_time(name, world_size, numel, Network(math.inf, 1.0), itemsize).total
    per_byte = collective_time(name, world_size, numel, Network(1.0, 0.0), itemsize).total / (numel * itemsize)
    return Network(bandwidth=per_byte / c if c > 0 else math.inf, latency=a / latency_terms)
