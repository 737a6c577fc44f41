"""P9 shown where it cannot hide: on a copy task, chunk-local attention loses what lies in another chunk.

Every expected value is derived here by hand from the task's definition (the second half of each sequence
repeats the first), never read back from the code under test.
"""

import math

import pytest
import torch

import coursekit
from coursekit.parallel.sequence import chunk_bounds
from coursekit.experiments import (CopyData, needs_other_chunk, per_position_loss,
                                         train_one_process)
from coursekit.train import train
from coursekit.measure.verify import compare


def test_the_second_half_repeats_the_first():
    """seq_len 8: tokens t0..t3 t0..t3, inputs t0..t6, targets t1..t7: targets 3..6 copy inputs 0..3.
    seq_len 7: t0..t3 t0..t2: targets 3..5 copy inputs 0..2. Planted bug, seen failing: the second half drawn
    afresh instead of copied ("targets 3.. are not inputs 0..")."""
    for seq_len, sources in ((8, [-1, -1, -1, 0, 1, 2, 3]), (7, [-1, -1, -1, 0, 1, 2])):
        data = CopyData(seq_len=seq_len, seed=3)
        x, y = data.batch(step=5, batch_size=64)
        assert x.shape == y.shape == (64, seq_len - 1)
        assert data.sources().tolist() == sources
        copies = [p for p, s in enumerate(sources) if s >= 0]
        assert (y[:, copies] == x[:, [sources[p] for p in copies]]).all(), f"targets {copies[0]}.. are not inputs 0.."
        assert (x[:, 1:] == y[:, :-1]).all()  # targets shifted by one, as in language modelling
        assert torch.equal(data.batch(5, 64)[0], x) and not torch.equal(data.batch(6, 64)[0], x)
    assert len(torch.unique(CopyData(seq_len=32).batch(0, 64)[0][:, :16])) == 16  # every token of V = 16 drawn
    with pytest.raises(ValueError, match="at least 4"):
        CopyData(seq_len=3)


def test_which_positions_need_another_chunk():
    """31 inputs (seq_len 32, the first 16 tokens drawn): targets 15..30 copy inputs 0..15. Over 2 chunks
    (0-15 | 16-30) position 15 copies 0 inside chunk 0 and 16..30 reach back into chunk 0; over 4 chunks
    (0-7 | 8-15 | 16-23 | 24-30) every copy crosses: 15 -> 0, 16..23 -> 1..8, 24..30 -> 9..15.
    Planted bug, seen failing: every copied position counted, whatever the chunks (already with 1 chunk)."""
    data = CopyData(seq_len=32)
    assert [b for (b,) in chunk_bounds(31, 2)] == [(0, 16), (16, 31)]  # the chunks this derivation assumes
    assert needs_other_chunk(data, 1).tolist() == [False] * 31
    assert needs_other_chunk(data, 2).tolist() == [False] * 16 + [True] * 15
    assert needs_other_chunk(data, 4).tolist() == [False] * 15 + [True] * 16


def test_chunk_local_attention_cannot_copy_across_a_chunk():
    """At CI size (one seed, 150 Adam steps, 5 s each): full attention learns to copy, so its loss on the
    positions whose source lies in the other chunk is far below ln V; chunk-local attention over 2 chunks stays
    at least ½·ln V above it there (it cannot see the source; the best it can do is ln V). On the random first
    half neither can beat ln V by much. Planted bugs, seen failing: chunked_attention ignoring its chunk count
    (full attention for every n: the gap vanishes); the second half not copied (full attention learns nothing)."""
    data = CopyData(seq_len=32, seed=0)
    crosses, random = needs_other_chunk(data, 2), data.sources() < 0
    loss = {n: per_position_loss(train_one_process(data, n, steps=150)[0], data, n) for n in (1, 2)}
    full, chunked = loss[1][crosses].mean().item(), loss[2][crosses].mean().item()
    assert chunked >= full + 0.5 * math.log(16), (
        f"on the {int(crosses.sum())} positions whose source is in the other chunk: chunk-local {chunked:.3f} "
        f"nats, full attention {full:.3f}: the gap should be at least ½·ln 16 = {0.5 * math.log(16):.3f}")
    for n in (1, 2):
        assert loss[n][random].mean().item() > math.log(16) - 0.2, f"{n} chunks beat chance on random tokens"


def _train_sequence_strategies(rank, world_size, config):
    out = {}
    for strategy, options in (("ring_attention", {"layout": "zigzag"}), ("ring_attention", {"layout": "contiguous"}),
                              ("ulysses", {}), ("chunk_local", {})):
        out[strategy + options.get("layout", "")] = train(rank, world_size, strategy, **config, **options)["records"]
    return out


def test_ring_and_ulysses_train_on_the_copy_task_as_full_attention_does():
    """2 real ranks, 3 SGD steps on CopyData: ring attention (zig-zag, contiguous) and Ulysses give the outputs,
    loss, gradients and weights of one process with full attention; chunk-local differs from the first output."""
    config = dict(model="transformer", data=CopyData(seq_len=32, seed=1), steps=3, global_batch=5,
                  optimizer="sgd", lr=0.1)
    reference = train(0, 1, "single", **config)["records"]
    results = coursekit.launch(_train_sequence_strategies, 2, config, timeout=120)
    for name in ("ring_attentionzigzag", "ring_attentioncontiguous", "ulysses"):
        report = compare(reference, [r[name] for r in results], check_output=False)
        assert report.ok, f"{name} on the copy task: {report.first}"
        assert compare(reference, [results[0][name]]).ok
    naive = compare(reference, [results[0]["chunk_local"]])
    assert not naive.ok and naive.first.kind == "output" and naive.first.step == 0
