"""The sequence strategies train as in production (issue 26 §4): each rank's loss on its own tokens, no logits gathered.

Every rank of ``"ring_attention"``, ``"ulysses"`` and ``"chunk_local"`` computes the cross-entropy of its own
tokens against targets cut as its inputs were, so what autograd keeps for backward during a training step
falls as 1/G, the logits' ``b·(S/G)·V·4`` bytes included; and what is reduced for the reported loss is two
numbers per rank, its summed loss and its token count. Run in this process with ``comm.simulate`` (the same
code as on real ranks); expected sizes are derived here from the shapes.
"""

import pytest
import torch

from coursekit import comm
from coursekit.models import tiny_transformer
from coursekit.parallel.sequence import (positions, ring_attention, saved_bytes, sequence_forward, shard_sequence,
                                         ulysses_attention)
from coursekit.train import train
from coursekit.measure.verify import compare

B, S, V = 2, 32, 16       # samples, tokens per sample (divisible by 2G = 8 for zig-zag at G = 4), vocabulary
STRATEGIES = {"ring zigzag": ("ring_attention", "zigzag"), "ring contiguous": ("ring_attention", "contiguous"),
              "ulysses": ("ulysses", "contiguous")}


class Tokens:
    """Random tokens, S + 1 per sample: the inputs and the next-token targets."""

    def batch(self, step, batch_size):
        x = torch.randint(V, (batch_size, S + 1), generator=torch.Generator().manual_seed(step))
        return x[:, :-1], x[:, 1:]


def _one_step(rank, size, strategy, layout):
    """Bytes saved for backward in one training step (parameters excluded), and by the model's forward alone."""
    model = tiny_transformer(seed=0)
    options = {"layout": layout} if strategy == "ring_attention" else {}
    with saved_bytes(model.parameters()) as step:
        result = train(rank, size, strategy, model=lambda: model, data=Tokens(), steps=1, global_batch=B,
                       record=False, count_traffic=True, **options)
    attend = {"ring_attention": lambda q, k, v: ring_attention(q, k, v, True, layout, S),
              "ulysses": lambda q, k, v: ulysses_attention(q, k, v, True, S)}[strategy]
    x, _ = Tokens().batch(0, B)
    with saved_bytes(model.parameters()) as forward:
        sequence_forward(model, shard_sequence(x, 1, rank, size, layout), positions(S, rank, size, layout), attend)
    return step.bytes, forward.bytes, result["traffic"]


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_training_step_keeps_one_g_of_the_activations_per_rank_logits_included(name):
    """At G = 1, 2, 4, per rank: the step keeps the model's activations plus the loss's, which are this rank's
    b·(S/G) log-probabilities of V floats (the log-softmax of its logits, b·(S/G)·V·4 bytes), its b·(S/G) int64
    targets and nll_loss's one-float total weight; so the whole step's bytes less those 4 are exactly 1/G of one
    process's. And no logits travel: no payload in the sequence gather's phase.
    Planted bug, seen failing: the logits gathered again and the loss taken on the whole sequence, as before
    (training unchanged, the test below passes): "ring zigzag, rank 0 at G = 2: the loss keeps 4612 bytes,
    expected 2308 (this rank's 32 positions: their log-softmax 2048, targets 256, + 4)"."""
    strategy, layout = STRATEGIES[name]
    per_g = {g: comm.simulate(lambda r, n: _one_step(r, n, strategy, layout), g).results for g in (1, 2, 4)}
    one = per_g[1][0][0]
    for g, ranks in per_g.items():
        tokens = B * S // g
        loss_bytes = tokens * V * 4 + tokens * 8 + 4
        for rank, (step, forward, traffic) in enumerate(ranks):
            assert step - forward == loss_bytes, (
                f"{name}, rank {rank} at G = {g}: the loss keeps {step - forward} bytes, expected {loss_bytes} "
                f"(this rank's {tokens} positions: their log-softmax {tokens * V * 4}, targets {tokens * 8}, + 4)")
            assert step - 4 == (one - 4) // g and (one - 4) % g == 0, (
                f"{name}, rank {rank} at G = {g}: {step} bytes kept for backward, 1/G of one process's is "
                f"{(one - 4) // g + 4}")
            phases = {t.phase for t in traffic.payload}
            assert not any("gather sequence" in p for p in phases), f"{name} at G = {g}: sent {sorted(phases)}"


def test_uneven_chunks_train_like_one_process_and_the_loss_reduces_sum_and_count():
    """31 tokens over G = 4 (contiguous 8, 8, 8, 7; zig-zag 8 chunks of 3-4) and G = 3: three SGD steps of ring
    attention (both layouts) and Ulysses in the simulator give one process's loss, gradients (summed over the
    ranks) and weights, and rank 0's recorded (gathered) outputs; targets cut unevenly as the inputs are; with 2
    micro-batches too. The loss reduce is control traffic only: two numbers, to each of the other G − 1 ranks, per
    step.
    Planted bugs, each seen failing: targets cut contiguously under the zig-zag layout ("ring zigzag at G = 3:
    step 0, loss, rank 0: ... expected 2.80107, got 2.77862"); each rank's summed loss divided by its own token
    count instead of the micro-batch's ("step 0, grad 'tok_emb.weight' ... expected -0.00565396, got
    -0.0140612"); the token count left out of the reduce, Σ loss / this rank's count ("step 0, loss ... got
    7.89394"); only the last micro-batch's summed loss kept ("with 2 micro-batches: step 0, loss ... expected
    2.80107, got 1.12283")."""
    config = dict(model="transformer", steps=3, global_batch=5, optimizer="sgd", lr=0.1)
    reference = train(0, 1, "single", **config)["records"]
    for g in (3, 4):
        for name, (strategy, layout) in STRATEGIES.items():
            if strategy == "ulysses" and 4 % g:
                continue  # Ulysses needs the 4 heads divisible by G
            options = {"layout": layout} if strategy == "ring_attention" else {}

            def run(rank, size):
                result = train(rank, size, strategy, count_traffic=True, **config, **options)
                return result["records"], result["traffic"]
            results = comm.simulate(run, g).results
            records = [r[0] for r in results]
            for report in (compare(reference, [records[0]]), compare(reference, records, check_output=False)):
                assert report.ok, f"{name} at G = {g}: {report.first}"
            control = [t for t in results[0][1].transfers if t.phase == "loss and token count"]
            assert [t.numel for t in control] == [2] * (g - 1) * config["steps"], (name, g, control)
            assert all(t.kind == "control" for t in control)
    accumulated = dict(config, micro_batches=2)   # 3 + 2 samples: each micro-batch's share weighed by its size
    reference = train(0, 1, "single", **accumulated)["records"]
    records = comm.simulate(lambda r, n: train(r, n, "ring_attention", **accumulated)["records"], 2).results
    report = compare(reference, records, check_output=False)
    assert report.ok, f"ring zigzag at G = 2 with 2 micro-batches: {report.first}"
