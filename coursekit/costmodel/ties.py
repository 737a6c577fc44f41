"""When the cost model can tell two layouts apart: its error on time, measured, and the ties in a ranking.

The model's bytes are exact (tests/test_costmodel_*_measured.py); its time is not. How far off it is was
measured against published throughput (:mod:`.published`: torchtitan's Llama 3.1 8B, Llama 3 405B on 8,192
and 16,384 GPUs, NVIDIA's NeMo benchmarks of Llama 3.1 8B on 8 and 128 and 70B on 64), two ways:

* :func:`model_error` -- one run's throughput: each prediction is off by a factor, ``max(ratio, 1/ratio)``,
  the largest of them. What is wrong for every layout alike counts here: the share of peak the matmuls reach
  (torchtitan's eager and compiled runs are the same step, 1.16× apart), the card's true peak.
* :func:`ranking_error` -- a *ratio* of two layouts of one model on one machine, which is what a ranking
  compares: the same factor between the predicted and the published ratio. What is wrong in both alike
  cancels; what is left is the error in what differs (the bubble, the communication). Two sources publish
  such a pair: Llama 3 405B on 8,192 and 16,384 GPUs (dp 64 and 128, so m 32 and 16; off by 1.09), and NeMo's
  Llama 3.1 8B on 8 and 128 (dp 4 and 64, m 32 both: published 0.972, the model 1.000 with dp hidden; off by
  1.03).

Two layouts whose predicted step times are within the ranking error are a **tie** for the model: it cannot say
which is faster, only that both fit. :func:`ties` reads them off a ranking.

    >>> round(model_error(), 2), round(ranking_error(), 2)   # torchtitan's eager run; 405B's 16K/8K: 0.85 vs 0.93
    (1.38, 1.09)
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from .planner import Candidate
from .published import LLAMA3_405B_8K, LLAMA3_405B_16K, NEMO_8B, NEMO_8B_128, RUNS, PublishedRun, predict

__all__ = ["model_error", "ranking_error", "ties", "LAYOUT_PAIRS"]

# published runs of one model on one kind of machine in two layouts (module docstring)
LAYOUT_PAIRS = ((LLAMA3_405B_8K, LLAMA3_405B_16K), (NEMO_8B, NEMO_8B_128))


def _factor(ratio: float) -> float:
    return max(ratio, 1 / ratio)


@lru_cache(maxsize=None)
def _error(runs: tuple[PublishedRun, ...]) -> float:
    return max(_factor(predict(run).ratio) for run in runs)


def model_error(runs: Sequence[PublishedRun] = RUNS) -> float:
    """The largest factor between a predicted and a published throughput over ``runs`` (default every
    published run the model is checked against): 1.25 means some prediction was 25% fast or 20% slow."""
    if not runs:
        raise ValueError("model_error needs at least one published run to measure the error against.")
    return _error(tuple(runs))


@lru_cache(maxsize=None)
def _ranking(pairs: tuple[tuple[PublishedRun, PublishedRun], ...]) -> float:
    return max(_factor((predict(b).tokens_per_gpu / predict(a).tokens_per_gpu) / (b.tokens_per_gpu / a.tokens_per_gpu))
               for a, b in pairs)


def ranking_error(pairs: Sequence[tuple[PublishedRun, PublishedRun]] = LAYOUT_PAIRS) -> float:
    """The largest factor between a predicted and a published ratio of two layouts' throughput, over ``pairs``
    of published runs of one model on one kind of machine (default :data:`LAYOUT_PAIRS`)."""
    if not pairs:
        raise ValueError("ranking_error needs at least one pair of published layouts to measure the error against.")
    return _ranking(tuple(tuple(pair) for pair in pairs))


def ties(ranked: Sequence[Candidate], error: float | None = None) -> list[Candidate]:
    """The head of ``ranked`` (fastest first, as :func:`~.planner.plan` returns it) that the model cannot tell
    from the first: every candidate whose step time is at most ``error`` (default :func:`ranking_error`)
    times the first's. One candidate alone is a "tie" of one: the model picks it."""
    error = ranking_error() if error is None else error
    if error < 1:
        raise ValueError(f"error is a factor >= 1 (1.09: off by up to 9%); got {error}.")
    if not ranked:
        return []
    first = ranked[0].seconds
    if any(later.seconds < earlier.seconds for earlier, later in zip(ranked, ranked[1:])):
        raise ValueError("ties() reads a ranking, fastest first: sort the candidates by step time (plan() does).")
    return [c for c in ranked if c.seconds <= first * error]
