"""Model parallelism (coursekit.parallel.pipeline.model): a model's layers on different ranks, equal to one process.

Every check here was seen failing on a planted bug, named in its docstring.
"""

import itertools
import random
import time

import pytest
import torch
import torch.nn as nn

import coursekit
import coursekit.parallel.pipeline.model  # noqa: F401  (registers "model")
from coursekit.models import TeacherData, tiny_mlp, tiny_transformer
from coursekit.parallel.pipeline import layer_costs, layers, partition, split
from coursekit.measure.trace import Span
from coursekit.train import train
from coursekit.comm.traffic import Traffic
from coursekit.measure.verify import NamedPart, compare
from pipeline_support import run_all

TIMEOUT = 120.0
D, V, S = 64, 16, 31  # the course transformer: d_model, vocabulary, tokens per sample (LanguageData's 32 - 1)


def seed_mlp():
    """The seed's example (P3): a two-layer network, hidden layer on GPU 1 (rank 0), output layer on GPU 2."""
    return tiny_mlp(n_layers=2)


def deep_mlp():
    return tiny_mlp(n_layers=4)


MLP = dict(data=TeacherData(), optimizer="adam", lr=1e-2, steps=3)
TRANSFORMER = dict(model="transformer", optimizer="adam", lr=1e-3, steps=3)
CONFIGS = {  # world size -> configurations run in one launch
    2: [dict(MLP, model=seed_mlp, global_batch=7, trace=True),
        dict(TRANSFORMER, global_batch=7, micro_batches=2, partition_by="time"),
        dict(TRANSFORMER, global_batch=6, layers_per_stage=[1, 3], freeze=("pos_emb.weight",))],
    3: [dict(TRANSFORMER, global_batch=7, micro_batches=3), dict(MLP, model=tiny_mlp, global_batch=8)],
    4: [dict(TRANSFORMER, global_batch=8, micro_batches=2, count_traffic=True),
        dict(MLP, model=deep_mlp, global_batch=9, micro_batches=2, count_traffic=True)],
}


@pytest.fixture(scope="module")
def runs():
    """``{world size: (references, results)}``, ``results[rank][config]`` the dict of ``train``."""
    return {p: (refs, [[r[0] for r in rank] for rank in results])
            for p, (refs, results) in run_all(("model",), CONFIGS, TIMEOUT).items()}


def test_equal_to_one_process_at_2_to_4_ranks(runs):
    """Loss, output, every gradient and every weight after 3 Adam steps: the seed's two-layer MLP, the tied
    transformer (balanced by parameters, by measured time, by hand), uneven batches and micro-batches.

    Planted bugs seen failing: the tied embedding/head gradient not summed (``step 0, grad 'tok_emb.weight',
    rank 0``); the input gradient not sent back (rank 0 backward from zeros: ``grad 'layers.0.weight'``);
    the micro-batch loss left unscaled (``step 0, loss``)."""
    for world_size, (references, results) in runs.items():
        for i, config in enumerate(CONFIGS[world_size]):
            report = compare(references[i], [results[r][i]["records"] for r in range(world_size)])
            assert report.ok, f"{world_size} ranks, {config}: {report}"


def test_each_rank_holds_only_its_layers(runs):
    """The point of model parallelism: rank r holds its stage's parameters, nothing else (here 1/2 of the seed's
    layers each). Planted bug seen failing: other ranks' parameters kept (``[5392, 5392] == [4352, 1040]`` bytes)."""
    references, results = runs[2]
    model = seed_mlp()
    hidden, output = model.layers
    expected = [hidden.weight.numel() + hidden.bias.numel(), output.weight.numel() + output.bias.numel()]
    assert [results[r][0]["memory"]["params"] for r in range(2)] == [4 * n for n in expected]
    transformer = tiny_transformer()
    embedding = transformer.tok_emb.weight.numel() + transformer.pos_emb.weight.numel()
    head = transformer.ln_f.weight.numel() * 2 + transformer.tok_emb.weight.numel()  # the tied copy, on the last
    held = [results[r][2]["memory"]["params"] for r in range(2)]  # layers_per_stage=[1, 3]
    blocks = sum(p.numel() for p in transformer.blocks.parameters())
    assert held == [4 * embedding, 4 * (blocks + head)], held


