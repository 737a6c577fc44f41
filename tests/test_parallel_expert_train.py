"""Expert parallelism trained (issue 45, item 3): ``train(..., "expert", ep=...)`` on a ``dp × ep`` mesh equals one
process step for step -- the loss, every gradient and every weight after each of 3 Adam steps -- at 2 and 4 ranks,
E = 4 and 8, k = 1 and 2, with a global batch of 7 sequences that no rank count divides.

The one-process reference is chapter 02's loop (``"single"``) on the same model (:func:`tiny_moe`, dropless) and
data; it shares no code with the strategy but the model. (With a capacity factor, or the balance loss in the
training loss, the two differ by design: both are computed per rank's tokens, as GShard and Switch do.)

Planted bugs, seen failing:
* the experts' gradients summed over the world instead of ``dp`` -> "dp2×ep2, E=4, k=1: NOT equivalent: first
  divergence at step 0, grad 'moes.0.experts.w1'" (other experts' gradients added in);
* the gradients divided by dp instead of the world size -> "dp1×ep2, E=4, k=2: ... grad 'tok_emb.weight' ...
  expected 7.61563e-05, got 0.000152313" (twice the gradient).
"""

from __future__ import annotations

import pytest

import coursekit
from coursekit.comm.mesh import Mesh
from coursekit.measure.verify import compare
from coursekit.models import LanguageData
from coursekit.parallel.expert import tiny_moe
from coursekit.train import train

LAYOUTS = [(2, 2, 4, 2), (4, 2, 4, 1), (4, 4, 8, 2), (2, 1, 4, 2)]  # (world, ep, experts, k): dp = world / ep


def _config(n_experts, k):
    return dict(model=lambda: tiny_moe(n_experts=n_experts, k=k), data=LanguageData(vocab_size=16), steps=3,
                global_batch=7)


def _expert(rank, world_size, ep, n_experts, k):
    return train(rank, world_size, "expert", ep=ep, **_config(n_experts, k))["records"]


@pytest.mark.parametrize("world, ep, n_experts, k", LAYOUTS,
                         ids=[f"dp{w // e}xep{e}-E{n}-k{k}" for w, e, n, k in LAYOUTS])
def test_expert_parallel_training_equals_one_process(world, ep, n_experts, k):
    reference = train(0, 1, "single", **_config(n_experts, k))["records"]
    ranks = coursekit.launch(_expert, world, ep, n_experts, k, timeout=120)
    report = compare(reference, ranks, check_output=False)
    assert report.ok, f"dp{world // ep}×ep{ep}, E={n_experts}, k={k}: {report}"


def _refused(rank, world_size, case):
    if case == "dense":
        return train(rank, world_size, "expert", ep=2, model="transformer")
    if case == "experts":
        return train(rank, world_size, "expert", ep=2, model=lambda: tiny_moe(n_experts=3), data=LanguageData())
    return train(rank, world_size, "expert", mesh=Mesh({"dp": 1, "ep": 2, "tp": 2}), model=lambda: tiny_moe(),
                 data=LanguageData())


@pytest.mark.parametrize("case, world, words", [
    ("dense", 2, "'expert' spreads the experts of a mixture-of-experts model"),
    ("experts", 2, "3 experts over ep = 2 ranks: use an ep that divides the expert count"),
    ("mesh", 4, "dp = 1 × ep = 2 is not 4 ranks; use axes dp and ep only")])
def test_what_cannot_run_is_refused_with_what_to_change(case, world, words):
    with pytest.raises(coursekit.RankError) as caught:
        coursekit.launch(_refused, world, case, timeout=60)
    assert words in caught.value.remote_traceback, caught.value.remote_traceback[-800:]


def _biased(rank, world_size, ep, steps, rate):
    return train(rank, world_size, "expert", ep=ep, bias_rate=rate, model=lambda: tiny_moe(n_experts=4, k=1),
                 data=LanguageData(vocab_size=16), steps=steps, global_batch=8)["records"]


def test_the_bias_nudge_uses_the_global_counts_on_every_rank():
    """``bias_rate``: after each step every router's bias moves by the counts of the whole global batch, so dp2×ep2
    trains as one rank does with the same nudge (a rank nudging by its own counts would route differently from
    step 1 on). Planted bug, seen failing: the counts not all-reduced -> "NOT equivalent: first divergence at step
    1"."""
    one = coursekit.launch(_biased, 1, 1, 4, 0.05, timeout=60)[0]
    four = coursekit.launch(_biased, 4, 2, 4, 0.05, timeout=60)
    report = compare(one, four, check_output=False)
    assert report.ok, f"dp2×ep2 with the bias nudge: {report}"
