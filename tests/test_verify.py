"""The equivalence harness finds the first divergence and names it."""

import copy

import pytest
import torch

from coursekit.models import TeacherData, loss_fn, tiny_mlp
from coursekit.measure.verify import (FlatShard, TOLERANCES, assert_equivalent, compare, reassemble, record_step,
                              reference_run)


@pytest.fixture(scope="module")
def reference():
    model = tiny_mlp(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = TeacherData()
    return reference_run(model, optimizer, [data.batch(s, 8) for s in range(3)], loss_fn)


def _two_ranks(reference):
    """A fake 2-rank run that equals the reference: outputs split by batch, everything else replicated."""
    ranks = []
    for r in range(2):
        records = copy.deepcopy(reference)
        for rec in records:
            rec["output"] = rec["output"].tensor_split(2)[r]
        ranks.append(records)
    return ranks


def test_reference_run_is_reproducible_and_equal_to_itself(reference):
    model = tiny_mlp(seed=0)
    again = reference_run(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                          [TeacherData().batch(s, 8) for s in range(3)], loss_fn)
    report = compare(reference, [again])
    assert report.ok, str(report)
    assert len(report.rows) == 3 * 4  # output, loss, grads, params per step
    assert "equivalent" in str(report) and "yes" in report.table()
    # the params after step k are not those after step k+1: the harness compares something that moves
    assert not torch.equal(reference[0]["params"]["layers.0.weight"], reference[1]["params"]["layers.0.weight"])


def test_first_divergence_names_step_tensor_and_rank(reference):
    ranks = _two_ranks(reference)
    assert compare(reference, ranks).ok
    ranks[1][1]["grads"]["layers.1.weight"][2, 3] += 0.5    # step 1, rank 1
    ranks[0][2]["params"]["layers.0.bias"][0] += 0.5         # later: must not be "first"
    report = compare(reference, ranks)
    first = report.first
    assert (first.step, first.kind, first.name, first.rank, first.index) == (1, "grad", "layers.1.weight", 1, (2, 3))
    assert first.max_abs_diff == pytest.approx(0.5, rel=1e-5)
    assert "step 1, grad 'layers.1.weight', rank 1" in str(first)
    with pytest.raises(AssertionError, match="layers.1.weight"):
        assert_equivalent(reference, ranks)


def test_output_and_loss_divergences(reference):
    ranks = _two_ranks(reference)
    ranks[1][0]["output"][1, 0] += 1.0  # row 1 of rank 1's half
    report = compare(reference, ranks)
    assert (report.first.step, report.first.kind, report.first.rank) == (0, "output", 1)
    ranks = _two_ranks(reference)
    ranks[0][2]["loss"] += 1e-2
    report = compare(reference, ranks)
    assert (report.first.step, report.first.kind, report.first.rank) == (2, "loss", 0)


def test_missing_gradient_is_reported(reference):
    ranks = _two_ranks(reference)
    del ranks[0][0]["grads"]["layers.2.bias"]
    report = compare(reference, ranks)
    assert report.first.kind == "missing" and report.first.name == "layers.2.bias"


def test_flat_shards_are_reassembled_and_the_owner_is_named():
    model = tiny_mlp(seed=1)
    layout = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    pieces = flat.tensor_split(3)
    starts = [0, pieces[0].numel(), pieces[0].numel() + pieces[1].numel()]
    # rank r owns segment (r + 1) % 3, as after chapter 01's ring reduce-scatter
    shards = [FlatShard(layout, starts[(r + 1) % 3], pieces[(r + 1) % 3].clone()) for r in range(3)]
    whole = reassemble(shards)
    for name, p in model.named_parameters():
        assert torch.equal(whole[name], p.detach())
    reference = [record_step(None, 1.0, model, model)]
    ranks = [[{"output": None, "loss": 1.0, "grads": s, "params": s}] for s in shards]
    for rec, s in zip((r[0] for r in ranks), shards):
        rec["grads"] = FlatShard(layout, s.start, s.data.clone())
    assert compare(reference, ranks).ok
    # corrupt the last element: it lives in segment 2, which rank 1 owns
    ranks[1][0]["params"] = FlatShard(layout, shards[1].start, shards[1].data.clone())
    ranks[1][0]["params"].data[-1] += 1.0
    report = compare(reference, ranks)
    assert (report.first.kind, report.first.name, report.first.rank) == ("param", "layers.2.bias", 1)
    with pytest.raises(ValueError, match="tile"):
        reassemble([shards[1], shards[2]])


def test_a_rank_may_hold_several_slices_and_the_owner_is_still_named():
    """ZeRO with buckets: each rank records a list of FlatShards (its segment of every bucket).

    Seen failing with the planted bug "the owner is the shard's position in the flattened list, not
    its rank" (``rank = holder``): the divergence named rank 3 instead of 1.
    """
    model = tiny_mlp(seed=1)
    layout = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    buckets = flat.tensor_split([4000])  # two buckets, each cut into 3 segments
    per_rank = [[], [], []]
    offset = 0
    for bucket in buckets:
        segments = bucket.tensor_split(3)
        starts = [offset, offset + segments[0].numel(), offset + segments[0].numel() + segments[1].numel()]
        for r in range(3):
            per_rank[r].append(FlatShard(layout, starts[(r + 1) % 3], segments[(r + 1) % 3].clone()))
        offset += bucket.numel()
    reference = [record_step(None, 1.0, model, model)]
    ranks = [[{"output": None, "loss": 1.0, "grads": pieces, "params": [FlatShard(layout, s.start, s.data.clone())
                                                                      for s in pieces]}] for pieces in per_rank]
    assert compare(reference, ranks).ok
    ranks[1][0]["params"][1].data[-1] += 1.0  # the model's last element: bucket 1's segment 2, rank 1's
    report = compare(reference, ranks)
    assert (report.first.kind, report.first.name, report.first.rank) == ("param", "layers.2.bias", 1), report.first
    del ranks[2][0]["grads"][0]  # a slice missing: the layout does not tile
    assert compare(reference, ranks).first.kind == "missing"


def test_tolerance_depends_on_dtype():
    assert TOLERANCES[torch.float64][0] < TOLERANCES[torch.float32][0] < TOLERANCES[torch.bfloat16][0]
    for dtype, expect_ok in ((torch.float32, True), (torch.float64, False)):
        value = torch.ones(4, dtype=dtype)
        reference = [{"output": None, "loss": 0.0, "grads": {"w": value}, "params": {"w": value}}]
        ranks = [[{"output": None, "loss": 0.0, "grads": {"w": value + 1e-7}, "params": {"w": value}}]]
        assert compare(reference, ranks).ok is expect_ok


def test_step_count_mismatch_is_an_error(reference):
    with pytest.raises(ValueError, match="recorded 2 steps"):
        compare(reference, [reference[:2]])


@pytest.mark.parametrize("kind", ["grads", "params", "output", "loss"])
def test_a_nan_is_a_divergence(reference, kind):
    """Planted bug: the tolerance test written ``diff > tol``, which is False for NaN, so NaN slips through."""
    ranks = _two_ranks(reference)
    if kind == "loss":
        ranks[1][1]["loss"] = float("nan")
    elif kind == "output":
        ranks[1][1]["output"][0, 0] = float("nan")
    else:
        ranks[1][1][kind]["layers.1.weight"][0, 0] = float("nan")
    report = compare(reference, ranks)
    assert not report.ok, f"a NaN in rank 1's {kind} passed as equivalent"
    assert (report.first.step, report.first.rank) == (1, 1) and report.first.got != report.first.got  # NaN


def test_a_wrong_loss_on_rank_one_only_is_caught(reference):
    """Planted bug: only rank 0's loss is compared, though every rank must report the global loss."""
    ranks = _two_ranks(reference)
    ranks[1][0]["loss"] += 1e-2
    report = compare(reference, ranks)
    assert not report.ok, "rank 1 reported a wrong global loss and it passed as equivalent"
    assert (report.first.step, report.first.kind, report.first.rank) == (0, "loss", 1), str(report)