def test_the_chain_one_rank_busy_at_a_time(runs):
    """P3: rank 1 waits for rank 0's forward, rank 0 for rank 1's backward; never both computing at once.

    Planted bug seen failing: rank 1's receive of the activations not drawn as waiting (no idle span)."""
    spans: list[Span] = runs[2][1][0][0]["spans"]
    compute = [s for s in spans if s.kind in ("forward", "backward")]
    for a, b in itertools.combinations(compute, 2):
        if a.rank != b.rank:
            assert a.end <= b.start or b.end <= a.start, f"{a} and {b} overlap: the chain has no parallel work"
    idle = {s.rank for s in spans if s.kind == "idle"}
    assert idle == {0, 1}, f"ranks that waited: {idle}"


def test_every_wait_is_drawn_the_end_of_step_sync_too(runs):
    """Rank 1 (the last) broadcasts the loss, which rank 0 joins only after its backward: rank 1's longest wait,
    drawn as an idle span after its last backward of each step, and so on rank 0. Planted bug seen failing: the
    end-of-step sync not traced (chapter 03's timeline left it blank): 'rank 0: 0 end-of-step waits in 3 steps';
    the sends not traced (a send that blocks in gloo was blank): 'rank 0: 0 sends drawn in 3 steps'."""
    spans: list[Span] = runs[2][1][0][0]["spans"]
    for rank in (0, 1):
        syncs = [s for s in spans if s.rank == rank and s.kind == "idle" and s.name == "end-of-step sync"]
        backwards = sorted(s.end for s in spans if s.rank == rank and s.kind == "backward")
        assert len(syncs) == MLP["steps"], f"rank {rank}: {len(syncs)} end-of-step waits in {MLP['steps']} steps"
        assert all(any(b <= sync.start for b in backwards) for sync in syncs)  # each after a backward of the step
        sends = [s for s in spans if s.rank == rank and s.kind == "idle" and s.name.startswith("send ")]
        assert len(sends) == MLP["steps"], f"rank {rank}: {len(sends)} sends drawn in {MLP['steps']} steps"


def test_elements_sent_per_step_match_the_formula(runs):
    """Forward, B·S·d activations over each of the p−1 boundaries; backward, their gradients; plus the tied
    embedding's V·d gradient both ways between the first and the last rank. Shape headers are control traffic,
    sent once per link and micro-batch shape (3 steps, micro-batches of 5 and 4 samples: 2 per link). Planted bug
    seen failing: headers sent as payload (``assert 291864 == 291840``: 3 headers of 8 elements)."""
    p, steps = 4, 3
    results = runs[p][1]
    transformer = Traffic.merge([results[r][0]["traffic"] for r in range(p)])
    assert transformer.total == steps * (2 * (p - 1) * 8 * S * D + 2 * V * D)
    mlp = Traffic.merge([results[r][1]["traffic"] for r in range(p)])
    assert mlp.total == steps * 2 * (p - 1) * 9 * 64
    assert len(mlp.control) == 2 * (p - 1) and len(transformer.control) == p - 1


# ----------------------------------------------------------------------------- partitioning (no ranks)
def test_partition_is_the_best_contiguous_split():
    """Against brute force over every way to cut n layers into k non-empty runs.

    Planted bug seen failing: the last stage's cost left out of the maximum (``[1, 3]`` for ``[1, 4, 4, 1]``)."""
    assert partition([1, 4, 4, 1], 2) == [2, 2] and partition([3, 1, 1, 1], 2) == [1, 3]
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 7)
        k = rng.randint(1, n)
        costs = [rng.randint(0, 9) for _ in range(n)]
        best = min(max(sum(costs[a:b]) for a, b in zip((0,) + cuts, cuts + (n,)))
                   for cuts in itertools.combinations(range(1, n), k - 1))
        sizes = partition(costs, k)
        bounds = list(itertools.accumulate(sizes, initial=0))
        assert len(sizes) == k and min(sizes) >= 1 and sum(sizes) == n
        assert max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])) == best, (costs, k, sizes)


class _Slow(nn.Module):
    """No parameters, but 20 ms of CPU a call: "params" and "time" must disagree about it."""

    def forward(self, x):
        begin = time.thread_time()
        while time.thread_time() - begin < 0.02:
            pass
        return x * 1.0


