"""Sequence parallelism (chapter 06): ring attention, Ulysses and Megatron-style sequence parallelism are exact;
chunk-local attention is not; traffic and activation memory as their formulas.

Exactness is checked in this process with ``comm.simulate`` (the same code as on real ranks); real launches
train every strategy against one process (the sequence strategies on 2 ranks, Megatron-style SP x TP at t = 2-4,
sequence x data on a 2 x 2 mesh). Expected values come from full attention, the dense model and the
formulas written here, never from the code under test.
"""

import pytest
import torch

import coursekit
from coursekit import comm
from coursekit.collectives import ring_all_reduce
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel import sequence  # noqa: F401  (registers the strategies)
from coursekit.parallel.sequence import (AttentionWork, SequenceTensorParallelBlock, attention_work, chunk_bounds, chunked_attention,
                                         full_attention, gather_sequence, megatron_sp_saved_bytes, merge, positions,
                                         ring_attention, saved_bytes, sequence_forward, shard_sequence,
                                         ulysses_attention)
from coursekit.train import train
from coursekit.measure.verify import compare
from ring_blocks import computed_per_step

B, H, D = 2, 4, 8


def _qkv(seq, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, seq, D, generator=g, dtype=dtype) for _ in range(4)]  # q, k, v, dO


def _full(q, k, v, grad, causal):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = full_attention(*leaves, causal)
    (out * grad).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


def _sharded(attention, world_size, q, k, v, grad, layout="contiguous"):
    """``attention`` on every simulated rank's shard; returns (per-rank [out, dq, dk, dv], traffic)."""
    def run(rank, size):
        mine = [shard_sequence(t, 2, rank, size, layout).requires_grad_() for t in (q, k, v)]
        out = attention(*mine)
        (out * shard_sequence(grad, 2, rank, size, layout)).sum().backward()
        return [out.detach()] + [t.grad for t in mine]
    return comm.simulate(run, world_size)


def _against_full(attention, world_size, seq, causal, layout="contiguous"):
    q, k, v, grad = _qkv(seq)
    expected = _full(q, k, v, grad, causal)
    results, traffic = _sharded(attention, world_size, q, k, v, grad, layout)
    for rank, got in enumerate(results):
        for name, e, g in zip(("output", "dq", "dk", "dv"), expected, got):
            mine = shard_sequence(e, 2, rank, world_size, layout)
            assert torch.allclose(g, mine, rtol=1e-9, atol=1e-11), (
                f"{name} on rank {rank} of {world_size} (S={seq}, causal={causal}, {layout}): max |diff| "
                f"{(g - mine).abs().max():.3g}")
    return traffic


