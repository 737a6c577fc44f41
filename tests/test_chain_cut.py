"""Chapter 03's chain of unequal layers (coursekit.experiments.chain_cut): where to cut it, and its idle time.

Every check here was seen failing on a planted bug, named in its docstring.
"""

import pytest
import torch

import coursekit
from coursekit.experiments import CUT_VARIANTS, TokenData, chain_shares, compare_cuts, cut_steps, token_mlp
from coursekit.measure.trace import Span
from coursekit.parallel.pipeline import layer_costs, layers, partition, split

VOCAB, WIDTH, HIDDEN, TOKENS = 2048, 128, 512, 256


def flops(vocab: int, width: int, hidden: int, blocks: int, tokens: int) -> list[float]:
    """Multiply-adds of each layer's forward and backward: a matrix product's backward costs twice its forward.

    The embedding only looks rows up (0); a block is two products of ``width × hidden`` per token; the head one of
    ``width × vocab``. Every layer's input but the embedding's needs its gradient, so every product counts 3 times.
    """
    return [0.0] + [3 * 2 * tokens * width * hidden] * blocks + [3 * tokens * width * vocab]


def test_on_unequal_layers_the_cut_by_time_differs_and_balances_the_work():
    """The embedding and the head hold the same parameters (2048 × 128), but only the head multiplies by them. The
    cut by parameters is [3, 3]; the cut by measured time is the cut that balances the layers' multiply-adds, [4, 2].

    Planted bug seen failing: ``layer_costs(by="time")`` returning the parameter counts (both cuts [3, 3])."""
    model = token_mlp(VOCAB, WIDTH, HIDDEN)
    sample = TokenData(VOCAB).batch(0, TOKENS)[0]
    by_params = partition(layer_costs(model, "params"), 2)
    by_time = partition(layer_costs(model, "time", sample=sample), 2)
    assert by_params == partition([VOCAB * WIDTH] + [2 * WIDTH * HIDDEN] * 4 + [WIDTH * VOCAB], 2) == [3, 3]
    assert by_time == partition(flops(VOCAB, WIDTH, HIDDEN, 4, TOKENS), 2) == [4, 2]
    assert [name for name, _ in layers(model)] == [
        "embedding", "block0", "block1", "block2", "block3", "head"]


def test_the_cut_by_time_needs_no_sample_when_the_first_layer_is_an_embedding():
    """``split(model, 2, by="time")`` draws its own sample of token ids for a model that starts with an embedding.

    Planted bug seen failing: the sample drawn as features for the first ``nn.Linear`` (the embedding refused
    a float tensor)."""
    model = token_mlp(VOCAB, WIDTH, HIDDEN)
    costs = layer_costs(model, "time")
    assert len(costs) == 6 and min(costs) > 0
    stages = split(model, 2, by="time")
    x = TokenData(VOCAB).batch(0, 5)[0]
    torch.testing.assert_close(stages[1](stages[0](x)), model(x))


def _span(rank, kind, start, end):
    return Span(rank, kind, "", start, end)


def test_chain_shares_tell_waiting_for_the_other_rank_from_the_rest():
    """A window of 10 s. Rank 0 computes 0-2 and 7-9, steps its optimiser 9-10, and waits in a receive 2-7.
    Rank 1 waits 0-3, computes 3-6.5, but half a second of its forward (3.5-4) is a receive booked inside it.
    Rank 0's idle 5 s: 3 s while rank 1 really computed (3-3.5, 4-6.5), 2 s with nobody computing. Rank 1's idle
    6.5 s: 4 s while rank 0 computed (0-2, 7-9).

    Planted bugs seen failing: every idle second counted as waiting for the other rank (rank 0's 0.5, not 0.3);
    a receive inside a forward counted as computing (rank 1's 0.35, not 0.3)."""
    spans = [_span(0, "forward", 0, 2), _span(0, "idle", 2, 7), _span(0, "backward", 7, 9),
             _span(0, "optimizer", 9, 10), _span(1, "idle", 0, 3), _span(1, "forward", 3, 5),
             _span(1, "idle", 3.5, 4), _span(1, "backward", 5, 6.5)]
    shares = chain_shares(spans, 0.0, 10.0)
    assert shares[0] == pytest.approx({"computing": 0.4, "optimizer": 0.1, "idle": 0.5, "waiting": 0.3,
                                       "other": 0.2})
    assert shares[1] == pytest.approx({"computing": 0.3, "optimizer": 0.0, "idle": 0.7, "waiting": 0.4,
                                       "other": 0.3})
    with pytest.raises(ValueError, match="window .* is empty: pass the start and end"):
        chain_shares(spans, 3.0, 3.0)