def test_balanced_by_parameters_or_by_measured_time():
    """Planted bug seen failing: ``by="time"`` silently counting parameters (``[2, 2]`` instead of ``[1, 3]``)."""
    model = nn.Sequential(_Slow(), nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
    sample = torch.randn(4, 64)
    assert [len(s) for s in split(model, 2, by="params")] == [2, 2]   # costs 0, 4160, 4160, 4160
    assert [len(s) for s in split(model, 2, by="time", sample=sample)] == [1, 3]
    transformer = tiny_transformer()
    block = sum(p.numel() for p in transformer.blocks[0].parameters())
    assert layer_costs(transformer) == [V * D + 64 * D, block, block, 2 * D + V * D]  # the tied weight in both
    assert [name for name, _ in layers(transformer)] == ["embedding", "blocks.0", "blocks.1", "ln_f+head"]


def test_split_stages_compose_to_the_model():
    """Planted bug seen failing: the MLP's GELU dropped between stages (outputs differ)."""
    for model, x in ((tiny_mlp(n_layers=3), torch.randn(5, 16)), (tiny_transformer(), torch.randint(V, (2, 9)))):
        for n in range(1, 4):
            out = x
            for stage in split(model, n):
                out = stage(out)
            torch.testing.assert_close(out, model(x))


def test_impossible_partitions_say_what_to_change():
    """Planted bug seen failing: an empty stage accepted (``layers_per_stage=[2, 0, 2]`` built a stage of nothing)."""
    with pytest.raises(ValueError, match=r"MLP has 2 layers \(layers.0\+gelu, layers.1\) but 3 stages.*at most 2 "
                                         r"ranks.*at least 3 layers"):
        split(seed_mlp(), 3)
    with pytest.raises(ValueError, match=r"layers_per_stage=\[2, 0, 2\]: stage 1 would be empty.*e\.g\. \[1, 1, 2\]"):
        split(tiny_transformer(), 3, layers_per_stage=[2, 0, 2])
    with pytest.raises(ValueError, match=r"they add up to 3, the model has 4 layers"):
        split(tiny_transformer(), 2, layers_per_stage=[1, 2])
    with pytest.raises(ValueError, match="by='flops'"):
        split(tiny_transformer(), 2, by="flops")
    with pytest.raises(coursekit.RankError, match="but 4 stages were asked for"):
        coursekit.launch(lambda r, n: train(r, n, "model", model=seed_mlp, data=TeacherData()), 4, timeout=TIMEOUT)


# ----------------------------------------------------------------------------- the harness: each rank holds a part
def _records(parts, outputs, loss=1.0):
    return [[{"output": out, "loss": loss, "grads": NamedPart(part), "params": NamedPart(part)}]
            for part, out in zip(parts, outputs)]


def test_compare_checks_every_holder_of_a_part():
    """NamedPart: each name on every rank holding it (the tied copy on rank 2 checked too), missing if none,
    the output from the ranks that have one. Planted bug seen failing: only the first holder checked."""
    a, b, tied, out = torch.ones(3), torch.zeros(2), torch.arange(4.0), torch.ones(2, 5)
    reference = [{"output": out, "loss": 1.0, "grads": {"a": a, "b": b, "tied": tied},
                  "params": {"a": a, "b": b, "tied": tied}}]
    good = _records([{"a": a, "tied": tied}, {"b": b}, {"tied": tied.clone()}], [None, None, out])
    assert compare(reference, good).ok
    bad = _records([{"a": a, "tied": tied}, {"b": b}, {"tied": tied + 1}], [None, None, out])
    first = compare(reference, bad).first
    assert first is not None, "a wrong copy of the tied tensor on rank 2 was not noticed"
    assert (first.kind, first.name, first.rank) == ("grad", "tied", 2), str(first)
    missing = compare(reference, _records([{"a": a, "tied": tied}, {}, {"tied": tied}], [None, None, out])).first
    assert (missing.kind, missing.name) == ("missing", "b") and "held by no rank" in str(missing)
    wrong = compare(reference, _records([{"a": a, "tied": tied}, {"b": b}, {"tied": tied}], [None, None, out * 2]))
    assert (wrong.first.kind, wrong.first.rank) == ("output", 2), str(wrong.first)