def test_merge_is_softmax_over_both_blocks_even_when_their_maxima_differ():
    """Two halves of the keys, one with scores 40 higher: merge gives softmax over all keys exactly.
    Planted bug, seen failing: the parts averaged without rescaling by e^(lse_i - lse) ("max |diff| 1.41")."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    scores = q @ k.transpose(-1, -2)
    scores[..., :2] += 40.0  # very different running maxima
    expected = scores.softmax(-1) @ v

    def part(s, vv):
        lse = s.logsumexp(-1)
        return torch.exp(s - lse.unsqueeze(-1)) @ vv, lse
    o, lse = merge(*part(scores[..., :2], v[:, :2]), *part(scores[..., 2:], v[:, 2:]))
    assert torch.allclose(o, expected, atol=1e-12), f"max |diff| {(o - expected).abs().max():.3g}"
    assert torch.allclose(lse, scores.logsumexp(-1))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_attention_equals_full_attention_with_neighbour_traffic_as_the_formula(layout):
    """Outputs and gradients of q, k, v equal full attention at G = 1..4, S = 16 and 19 (uneven), causal and not;
    every message goes to the right-hand neighbour, one key/value block per rank per step (keys and values one
    message each: not stacked into a copy); elements per phase
    2(G-1)n forward, 2(G-1)n + 2Gn backward (n = b·h·S·d). Planted bugs, each seen failing: the block of the next
    step used for the causal mask (off by one block: "output on rank 0 of 2 (S=16, causal=True, contiguous): max
    |diff| 3.46"); a token masked from itself (>=: "max |diff| nan" at G = 1); the dk/dv pass left out of backward
    ("dk on rank 0 of 2 ...: max |diff| 1.52")."""
    for world_size in (1, 2, 3, 4):
        for seq in (16, 19):
            for causal in (True, False):
                traffic = _against_full(lambda q, k, v: ring_attention(q, k, v, causal, layout, seq), world_size,
                                        seq, causal, layout)
                n = B * H * seq * D
                per_phase = {}
                for t in traffic.payload:
                    assert t.dst == (t.src + 1) % world_size, f"{t} is not to the right-hand neighbour"
                    per_phase[t.phase] = per_phase.get(t.phase, 0) + t.numel
                expected = {} if world_size == 1 else {"ring kv": 2 * (world_size - 1) * n,
                                                       "ring kv (backward)": 2 * (world_size - 1) * n,
                                                       "ring dkv": 2 * world_size * n}
                assert per_phase == expected, (world_size, seq, causal)
                steps = {}
                for t in traffic.payload:
                    steps.setdefault((t.phase, t.step, t.src), []).append(t)
                assert all(len(v) == 2 and v[0].numel == v[1].numel for v in steps.values()), (
                    "each step a rank sends one block: its keys and its values (or their gradients), one message each")


def test_zigzag_balances_the_causal_work_that_the_contiguous_split_does_not():
    """Causal, S = 64 on G = 4: contiguous rank r computes r+1 blocks of (S/G)² scores (16² up to 4·16²);
    zig-zag every rank 2G+1 chunk pairs of (S/2G)². Planted bug, seen failing: the zig-zag layout giving
    rank r chunks 2r and 2r+1 (contiguous again: "[192, 448, 704, 960] == [576, 576, 576, 576]" fails)."""
    seq, world_size = 64, 4
    contiguous = [attention_work(seq, rank, world_size, "contiguous") for rank in range(world_size)]
    zigzag = [attention_work(seq, rank, world_size, "zigzag") for rank in range(world_size)]
    block, chunk = seq // world_size, seq // (2 * world_size)
    assert [w.score_elements for w in contiguous] == [(r + 1) * block * block for r in range(world_size)]
    assert [w.score_elements for w in zigzag] == [(2 * world_size + 1) * chunk * chunk] * world_size
    assert [w.skipped for w in contiguous] == [world_size - 1 - r for r in range(world_size)]
    assert [w.skipped for w in zigzag] == [2 * world_size - 1] * world_size  # of 4G chunk pairs
    assert chunk_bounds(8, 2, "zigzag") == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
    with pytest.raises(ValueError, match="needs 8 chunks of at least one token"):
        chunk_bounds(5, 4, "zigzag")


@pytest.mark.parametrize("world_size,seq,causal,layout", [(4, 64, True, "zigzag"), (4, 64, True, "contiguous"),
                                                          (3, 17, True, "zigzag"), (3, 19, False, "contiguous"),
                                                          (1, 5, True, "contiguous")])
def test_the_work_counted_is_the_work_the_ring_computes(world_size, seq, causal, layout):
    """attention_work counts, from outside the ring, what its forward computes: watched block by block
    (tests/ring_blocks.py), per rank and per step, uneven lengths included. Planted, seen failing: the count
    taking rank (r + s)'s keys at step s (the ring turning the other way) -> per-step lists differ."""
    watched = computed_per_step(world_size, seq, causal, layout)
    for rank in range(world_size):
        work = attention_work(seq, rank, world_size, layout, causal)
        assert work.per_step == watched[rank], (rank, work.per_step, watched[rank])
        assert work.score_elements == sum(watched[rank])


def test_a_strategy_counts_each_ring_call_on_its_own_rank():
    """AttentionWork.count_call, as the strategies call it around ring_attention: batch x heads in the largest
    block, the calls summed step by step."""
    def run(rank, size):
        work = AttentionWork()
        q = shard_sequence(torch.zeros(2, 3, 12, 4), 2, rank, size, "zigzag")
        for _ in range(2):
            ring_attention(q, q, q, True, "zigzag", 12)
            work.count_call(q, True, "zigzag", 12)
        return work
    works = comm.simulate(run, 2).results
    for rank, work in enumerate(works):
        one = attention_work(12, rank, 2, "zigzag")
        assert work.per_step == [2 * n for n in one.per_step] and work.computed == 2 * one.computed
        assert work.largest_block == 2 * 3 * 3 * 3  # b·h · (S/2G)²: chunks of 3 tokens


def test_ulysses_equals_full_attention_with_all_to_all_traffic_as_the_formula():
    """Outputs and gradients equal full attention at G = 1, 2, 4 (H = 4), S = 16 and 19 (uneven), causal and not;
    each of the 2 all-to-alls per direction sends (G-1)/G of b·h·S·d per tensor (4 tensors per direction).
    Heads not divisible by G (4 over 3) rejected by name. Planted bug, seen failing: the all-to-all's received
    pieces concatenated in reverse rank order ("output on rank 0 of 2 (S=16, ...): max |diff| 3.79")."""
    for world_size in (1, 2, 4):
        for seq in (16, 19):
            for causal in (True, False):
                traffic = _against_full(lambda q, k, v: ulysses_attention(q, k, v, causal, seq), world_size, seq,
                                        causal)
                per_phase = {}
                for t in traffic.payload:
                    per_phase[t.phase] = per_phase.get(t.phase, 0) + t.numel
                each = (world_size - 1) * B * seq * H * D // world_size
                expected = {} if world_size == 1 else {"ulysses qkv": 3 * each, "ulysses out": each,
                                                       "ulysses out (backward)": each,
                                                       "ulysses qkv (backward)": 3 * each}
                assert per_phase == expected, (world_size, seq)
    with pytest.raises(comm.SimulatorError, match="4 heads cannot be split over 3 ranks"):
        _sharded(lambda q, k, v: ulysses_attention(q, k, v, True, 18), 3, *_qkv(18))


def test_the_transformer_with_its_sequence_split_equals_the_dense_model():
    """The course transformer on 31 tokens (uneven over 2 and 4 ranks; zig-zag cuts 8 chunks of 3-4): logits
    gathered along the sequence equal the dense model's, and each weight's gradient summed over the ranks equals
    the dense gradient, for ring (both layouts) and Ulysses at G = 2 and 4. Chunk-local attention equals its
    one-process block-diagonal form and not the dense model. Planted bug, seen failing: the gathered logits
    concatenated in rank order instead of put back at their positions (fails at "ring zigzag", G = 2)."""
    model = tiny_transformer(seed=0)
    x, y = LanguageData().batch(0, 3)
    seq = x.shape[1]
    dense_out = model(x)
    loss_fn(dense_out, y).backward()
    dense = {n: p.grad for n, p in model.named_parameters()}
    methods = {"ring contiguous": ("contiguous", lambda q, k, v: ring_attention(q, k, v, True, "contiguous", seq)),
               "ring zigzag": ("zigzag", lambda q, k, v: ring_attention(q, k, v, True, "zigzag", seq)),
               "ulysses": ("contiguous", lambda q, k, v: ulysses_attention(q, k, v, True, seq))}
    for world_size in (2, 4):
        for name, (layout, attention) in methods.items():
            def run(rank, size):
                m = tiny_transformer(seed=0)
                local = sequence_forward(m, shard_sequence(x, 1, rank, size, layout),
                                         positions(seq, rank, size, layout), attention)
                full = gather_sequence(local, 1, seq, layout)
                loss_fn(full, y).backward()
                return full.detach(), {n: p.grad for n, p in m.named_parameters()}
            results = comm.simulate(run, world_size).results
            assert torch.allclose(results[0][0], dense_out.detach(), atol=1e-5), (name, world_size)
            for n, expected in dense.items():
                got = sum(r[1][n] for r in results)
                assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6), (name, world_size, n)

    def local(rank, size):
        logits = sequence_forward(tiny_transformer(seed=0), shard_sequence(x, 1, rank, size), positions(seq, rank,
                                                                                                       size))
        return gather_sequence(logits, 1, seq)
    chunked = comm.simulate(local, 4).results[0]
    one_process = sequence_forward(tiny_transformer(seed=0), x, torch.arange(seq), chunked_attention(4))
    assert torch.allclose(chunked, one_process, atol=1e-6)
    first_chunk = chunk_bounds(seq, 4)[0][0][1]
    assert torch.allclose(chunked[:, :first_chunk], dense_out[:, :first_chunk].detach(), atol=1e-5)
    assert (chunked[:, first_chunk:] - dense_out[:, first_chunk:]).abs().max() > 0.1  # context lost after chunk 0


