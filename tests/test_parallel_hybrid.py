"""The capstone's strategy: every composition of pipeline × data × sequence × tensor equals one process.

Planted bugs, seen failing (each named at its test):
* gradients not divided by dp after the dp×sp all-reduce -> every layout with dp > 1 diverges at step 0;
* the all-reduce over dp only (not the flattened dp×sp) -> pp2×sp2 and dp2×sp2 diverge (the sp shares never add);
* the mesh's axes in the order dp, pp (not pp outermost) -> every layout still equals one process, but ranks 0
  and 1 no longer hold one stage: the count of elements each rank reduces says so;
* the tp/sp check dropped from check_degrees -> its test finds no error.
"""

from __future__ import annotations

import pytest
import torch

import coursekit
from coursekit import Mesh, train
from coursekit.models import LanguageData, tiny_transformer
from coursekit.parallel.hybrid import check_degrees, mesh_shape
from coursekit.parallel.pipeline import layer_costs, partition
from coursekit.measure.verify import assert_equivalent


def model():
    return tiny_transformer(seed=0, n_layers=4)


CONFIG = dict(model=model, data=LanguageData(seed=0), steps=3, global_batch=8, lr=1e-3)


def _hybrid(rank, world_size, shape, micro_batches, options):
    return train(rank, world_size, "hybrid", mesh=Mesh(shape), micro_batches=micro_batches, **CONFIG, **options)


@pytest.fixture(scope="module")
def reference():
    return train(0, 1, "single", **CONFIG)


LAYOUTS = [  # (world, degrees, micro-batches, options)
    (4, dict(dp=2, tp=2), 1, {}),
    (4, dict(dp=2, pp=2), 2, {}),
    (4, dict(tp=2, pp=2), 2, {}),
    (4, dict(pp=2, sp=2), 2, {}),
    (4, dict(dp=2, sp=2), 1, {"zero": 1}),
    (4, dict(dp=4), 1, {"zero": 1}),
    (3, dict(dp=3), 1, {}),                                  # 8 samples over 3 slices: 3, 3, 2
    (2, dict(pp=2), 4, {"schedule": "interleaved", "stages_per_rank": 2}),
    (2, dict(pp=2), 4, {"schedule": "zb_h1"}),
    (4, dict(tp=4), 1, {}),
    (1, {}, 2, {}),                                           # one rank: a pipeline of one stage
]


@pytest.mark.parametrize("world, degrees, m, options", LAYOUTS,
                         ids=[f"{'x'.join(f'{k}{v}' for k, v in d.items()) or 'one'}-{'-'.join(map(str, o.values()))}"
                              for _, d, _, o in LAYOUTS])
def test_every_layout_equals_one_process(reference, world, degrees, m, options):
    """Losses, every gradient and every parameter after each of 3 Adam steps equal one process's.

    Planted bugs, seen failing: no division by dp (dp2×tp2: 'tok_emb.weight''s gradient twice one
    process's); the all-reduce over dp only (pp2×sp2, dp2×sp2: only this rank's tokens' share of it).
    """
    out = coursekit.launch(_hybrid, world, mesh_shape(**degrees), m, options, timeout=120)
    assert_equivalent(reference["records"], [o["records"] for o in out], check_output=False)
    assert all(o["losses"] == out[0]["losses"] for o in out)          # every rank reports the same loss


@pytest.mark.slow
def test_eight_ranks_dp2_tp2_pp2(reference):
    """The three at once on 8 ranks (2 cores: slow, but still in make test)."""
    out = coursekit.launch(_hybrid, 8, mesh_shape(pp=2, dp=2, tp=2), 2, {}, timeout=180)
    assert_equivalent(reference["records"], [o["records"] for o in out], check_output=False)


def test_each_rank_reduces_its_stages_parameters_once_a_step():
    """dp2 × pp2: each rank all-reduces exactly its stage's parameters, once per step.

    The expected count comes from the dense model alone: its layers' parameter counts, cut into two stages by
    the pipeline's partition (the tied embedding counts in both: both stages hold it). Planted bug, seen
    failing: the mesh's axes ordered dp, pp (rank 0 reduced 302,208 elements, not 3 × 104,704).
    """
    costs = [int(c) for c in layer_costs(model(), "params")]
    cut = partition(costs, 2)
    per_stage = [sum(costs[:cut[0]]), sum(costs[cut[0]:])]
    out = coursekit.launch(_hybrid, 4, mesh_shape(pp=2, dp=2), 2, {}, timeout=120)
    for rank, result in enumerate(out):
        stage = rank // 2                      # mesh pp outermost: ranks 0, 1 hold stage 0
        assert result["elements_reduced"] == per_stage[stage] * CONFIG["steps"], (rank, result["elements_reduced"])


