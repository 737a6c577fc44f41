"""Sequence parallelism's memory against plain tensor parallelism at the same t (issue 26 §3; Korthikanti et al. 2022).

What one block of the course transformer saves for backward per rank (parameters excluded), measured with
chapter 06's ``saved_bytes``: the dense block in this process, chapter 05's ``ParallelBlock`` (plain tensor
parallelism: its all-reduces are ``torch.distributed``'s, so on real ranks) and chapter 06's Megatron-style
``SequenceTensorParallelBlock`` (on ``comm.simulate``'s ranks), at t = 2 and 4. Chapter 06's block sizes
(tools/notebook_src/06_sequence_parallelism.py, section 7): b = 2, S = 32, h = 64, a = 4, d_ff = 256, fp32.
Every expected number is counted here per token from those sizes, term by term -- never read off the code.
"""

from fractions import Fraction

import pytest
import torch

import coursekit
from coursekit import comm
from coursekit.costmodel import activation_bytes_per_layer
from coursekit.comm.mesh import Mesh
from coursekit.models import tiny_transformer
from coursekit.parallel.sequence import (SequenceTensorParallelBlock, megatron_sp_saved_bytes, saved_bytes,
                                         shard_sequence)
from coursekit.parallel.tensor import ParallelBlock, korthikanti_table2_bytes, tensor_parallel_saved_bytes

B, S, H, A, FF, FP32 = 2, 32, 64, 4, 256, 4


def _per_token(t: int, sequence_parallel: bool) -> Fraction:
    """Elements one rank keeps per token of the whole sequence, counted term by term."""
    norms = 2 * H + 2 * 2           # LN1 and LN2: their inputs, their mean and 1/std
    column_inputs = 2 * H           # qkv's and fc's inputs: the norms' outputs, read whole
    heads = 3 * H + H + A           # q, k, v; attention's output (proj's input); one log-sum-exp per head
    mlp = 2 * FF                    # the GELU's input and output (out's input)
    around = norms + column_inputs  # the regions plain tensor parallelism leaves whole on every rank
    return Fraction(around, t if sequence_parallel else 1) + Fraction(heads + mlp, t)


def _dense_saved(x):
    dense = tiny_transformer(seed=0).blocks[0]
    with saved_bytes(dense.parameters()) as meter:
        dense(x.clone().requires_grad_())
    return meter.bytes


def _plain_tp_saved(rank, world_size, x):
    """On 4 real ranks: chapter 05's block over the ``tp`` axis of a 2 x 2 mesh (t = 2), then over all 4."""
    mesh = Mesh({"dp": 2, "tp": 2})
    held = {}
    for t, group in ((2, mesh.group("tp")), (4, None)):
        block = ParallelBlock(tiny_transformer(seed=0).blocks[0], group)
        with saved_bytes(block.parameters()) as meter:
            block(x.clone().requires_grad_())
        held[t] = meter.bytes
    return held


def _sp_tp_saved(rank, size, x):
    block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0], seq_len=x.shape[1])
    with saved_bytes(block.parameters()) as meter:
        block(shard_sequence(x, 1, rank, size).requires_grad_())
    return meter.bytes


def test_plain_tensor_parallelism_replicates_the_norm_regions_and_sequence_parallelism_splits_them():
    """Bytes per rank, exactly the count per token: dense 1032 elements; plain TP 4h + 4 = 260 whole plus
    (4h + 2·d_ff + a)/t split -- 646 at t = 2, 453 at t = 4; TP + SP all of it /t -- 516 and 258 (the issue's
    numbers, which hold at chapter 06's sizes). So at t = 4 sequence parallelism keeps 258/453 = 57% of plain
    TP's, and plain TP's share of the dense block tends to 260/1032 = 25%, not 0, however large t grows.
    Planted bugs, each seen failing: chapter 05's attention unfused (softmax(q kᵀ) v, the scores of this
    rank's heads kept: "plain TP, t = 2, rank 0: 182,272 bytes, not 165,376"); tensor_parallel_saved_bytes
    dividing the replicated part by t too ("t = 2: formula 132,096, count 165,376"), or leaving out the norms'
    statistics ("formula 164,352, count 165,376"); the SP block's inputs of qkv and fc kept whole (plain
    all-gather, then F.linear: "TP + SP, t = 2: ['148,480', '148,480'] bytes, not 132,096")."""
    x = torch.randn(B, S, H, generator=torch.Generator().manual_seed(0))
    tokens = B * S
    expected = {(t, sp): int(_per_token(t, sp) * tokens * FP32) for t in (2, 4) for sp in (False, True)}
    assert [_per_token(t, sp) for t in (2, 4) for sp in (False, True)] == [646, 516, 453, 258]
    dense = int(_per_token(1, False) * tokens * FP32)
    assert _dense_saved(x) == dense == 1032 * tokens * FP32, f"dense block: {_dense_saved(x):,} bytes, not {dense:,}"

    plain = coursekit.launch(_plain_tp_saved, 4, x, timeout=240)
    for t in (2, 4):
        for rank, held in enumerate(plain):
            assert held[t] == expected[t, False], (f"plain TP, t = {t}, rank {rank}: {held[t]:,} bytes, not "
                                                   f"{expected[t, False]:,}")
        formula = tensor_parallel_saved_bytes(B, S, H, A, FF, t)
        assert formula == expected[t, False], f"t = {t}: formula {formula:,}, count {expected[t, False]:,}"
        sp = comm.simulate(_sp_tp_saved, t, x).results
        assert sp == [expected[t, True]] * t, (f"TP + SP, t = {t}: {[f'{n:,}' for n in sp]} bytes, not "
                                               f"{expected[t, True]:,}")
        assert megatron_sp_saved_bytes(B, S, H, A, FF, t) == expected[t, True]
        assert tensor_parallel_saved_bytes(B, S, H, A, FF, 1) == dense == expected[t, True] * t