def test_activations_per_rank_fall_as_one_over_g_and_full_attention_saves_the_score_matrix():
    """Bytes saved for backward by the whole transformer forward on S = 32 tokens: per rank exactly 1/G of one
    process's at G = 2, 4 (ring, both layouts, and Ulysses). One attention call: full attention saves q, k, v and
    the b·h·S² probabilities (+ the S² mask), ring attention q, k, v, o and lse — linear in S. Planted bug, seen
    failing: ring attention saving the key/value blocks it received (all of K and V, as an all-gather design
    would): "[346752, 346752] == [313984, 313984]" fails."""
    seq = 32
    x = torch.randint(16, (2, seq), generator=torch.Generator().manual_seed(0))
    for layout, attend in (("contiguous", lambda q, k, v: ring_attention(q, k, v, True, "contiguous", seq)),
                           ("zigzag", lambda q, k, v: ring_attention(q, k, v, True, "zigzag", seq)),
                           ("contiguous", lambda q, k, v: ulysses_attention(q, k, v, True, seq))):
        per_g = {}
        for world_size in (1, 2, 4):
            def run(rank, size):
                model = tiny_transformer(seed=0)
                with saved_bytes(model.parameters()) as meter:
                    sequence_forward(model, shard_sequence(x, 1, rank, size, layout),
                                     positions(seq, rank, size, layout), attend)
                return meter.bytes
            per_g[world_size] = comm.simulate(run, world_size).results
        one = per_g[1][0]
        assert per_g[2] == [one // 2] * 2 and per_g[4] == [one // 4] * 4, per_g
    for s in (16, 32, 64):
        q, k, v, _ = _qkv(s, dtype=torch.float32)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        with saved_bytes() as full:
            full_attention(q, k, v, True)
        with saved_bytes() as ring:
            ring_attention(q, k, v, True)
        qkv_bytes = 4 * B * H * s * D
        assert full.bytes == 3 * qkv_bytes + 4 * B * H * s * s + s * s, s
        assert ring.bytes == 4 * qkv_bytes + 4 * B * H * s, s


def test_megatron_sequence_parallel_block_equals_the_dense_block_with_tensor_parallel_volume():
    """Korthikanti et al.: the block with heads/MLP split and LayerNorm regions split by tokens, at t = 1, 2, 4 on
    31 tokens (uneven): output and input gradient equal the dense block's; every column/row shard's weight
    gradient equals the dense gradient's slice, and the LayerNorm weights' and row biases' gradients summed over
    ranks equal the dense ones (each rank alone has only its tokens' part). Elements moved forward equal two of
    chapter 01's ring all-reduces of b·s·h, measured; backward three (the two conjugates, and the two inputs
    all-gathered again because only the local tokens were kept: (t−1)·b·s·h each). Planted bug, seen failing:
    the reduce-scatter's backward keeping this rank's slice instead of all-gathering (input gradient differs
    at t = 2)."""
    seq, h = 31, 64
    dense = tiny_transformer(seed=0).blocks[0]
    g = torch.Generator().manual_seed(0)
    x, grad = torch.randn(B, seq, h, generator=g), torch.randn(B, seq, h, generator=g)
    x_dense = x.clone().requires_grad_()
    out = dense(x_dense)
    (out * grad).sum().backward()
    named = dict(dense.named_parameters())
    for world_size in (1, 2, 4):
        def run(rank, size):
            block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0], seq_len=seq)
            mine = shard_sequence(x, 1, rank, size).requires_grad_()
            y = block(mine)
            (y * shard_sequence(grad, 1, rank, size)).sum().backward()
            return y.detach(), mine.grad, block
        results, traffic = comm.simulate(run, world_size)
        for rank, (y, dx, block) in enumerate(results):
            assert torch.allclose(y, shard_sequence(out.detach(), 1, rank, world_size), atol=1e-5)
            assert torch.allclose(dx, shard_sequence(x_dense.grad, 1, rank, world_size), atol=1e-5), world_size
            for dense_name in ("attn.qkv", "attn.proj", "fc", "out"):
                layer = block.get_submodule(dense_name)
                expected = named[dense_name + ".weight"].grad.index_select(layer.shard_dim, layer.index)
                assert torch.allclose(layer.weight.grad, expected, atol=1e-5), (world_size, dense_name)
        for name in ("ln1.weight", "ln2.bias", "attn.proj.bias", "out.bias"):
            summed = sum(dict(r[2].named_parameters())[name].grad for r in results)
            assert torch.allclose(summed, named[name].grad, atol=1e-5), (world_size, name)
        all_reduce = comm.simulate(lambda r, n: ring_all_reduce(torch.ones(B * seq * h)), world_size).traffic.total
        sent = {d: sum(t.numel for t in traffic.payload if ("backward" in t.phase) == (d == "backward"))
                for d in ("forward", "backward")}
        gather = (world_size - 1) * B * seq * h  # every rank sends its tokens to the t − 1 others
        assert sent == {"forward": 2 * all_reduce, "backward": 2 * all_reduce + 2 * gather}, (world_size, sent)


