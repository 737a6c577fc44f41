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
  such a pair: Llama 3 405B on 8,192 and 16,384 GPUs (dp 64 and 128, so m 32 and 16: published 0.930, the
  model 0.835 on :meth:`~.config.Hardware.h100`; off by 1.11), and NeMo's Llama 3.1 8B on 8 and 128 (dp 4 and 64,
  m 32 both: published 0.972, the model 0.964 with dp's reduce partly exposed across nodes; off by 1.008).

* :func:`margin` -- the same over *every* pair the published set holds (:func:`layout_pairs`: one model on one
  machine in two layouts, found in :data:`~.published.ALL_RUNS`, not listed by hand): the two above and
  Korthikanti et al. 2022's four models, full recomputation against sequence parallelism with selective
  recomputation, on A100s priced by shape (off by 1.003 to 1.023), and Narayanan et al. 2021's Table 2, GPT-3
  175B as PTD-P (tp 8 × pp 12) and as ZeRO-3 without model parallelism on 384, 768 and 1,536 A100s, paired
  with each other and with Korthikanti's 175B: 33 pairs. The PTD-P runs are predicted at 1.11× their published
  speed (Korthikanti's 175B at 1.04-1.05×), ZeRO-3's at 1.42-1.71×: the model hides ZeRO-3's gathers behind
  compute (on 384 GPUs 46 s of each, 1.4 s exposed), and the published steps take about their sum (82 s; on
  1,536 GPUs 67 s against 13 + 47), as if DeepSpeed's ZeRO-3 of 2021 overlapped little. So the worst pair,
  ZeRO-3 on 384 GPUs against Korthikanti's 175B with sequence parallelism, is off by 1.65: the margin (without
  Table 2, the 405B pair's 1.11).

Two layouts whose predicted step times are within the margin are a **tie** for the model: it cannot say which is
faster, only that both fit. :func:`ties` reads them off a ranking.

    >>> round(model_error(), 2), round(ranking_error(), 2)   # torchtitan's eager run; 405B's 16K/8K: 0.835 vs 0.930
    (1.74, 1.11)
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

from .planner import Candidate
from .published import ALL_RUNS, LLAMA3_405B_8K, LLAMA3_405B_16K, NEMO_8B, NEMO_8B_128, RUNS, PublishedRun, predict

__all__ = ["model_error", "ranking_error", "ties", "LAYOUT_PAIRS", "layout_pairs", "pair_errors", "margin"]

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


def layout_pairs(runs: Sequence[PublishedRun] = ALL_RUNS) -> tuple[tuple[PublishedRun, PublishedRun], ...]:
    """Every two of ``runs`` that are one model (``config``) on one kind of machine (``hardware``) in two layouts:
    the choices a ranking compares (dp and the micro-batches: Llama 3 405B, NeMo's 8B; recomputation with sequence
    parallelism: Korthikanti's four models). Two runs of one layout (torchtitan eager and compiled) are not one."""
    runs = list(runs)
    return tuple((a, b) for i, a in enumerate(runs) for b in runs[i + 1:]
                 if a.config == b.config and a.hardware == b.hardware and a.layout != b.layout)


def pair_errors(runs: Sequence[PublishedRun] = ALL_RUNS) -> list[tuple[PublishedRun, PublishedRun, float]]:
    """Each of :func:`layout_pairs`' pairs with the factor between its predicted and its published speed ratio."""
    return [(a, b, _ranking(((a, b),))) for a, b in layout_pairs(runs)]


def margin(runs: Sequence[PublishedRun] = ALL_RUNS, quantile: float = 1.0) -> float:
    """How far apart two layouts' predicted step times must be for the model to tell which is faster: its error on
    the ratio of two layouts' speed, measured over every pair of ``runs`` of one model on one machine
    (:func:`pair_errors`), the worst of them (``quantile`` 1) or a lower quantile (0.9: the 90th percentile,
    nearest rank).

    Leave-one-out: each pair's error is that of a prediction made without it -- nothing in the model is fitted to
    the published runs (the hardware descriptions are Calculon's, NVIDIA's and the papers'), so the model that
    predicts a pair is the same whether or not the pair is in the set, and its leave-one-out error is its error.
    What moves the margin is the set: a pair added that the model gets worse raises it (tests/test_costmodel_ties.py).
    """
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile is a share in (0, 1]: 1 for the worst pair, 0.9 for the 90th percentile "
                         f"(got {quantile}).")
    errors = sorted(error for _, _, error in pair_errors(runs))
    if not errors:
        raise ValueError("margin needs two published runs of one model on one machine in two layouts; add one.")
    return errors[max(0, math.ceil(quantile * len(errors)) - 1)]


def ties(ranked: Sequence[Candidate], error: float | None = None) -> list[Candidate]:
    """The head of ``ranked`` (fastest first, as :func:`~.planner.plan` returns it) that the model cannot tell
    from the first: every candidate whose step time is at most ``error`` (default :func:`margin`, the worst pair)
    times the first's. One candidate alone is a "tie" of one: the model picks it."""
    error = margin() if error is None else error
    if error < 1:
        raise ValueError(f"error is a factor >= 1 (1.09: off by up to 9%); got {error}.")
    if not ranked:
        return []
    first = ranked[0].seconds
    if any(later.seconds < earlier.seconds for earlier, later in zip(ranked, ranked[1:])):
        raise ValueError("ties() reads a ranking, fastest first: sort the candidates by step time (plan() does).")
    return [c for c in ranked if c.seconds <= first * error]