SIZES = dict(n_heads=4, n_layers=2, vocab_size=16, seq_len=31, global_batch=8, micro_batches=2)


@pytest.mark.parametrize("degrees, words", [
    (dict(world_size=4, dp=2, tp=1), "multiply to 4"),
    (dict(world_size=4, sp=2, tp=2), "ring attention over tensor-parallel heads"),
    (dict(world_size=3, tp=3), "does not divide the model's 4 attention heads"),
    (dict(world_size=8, pp=8), "has 4 layers to cut"),
    (dict(world_size=16, sp=16), "only 31 tokens"),
    (dict(world_size=8, dp=8), "fewer than micro_batches = 2"),
    (dict(world_size=2, pp=2, zero=2), "use zero = 1"),
    (dict(world_size=2, pp=2, schedule="gpipe", stages_per_rank=2), "needs schedule = 'interleaved'"),
])
def test_check_degrees_says_what_to_change(degrees, words):
    """Each bad layout is refused before anything starts, with the sentence that says what to change.

    Planted bug, seen failing: the tp/sp check removed (no error for sp2 × tp2).
    """
    rest = dict(degrees)
    world_size = rest.pop("world_size")
    shape = {axis: rest.pop(axis) for axis in ("pp", "dp", "sp", "tp") if axis in rest}
    with pytest.raises(ValueError, match=words):
        check_degrees(shape, world_size, **{**SIZES, **rest})


def test_check_degrees_accepts_a_layout_that_fits():
    check_degrees(mesh_shape(pp=2, dp=2, tp=2), 8, **SIZES)
    with pytest.raises(ValueError, match=r"mesh axes \['cp'\]"):
        check_degrees({"cp": 2, "dp": 2}, 4, **SIZES)


def _applied(rank, world_size, shape, zero):
    """The four applications by hand on this rank's mesh: what each returned, described."""
    from coursekit.parallel.data import ShardedOptimizer
    from coursekit.parallel.hybrid import (DataParallelPipeline, apply_dp, apply_pp, apply_sp,
                                           apply_tp)
    from coursekit.parallel.pipeline import PipelineParallel
    from coursekit.parallel.plan import FunctionCore
    from coursekit.parallel.sequence import ring_attention

    mesh, dense = Mesh(shape), model()
    tp = apply_tp(dense, mesh)
    sp = apply_sp(tp, mesh, lambda q, k, v: ring_attention(q, k, v, True, "zigzag", 16, mesh["sp"].group))
    pp = apply_pp(sp, mesh, lambda params: torch.optim.SGD(params, lr=0.1), [2, 4] if shape["pp"] == 2 else [6])
    dp = apply_dp(pp, mesh, (torch.optim.SGD, {"lr": 0.1}) if zero else None)
    return {"tp is the model": tp is dense, "sp is its input": sp is tp,
            "sequence blocks": sum(isinstance(m, FunctionCore) for m in sp.modules()),  # a ring core each
            "pipeline": isinstance(pp, PipelineParallel), "stages": sorted(pp.mine),
            "data": isinstance(dp, DataParallelPipeline) and dp.pipe is pp, "batch ranks": dp.batch_axis.size,
            "zero1": isinstance(pp.optimizer, ShardedOptimizer)}


@pytest.mark.parametrize("shape, zero", [(dict(pp=2, dp=1, sp=2, tp=1), False), (dict(pp=1, dp=2, sp=1, tp=2), True)],
                         ids=["pp2xsp2", "dp2xtp2-zero1"])
def test_each_application_takes_the_model_and_the_mesh_and_returns_the_model(shape, zero):
    """apply_tp, apply_sp, apply_pp, apply_dp in torchtitan's order, called by hand as Hybrid calls them: an axis of
    degree 1 leaves the model as it is; sp > 1 gives the blocks ring attention; the pipeline keeps this rank's
    stage; dp sums over dp × sp and, with ZeRO-1, shards the optimizer. (Numbers: the layouts above, through
    Hybrid, which runs exactly these.)"""
    out = coursekit.launch(_applied, 4, shape, zero, timeout=120)
    for rank, got in enumerate(out):
        assert got["tp is the model"] == (shape["tp"] == 1) and got["sp is its input"] == (shape["sp"] == 1), got
        assert got["sequence blocks"] == (4 if shape["sp"] > 1 else 0), got
        assert got["pipeline"] and got["data"] and got["zero1"] == zero, got
        assert got["stages"] == [rank // (4 // shape["pp"])], (rank, got)
        assert got["batch ranks"] == shape["dp"] * shape["sp"], got