def test_megatron_sequence_parallel_block_saves_exactly_one_t_of_the_dense_activations():
    """What one block keeps for backward (parameters excluded), b = 2, S = 32, h = 64, 4 heads, d_ff = 256, float32,
    counted by hand per token: LN1 and LN2 inputs with mean and 1/std (2h + 4), the qkv and fc inputs (2h), q, k,
    v (3h), attention's output = proj's input (h) with its log-sum-exp per head (4), the GELU's input and output
    (2·d_ff) — 1032 elements, 4 bytes each. The dense block saves that; each of t = 1, 2, 4 ranks exactly 1/t.
    Planted bug, seen failing: the gathered (b, S, h) inputs of qkv and fc saved whole (plain all-gather, then
    F.linear): "t=2: ['148,480', '148,480'] bytes, not 132,096" (and the backward traffic two all-gathers short)."""
    b, seq, h = 2, 32, 64
    per_token = (2 * h + 4) + 2 * h + 3 * h + h + 4 + 2 * 256
    dense_bytes = per_token * b * seq * 4
    x = torch.randn(b, seq, h, generator=torch.Generator().manual_seed(0))
    dense = tiny_transformer(seed=0).blocks[0]
    with saved_bytes(dense.parameters()) as meter:
        dense(x.clone().requires_grad_())
    assert meter.bytes == dense_bytes, f"dense block: {meter.bytes:,} bytes, not {dense_bytes:,}"
    for t in (1, 2, 4):
        def run(rank, size):
            block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0], seq_len=seq)
            with saved_bytes(block.parameters()) as meter:
                block(shard_sequence(x, 1, rank, size).requires_grad_())
            return meter.bytes
        held = comm.simulate(run, t).results
        assert held == [dense_bytes // t] * t, f"t={t}: {[f'{n:,}' for n in held]} bytes, not {dense_bytes // t:,}"
        assert held[0] == megatron_sp_saved_bytes(b, seq, h, 4, 256, t)


def _train_all(rank, world_size):
    config = dict(model="transformer", steps=3, global_batch=5, optimizer="sgd", lr=0.1)
    out = {}
    for strategy, options in (("ring_attention", {"layout": "zigzag"}), ("ring_attention", {"layout": "contiguous"}),
                              ("ulysses", {}), ("chunk_local", {})):
        result = train(rank, world_size, strategy, **config, **options)
        out[strategy + options.get("layout", "")] = result["records"]
    return out


def test_strategies_train_like_one_process_except_chunk_local():
    """Real ranks (one launch, 2 ranks): ring attention (zig-zag and contiguous) and Ulysses give the outputs,
    loss, gradients and parameters of strategy="single" for 3 SGD steps (every rank sees the whole batch:
    data_size 1; gradients summed over the sequence ranks); chunk-local does not (its outputs differ at step 0).
    SGD rather than Adam: Adam's first step divides by |g|, so gradients of 1e-8 (there are some) turn rounding
    into 1e-5 parameter differences. Planted bug, seen failing: gradients averaged instead of summed
    ("ring_attentionzigzag: step 0, grad 'tok_emb.weight', rank 0: ... expected -0.00565396, got -0.00282698")."""
    config = dict(model="transformer", steps=3, global_batch=5, optimizer="sgd", lr=0.1)
    reference = train(0, 1, "single", **config)["records"]
    results = coursekit.launch(_train_all, 2, timeout=120)
    for name in ("ring_attentionzigzag", "ring_attentioncontiguous", "ulysses"):
        for report in (compare(reference, [results[0][name]]),
                       compare(reference, [r[name] for r in results], check_output=False)):
            assert report.ok, f"{name}: {report.first}"
    naive = compare(reference, [results[0]["chunk_local"]])
    assert not naive.ok and naive.first.kind == "output" and naive.first.step == 0


SP_TP_CONFIG = dict(model="transformer", steps=3, global_batch=5, optimizer="sgd", lr=0.1)


def _train_sequence_tensor(rank, world_size):
    return train(rank, world_size, "sequence_tensor", **SP_TP_CONFIG)["records"]


def test_megatron_sequence_tensor_strategy_trains_like_one_process_at_degrees_1_to_4():
    """strategy="sequence_tensor" (the whole transformer: embedding reduce-scattered along the sequence, blocks on
    S/t tokens, tied head all-gathered) against strategy="single": outputs, loss, every dense gradient and the
    weights after 3 SGD steps, at t = 1 (in this process), 2, 3 (31 tokens, 4 heads, d_ff 256 and 16 words cut
    unevenly) and 4; t = 5 (more ranks than heads) and 2 tokens over 3 ranks rejected with a sentence. SGD, as
    for the sequence strategies above (Adam's first step turns 1e-8 gradient rounding into 1e-5 weights).
    Planted bugs, each seen failing: the replicated parameters' gradients not summed over the group ("t=2: step
    0, grad 'pos_emb.weight', rank 0: ... expected 0.00405074, got 0"); the position embedding of local positions
    0..S/t−1 instead of the global ones ("t=2: step 0, output, rank 0")."""
    reference = train(0, 1, "single", **SP_TP_CONFIG)["records"]
    report = compare(reference, [_train_sequence_tensor(0, 1)])
    assert report.ok, f"t=1: {report.first}"
    for world_size in (2, 3, 4):
        results = coursekit.launch(_train_sequence_tensor, world_size, timeout=120)
        for report in (compare(reference, [results[0]]), compare(reference, results, check_output=False)):
            assert report.ok, f"t={world_size}: {report.first}"
    from coursekit.parallel.sequence import SequenceTensorParallelTransformer
    with pytest.raises(comm.SimulatorError, match="n_heads 4 cannot be split over a tensor-parallel degree of 5"):
        comm.simulate(lambda r, n: SequenceTensorParallelTransformer(tiny_transformer(seed=0)), 5)
    with pytest.raises(comm.SimulatorError, match="2 tokens cannot be cut contiguous over 3 ranks"):
        comm.simulate(lambda r, n: SequenceTensorParallelTransformer(tiny_transformer(seed=0))(
            torch.zeros(1, 2, dtype=torch.long)), 3)


def _train_sequence_data(rank, world_size):
    result = train(rank, world_size, "sequence_data", sp=2, count_traffic=True, **SP_TP_CONFIG)
    return result["records"], result["traffic"], result["numel"]


def test_sequence_times_data_on_a_2x2_mesh_trains_like_one_process_gradients_reduced_once():
    """Mesh({"dp": 2, "sp": 2}) on 4 real ranks: the batch of 5 cut 3 + 2 along dp, each sequence of 31 tokens cut
    zig-zag along sp with ring attention, each rank's loss on its own tokens. Outputs (one rank per data slice),
    loss, gradients and weights after 3 SGD steps equal strategy="single". Per step, over all ranks, with b_i the
    slices, n = S·h per sample, Ψ the parameters (counted here by hand): sp carries ring attention's 2(G−1)n
    forward + (4G−2)n backward per layer per sample, and no logits; the gradients go once around a ring of the
    D·G = 4 ranks (Ψ divisible by 4: each rank sends 2·3/4·Ψ to the next), whose links 0→1 and 2→3 stay inside a
    slice (sp) and 1→2, 3→0 change both coordinates (dp×sp); nothing travels along dp alone.
    Planted bugs, each seen failing: the combined all-reduce not divided by D ("step=0, kind='grad',
    name='tok_emb.weight' ... expected=-0.00565, got=-0.01131"); divided by D·G ("got=-0.00283"); the old two
    all-reduces, sum over sp then mean over dp (same gradients; traffic "{'dp': 1257984, 'sp': 1734144,
    'dp×sp': 0}" against "{'dp': 0, 'sp': 1419648, 'dp×sp': 943488}"); the logits gathered again for the loss
    ("{'sp': 1427088} != {'sp': 1419648}": 3 steps × 5 samples × (G−1)·S·V = 7440 more); the record's gather of
    the logits counted as traffic (the same 7440 more)."""
    from coursekit.parallel.sequence import sequence_data_traffic, traffic_per_axis
    from coursekit.comm.traffic import Traffic

    reference = train(0, 1, "single", **SP_TP_CONFIG)["records"]
    results = coursekit.launch(_train_sequence_data, 4, timeout=120)
    records = [r[0] for r in results]
    for report in (compare(reference, [records[0], records[2]]), compare(reference, records, check_output=False)):
        assert report.ok, report.first
    traffic = Traffic.merge([r[1] for r in results])
    psi, samples, steps = results[0][2], 5, 3
    D, G, S, h, layers = 2, 2, 31, 64, 2
    assert psi % (D * G) == 0
    per_link = 2 * (D * G - 1) * psi // (D * G)   # one rank's sends in the ring all-reduce of Ψ over D·G ranks
    sp = steps * (samples * layers * (2 * (G - 1) + 4 * G - 2) * S * h + 2 * per_link)
    both = steps * 2 * per_link
    counted = traffic_per_axis(traffic, {"dp": D, "sp": G})
    assert counted == {"dp": 0, "sp": sp, "dp×sp": both}, counted
    assert sequence_data_traffic(samples, S, h, layers, psi, D, G) == {"dp": 0, "sp": sp // steps,
                                                                        "dp×sp": both // steps}
    crossing = {t.phase for t in traffic.payload if t.src // G != t.dst // G}
    assert crossing == {"reduce-scatter", "all-gather"}, crossing  # chapter 01's ring, nothing else
    assert sorted({(t.src, t.dst) for t in traffic.payload if t.src // G != t.dst // G}) == [(1, 2), (3, 0)]


def test_sequence_data_traffic_formula_at_other_shapes():
    """The formula's gradient terms by hand where the ring's links differ: D = 3, G = 1 (every link along dp),
    D = 1, G = 3 (every link along sp) and D = 2, G = 3 (links 2→3 and 5→0 cross both axes), Ψ = 10 not divisible
    by 6 (rank r sends 2Ψ − len((r+1) % 6) − len((r+2) % 6), segments 2, 2, 2, 2, 1, 1)."""
    from coursekit.parallel.sequence import sequence_data_traffic

    assert sequence_data_traffic(3, 4, 2, 1, 12, 3, 1) == {"sp": 0, "dp": 2 * 2 * 12, "dp×sp": 0}
    ring = 3 * 1 * (2 * 2 + 10) * 4 * 2
    assert sequence_data_traffic(3, 4, 2, 1, 12, 1, 3) == {"sp": ring + 2 * 2 * 12, "dp": 0, "dp×sp": 0}
    sent = [20 - a - b for a, b in ((2, 2), (2, 2), (2, 1), (1, 1), (1, 2), (2, 2))]
    assert sequence_data_traffic(3, 4, 2, 1, 10, 2, 3) == {"sp": ring + sum(sent) - sent[2] - sent[5], "dp": 0,
                                                           "dp×sp": sent[2] + sent[5]}


def test_traffic_per_axis_names_every_axis_a_message_crossed():
    """Hand-built messages on Mesh({"dp": 2, "sp": 2}) (rank = 2·dp + sp): 0→1 along sp, 0→2 along dp, 1→2 and
    3→0 change both coordinates ("dp×sp"); control traffic is not counted. On {"dp": 2, "sp": 2, "tp": 2} a message
    0→3 changes sp and tp ("sp×tp"), 0→7 all three. Planted bug, seen failing: a message across both axes counted
    under the first axis that differs ("{'dp': 1007, ..., 'dp×sp': 0} == {'dp': 7, ..., 'dp×sp': 1000}")."""
    from coursekit.parallel.sequence import traffic_per_axis
    from coursekit.comm.traffic import Traffic, Transfer

    def sent(*links, kind="payload"):
        return [Transfer("x", 0, src, dst, numel, 4, kind) for src, dst, numel in links]

    traffic = Traffic(sent((0, 1, 3), (0, 2, 7), (1, 2, 100), (3, 0, 900)) + sent((0, 2, 50), kind="control"))
    assert traffic_per_axis(traffic, {"dp": 2, "sp": 2}) == {"dp": 7, "sp": 3, "dp×sp": 1000}
    assert traffic_per_axis(Traffic(sent((0, 3, 5), (0, 7, 11), (0, 1, 2))), {"dp": 2, "sp": 2, "tp": 2}) == \
        {"dp": 0, "sp": 0, "tp": 2, "dp×sp×tp": 11, "sp×tp": 5}
    assert traffic_per_axis(Traffic(), {"dp": 2, "sp": 2}) == {"dp": 0, "sp": 0, "dp×sp": 0}


def test_docstring_examples_run():
    import doctest

    from coursekit.parallel.sequence import core, layout, work
    for module in (core, layout, work):
        failures, tried = doctest.testmod(module)
        assert tried > 0 and failures == 0, module.__name__