@pytest.mark.parametrize("s, b, h, a", [(32, 2, 64, 4), (2048, 1, 12288, 96)], ids=["course", "gpt3"])
def test_table_2_forms_as_the_paper_writes_them(s, b, h, a):
    """korthikanti_table2_bytes = sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)), sbh(34/t + 5as/(ht)), evaluated
    here in exact fractions at t = 1, 2, 4, 8; at t = 1 all three are one layer unsplit; the coursekit cost
    model's activation_bytes_per_layer (16-bit, dropout, no recomputation) gives the same numbers.
    Planted bug, seen failing: the tensor-parallel row's 24 left undivided ("s=32, t = 2: tensor 159744, the
    paper's form 110592")."""
    sbh = Fraction(s * b * h)
    for t in (1, 2, 4, 8):
        if a % t:
            continue
        forms = {"dense": sbh * (34 + Fraction(5 * a * s, h)),
                 "tensor": sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)),
                 "sequence_tensor": sbh * (Fraction(34, t) + Fraction(5 * a * s, h * t))}
        got = korthikanti_table2_bytes(b, s, h, a, t)
        for row, form in forms.items():
            assert got[row] == form, f"s={s}, t = {t}: {row} {got[row]}, the paper's form {form}"
        model = {"tensor": activation_bytes_per_layer(s, b, h, a, tp=t).total,
                 "sequence_tensor": activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=True).total}
        assert {k: got[k] for k in model} == model
    assert len(set(korthikanti_table2_bytes(b, s, h, a, 1).values())) == 1


def test_the_course_count_is_table_2_less_scores_and_masks_plus_norm_statistics_and_log_sum_exp():
    """At 2 bytes an element and d_ff = 4h the course's count and the paper's differ by exactly the named terms:
    Table 2 − the 2 dropout masks after the row-parallel layers (sbh bytes each; whole under plain TP, /t with
    SP) − the 5as²b bytes of scores, softmax dropout and its mask (/t) + the norms' mean and 1/std (4 values a
    token, whole or /t) + the a log-sum-exps a token (/t), 2 bytes each. At t = 2 and 4, plain and with SP.
    Planted bugs, seen failing: the norms' statistics left out of tensor_parallel_saved_bytes ("AssertionError:
    1 ... 131584 == 132096"); its replicated part divided by t ("2 ... 66048 == 82688")."""
    s, b, h, a = S, B, H, A
    sbh, sb = s * b * h, s * b
    for t in (1, 2, 4):
        paper = korthikanti_table2_bytes(b, s, h, a, t)
        masks, scores, stats, lse = 2 * sbh, 5 * a * s * s * b // t, 2 * 4 * sb, 2 * a * sb // t
        plain = paper["tensor"] - masks - scores + stats + lse
        assert tensor_parallel_saved_bytes(b, s, h, a, 4 * h, t, itemsize=2) == plain, t
        split = paper["sequence_tensor"] - masks // t - scores + stats // t + lse
        assert megatron_sp_saved_bytes(b, s, h, a, 4 * h, t, itemsize=2) == split, t


def test_uneven_shares_are_refused():
    """t must divide the heads and the MLP width (the paper's forms: the heads and the width)."""
    with pytest.raises(ValueError, match="heads"):
        tensor_parallel_saved_bytes(B, S, H, 3, FF, 2)
    with pytest.raises(ValueError, match="MLP width"):
        tensor_parallel_saved_bytes(B, S, H, A, 250, 4)
    with pytest.raises(ValueError, match="divide the heads"):
        korthikanti_table2_bytes(B, S, H, 6, 4)


def test_doctests():
    """The examples in coursekit/parallel/tensor/activations.py run as written.
    Planted bug, seen failing: the module example's 646 changed to 516 ("1 failed of 3")."""
    import doctest

    from coursekit.parallel.tensor import activations
    failures, tried = doctest.testmod(activations)
    assert tried == 3 and failures == 0, f"{failures} failed of {tried}"