def test_every_cut_chain_and_pipeline_computes_one_process_gradients():
    """2 ranks, a small token_mlp (vocab 64, 16 -> 32 -> 16), 32 tokens in 4 micro-batches: both cuts, as a chain
    and as a pipeline, give each rank's stage the gradients one process computes on the whole batch, and report
    one time per iteration.

    Planted bug seen failing: the micro-batch's loss not scaled by its share of the batch (the pipeline's
    gradients 4 times one process's)."""
    results = coursekit.launch(cut_steps, 2, 32, 4, 2, 64, 16, 32, 4, timeout=120)
    for result in results:
        assert set(result["gradient_difference"]) == set(CUT_VARIANTS)
        assert max(result["gradient_difference"].values()) < 1e-6
        assert all(len(result["times"][v]) == 2 and len(result["compute"][v]) == 2 for v in CUT_VARIANTS)
    assert results[0]["cuts"] == results[1]["cuts"]
    with pytest.raises(coursekit.RankError, match="runs on 2 ranks"):
        coursekit.launch(cut_steps, 3, 32, 4, 1, 64, 16, 32, 4, timeout=120)


def test_the_comparison_takes_the_slower_rank_and_pairs_the_iterations(monkeypatch):
    """Three iterations of made-up seconds: a step is the slower rank's time; each ratio is taken within an
    iteration, then the median; a rank's idle share is the part of the step outside its own compute.

    Planted bugs seen failing: the faster rank's time taken as the step (1.0, not 1.1); the medians divided
    instead of the paired ratios (the chain's 1.00 against the paired 0.95)."""
    times = {("chain", "params"): ([1.0, 1.2, 1.1], [1.05, 1.0, 1.0]),
             ("chain", "time"): ([1.0, 1.0, 1.0], [1.1, 1.0, 1.3]),
             ("pipeline", "params"): ([0.9, 0.8, 1.0], [0.8, 0.9, 0.9]),
             ("pipeline", "time"): ([0.6, 0.5, 0.7], [0.5, 0.6, 0.6])}
    costs = {"params": [4.0, 2.0, 2.0, 2.0, 2.0, 4.0], "time": [0.0, 0.01, 0.01, 0.01, 0.01, 0.02]}
    ranks = [{"costs": costs, "cuts": {"params": [3, 3], "time": [4, 2]},
              "times": {v: t[r] for v, t in times.items()},
              "compute": {v: [0.5 * s for s in (0.9, 0.9, 1.0)] if v == ("pipeline", "params") else
                          [0.3, 0.3, 0.35] for v in CUT_VARIANTS},
              "gradient_difference": {v: 1e-9 * r for v in CUT_VARIANTS}} for r in (0, 1)]
    monkeypatch.setattr("coursekit.experiments.chain_cut.launch", lambda *args, **kwargs: ranks)
    result = compare_cuts(iterations=3)
    assert result.step[("chain", "params")] == pytest.approx(1.1)           # of 1.05, 1.2, 1.1
    assert result.faster["chain"] == pytest.approx((1.05 / 1.1, 1.1 / 1.3, 1.2 / 1.0))
    assert result.faster["pipeline"] == pytest.approx((1.5, 1.0 / 0.7, 1.5))
    assert result.pipelined == pytest.approx((1.1 / 0.6, 1.0 / 0.6, 1.3 / 0.7))
    assert result.idle[("pipeline", "params")] == pytest.approx([0.5, 0.5])
    assert result.idle[("pipeline", "time")] == pytest.approx([0.5, 0.5])  # 0.3 / 0.6, 0.35 / 0.7
    assert result.parameters == {"params": [8.0, 8.0], "time": [10.0, 6.0]}
    assert result.stage_ms["time"] == pytest.approx([30.0, 30.0])
    assert result.gradient_difference == pytest.approx(1e-9)
    table = result.table()
    assert "pipeline, cut by time: step 600.0 ms; rank 0 idle 50%, rank 1 idle 50%" in table
    assert "pipeline: cut by time 1.50x as fast as cut by params (paired, 1.43-1.50)" in table
