"""The cost model's communication per step equals what this course's strategies count when they run (issue 27, §2).

Two kinds of evidence: the chapters' own traffic formulas, which their tests prove equal to the counted
traffic (``coursekit.measure.memory.comm_elements`` in tests/test_parallel_data.py, ``expected_counts`` in
tests/test_parallel_tensor.py, ``megatron_sp_traffic``, ``ulysses_traffic``, ``sequence_data_traffic`` in
tests/test_parallel_sequence.py), checked at 2-4 ranks on the course transformer; and one launch of 2 ranks
that runs ZeRO-1, ZeRO-3, tensor, pipeline, ring-attention and Ulysses training steps and counts what was sent
(the sequence strategies gather no logits: each rank's loss is on its own tokens).

Planted and seen failing: the all-reduce's 2(G−1)/G as (G−1)/G (every dp, tp and sp check, e.g. "dp at
G = 2, ZeRO-0: predicted 209664 bytes per GPU, chapter 02 counts 419328"); the interleaved pipeline's
boundaries not multiplied by v; Ulysses' four all-to-alls as three; ring attention's backward (4G−2)·n as
(4G−3)·n in sequence_data_traffic ("AssertionError: (1, 2)").
"""

import pytest

import coursekit
import coursekit.parallel.pipeline  # noqa: F401  (registers "pipeline")
from coursekit.costmodel import Layout, ModelConfig, communication_bytes, step_collectives
from coursekit.measure.memory import comm_elements
from coursekit.models import tiny_transformer
from coursekit.parallel.sequence import megatron_sp_traffic, sequence_data_traffic, ulysses_traffic
from coursekit.parallel.tensor import expected_counts
from coursekit.train import train
from coursekit.comm.traffic import Traffic

COURSE = ModelConfig.course()
PSI = sum(p.numel() for p in tiny_transformer().parameters())   # 104,832: divisible by 2, 3 and 4
S, H, V, L = 31, 64, 16, 2        # the course data's tokens per sample; d_model, vocabulary, layers


def test_the_course_model_is_the_configs_shape():
    assert PSI == 104_832 and (COURSE.hidden, COURSE.vocab, COURSE.layers) == (H, V, L)


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_dp_and_zero_equal_chapter_02s_formula(world_size, zero):
    """comm_elements counts over all ranks; Ψ divides by G here, so one rank sends 1/G of it."""
    predicted = communication_bytes(COURSE, Layout(dp=world_size, zero=zero), micro_batch=2, bytes_per_element=4).dp
    counted = comm_elements(PSI, world_size, zero) // world_size * 4
    assert predicted == counted, (f"dp at G = {world_size}, ZeRO-{zero}: predicted {predicted:.0f} bytes per GPU, "
                                  f"chapter 02 counts {counted}")


def test_zero_2_and_3_communicate_in_every_backward():
    """With m micro-batches: ZeRO-2 reduce-scatters each backward and all-gathers once, (m + 1)(G−1)/G·Ψ;
    ZeRO-3 also all-gathers before each forward and backward, 3m(G−1)/G·Ψ (plain dp and ZeRO-1: 2(G−1)/G·Ψ)."""
    m, G = 3, 4
    sent = {z: communication_bytes(COURSE, Layout(dp=G, zero=z, micro_batches=m), 1, 1).dp for z in range(4)}
    assert sent == {0: 2 * 3 * PSI / 4, 1: 2 * 3 * PSI / 4, 2: (m + 1) * 3 * PSI / 4, 3: 3 * m * 3 * PSI / 4}


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("gathered", [False, True])
def test_tp_equals_the_collectives_tensor_parallelism_counts(tp, gathered):
    """expected_counts: per layer 2 all-reduces of b·s·h each way, the embedding's and the head's, the loss's 3
    of b·s (or the logits all-gathered); a ring all-reduce of N sends 2(t−1)/t·N per GPU, an all-gather
    (t−1)/t·N."""
    b = 5
    counts = expected_counts(b, S, H, L, tp, vocab=V, gathered_logits=gathered)
    share = (tp - 1) / tp
    counted = sum(n * (2 * share if op == "all_reduce" else share) for (op, _), n in counts.elements.items())
    predicted = communication_bytes(COURSE, Layout(tp=tp), b, 1, seq_len=S, vocab_parallel_loss=not gathered).tp
    assert predicted == pytest.approx(counted, rel=1e-12), f"tp = {tp}: predicted {predicted}, counted {counted}"


def test_megatron_sequence_parallel_block_equals_chapter_06s():
    """One block's 2 all-gathers + 2 reduce-scatters forward and 6 backward (its inputs gathered again):
    the difference between the model with 2 layers and with 1, less the block's 6h replicated parameters'
    gradient all-reduce (2 LayerNorms, 2 row-parallel biases)."""
    b, t = 3, 4
    block = megatron_sp_traffic(b, 32, H, t)
    per_gpu = (block["forward"] + block["backward"]) / t
    two, one = (communication_bytes(ModelConfig.course(n_layers=n), Layout(tp=t, sequence_parallel=True), b, 1,
                                    seq_len=32).tp for n in (2, 1))
    assert two - one - 2 * (t - 1) / t * 6 * H == per_gpu
    plain = communication_bytes(COURSE, Layout(tp=t), b, 1, seq_len=32).tp
    assert two > plain, "sequence parallelism sends more than tensor parallelism (the re-gathered inputs)"


@pytest.mark.parametrize("dp,sp", [(1, 2), (2, 2), (1, 4), (2, 4), (3, 2)])
def test_ring_attention_with_data_parallelism_equals_chapter_06s_formula(dp, sp):
    """sequence_data_traffic (over all ranks) = dp·sp GPUs × what one sends; 2 samples per dp slice; no logits
    gathered (the course's strategies take each rank's loss on its own tokens). The gradients: the course
    all-reduces them once over the dp·sp ranks of the flattened group, and so does the cost model when dp > 1
    (booked under dp, the sp axis then carrying attention only); sequence_data_traffic with no layers counts
    that ring alone, so the gradients and the attention are compared apart.

    Planted bug, seen failing: the dp×sp all-reduce over dp ranks only ("dp = 2, sp = 2: the gradients' ring
    sends 628992 elements in all, the cost model 419328").
    """
    b = 2
    layout = Layout(dp=dp, sp=sp)
    predicted = communication_bytes(COURSE, layout, b, 1, seq_len=32)
    counted = sum(sequence_data_traffic(b * dp, 32, H, L, PSI, dp, sp).values())
    gradients = sum(sequence_data_traffic(b * dp, 32, H, 0, PSI, dp, sp).values())   # no layers: the ring alone
    world = dp * sp
    model_gradients = (predicted.dp if dp > 1 else sum(r.sent for r in step_collectives(COURSE, layout, b, seq_len=32)
                                                        if r.op == "all_reduce")) * world
    assert model_gradients == gradients, (f"dp = {dp}, sp = {sp}: the gradients' ring sends {gradients} elements "
                                          f"in all, the cost model {model_gradients:.0f}")
    assert (predicted.dp + predicted.sp) * world == counted, (dp, sp, (predicted.dp + predicted.sp) * world, counted)


def test_data_and_sequence_gradients_are_one_all_reduce_except_under_zero():
    """dp > 1 and sp > 1: one all-reduce row over dp·sp ranks spanning both axes, none along sp; with ZeRO the
    states are sharded over dp only, so the sp sum stays its own all-reduce beside ZeRO's dp collectives."""
    rows = step_collectives(COURSE, Layout(dp=2, sp=4), 2, seq_len=32)
    reduces = [(r.axis, r.group, r.axes) for r in rows if r.op == "all_reduce"]
    assert reduces == [("dp", 8, ("sp", "dp"))], reduces
    rows = step_collectives(COURSE, Layout(dp=2, sp=4, zero=1), 2, seq_len=32)
    assert [(r.axis, r.group) for r in rows if r.what.startswith("gradients")] == [("dp", 2), ("sp", 4)]


@pytest.mark.parametrize("sp", [2, 4])
def test_ulysses_equals_chapter_06s_formula(sp):
    """Per layer ulysses_traffic's 4 all-to-alls each way, then the gradients summed (no logits gathered)."""
    b = 3
    per_layer = ulysses_traffic(b, 32, H, sp)
    gradients = 2 * (sp - 1) * PSI
    counted = L * (per_layer["forward"] + per_layer["backward"]) + gradients
    predicted = communication_bytes(COURSE, Layout(sp=sp), b, 1, seq_len=32, attention="ulysses").sp
    assert predicted * sp == counted, f"Ulysses at G = {sp}: {predicted * sp} predicted over all ranks, {counted}"


def test_interleaved_pipeline_counts_v_times_the_boundaries():
    """p = 4 stages of v = 2 chunks: 7 boundaries; a middle rank sends 2v activations or gradients of b·s·h
    per micro-batch, m of them; untied, so no embedding gradient (tied: + V·h for the first and last stage)."""
    b, m = 2, 4
    config = ModelConfig.course(tie_weights=False, n_layers=8)
    sent = communication_bytes(config, Layout(pp=4, chunks=2, micro_batches=m, schedule="interleaved"), b, 1,
                               seq_len=S).pp
    expected = 2 * 2 * m * b * S * H
    assert sent == expected, (f"interleaved p = 4, v = 2: {sent:.0f} elements from a middle stage, expected "
                              f"2v·m·b·s·h = {expected} (each rank holds v chunks)")
    rows = step_collectives(ModelConfig.course(), Layout(pp=2, micro_batches=m), b, seq_len=S)
    assert [(r.op, r.numel, r.count) for r in rows] == [("send", b * S * H, m), ("all_reduce", V * H, 1)]


def test_with_pipelining_tp_and_sp_count_one_stages_layers():
    """GPT-3 on tp = 8 × pp = 8: a stage holds 12 of the 96 layers; the last (the busiest: head and loss, no
    embedding) all-reduces 2·12 times forward, 2·12 + 1 backward, and the loss's 3 of b·s, per micro-batch;
    sp's ring passes happen in those 12 layers only."""
    gpt3, b, m = ModelConfig.gpt3_175b(), 1, 4
    n, share = b * 2048 * 12288, 2 * 7 / 8
    tp = communication_bytes(gpt3, Layout(tp=8, pp=8, micro_batches=m), b).tp
    expected = m * (49 * n + 3 * b * 2048) * share * 2
    assert tp == pytest.approx(expected, rel=1e-12), f"tp {tp:.4g} bytes, expected {expected:.4g}: 12 layers a stage"
    rows = step_collectives(gpt3, Layout(pp=8, sp=2, micro_batches=m), b)
    assert [r.count for r in rows if r.axis == "sp" and r.op == "send"] == [12 * m, 12 * m, 12 * m]


# ----------------------------------------------------------------------------- counted while training
STRATEGIES = {"zero1": {}, "zero3": {}, "tensor": {}, "sequence_tensor": {},
              "pipeline": {"schedule": "1f1b", "micro_batches": 2}, "ring_attention": {}, "ulysses": {}}
BATCH = 4


def _count(rank, world_size):
    out = {}
    for name, options in STRATEGIES.items():
        result = train(rank, world_size, name, model="transformer", steps=1, global_batch=BATCH, count_traffic=True,
                       record=False, **options)
        out[name] = (result["traffic"], result.get("tp_all_reduce_forward_elements", 0)
                     + result.get("tp_all_reduce_backward_elements", 0))
    return out


@pytest.fixture(scope="module")
def counted():
    """One launch of 2 ranks, one step of each strategy, every message counted (about 15 s on 2 busy cores)."""
    results = coursekit.launch(_count, 2, timeout=120)
    return {name: (Traffic.merge([results[r][name][0] for r in range(2)]), results[0][name][1])
            for name in STRATEGIES}


def test_counted_while_training_equals_the_prediction(counted):
    """Elements (fp32: bytes_per_element=1 counts elements): ZeRO's and the pipeline's per rank, tensor
    parallelism's all-reduced elements × 2(t−1)/t, sequence parallelism's over both ranks (31 tokens split 16 +
    15: the ranks send unequal shares, their sum is exact)."""
    def predict(layout, batch, **assumptions):
        return communication_bytes(COURSE, layout, batch, 1, seq_len=S, **assumptions)

    for zero in (1, 3):
        assert counted[f"zero{zero}"][0].sent == {r: predict(Layout(dp=2, zero=zero), BATCH // 2).dp for r in (0, 1)}
    assert counted["tensor"][1] * 2 * (2 - 1) / 2 == predict(Layout(tp=2), BATCH).tp
    pipeline = counted["pipeline"][0].sent
    assert max(pipeline.values()) == predict(Layout(pp=2, micro_batches=2), BATCH // 2).pp, pipeline
    for name, attention in (("ring_attention", "ring"), ("ulysses", "ulysses")):
        sp = predict(Layout(sp=2), BATCH, attention=attention).sp  # each rank's loss on its own tokens
        assert counted[name][0].total == 2 * sp, f"{name}: counted {counted[name][0].total}, predicted {2 * sp}"


def test_counted_megatron_sequence_parallelism_equals_the_prediction(counted):
    """"sequence_tensor" at t = 2: what went through chapter 01's counter (the layers' all-gathers and
    reduce-scatters, the embedding's reduce-scatter, the head's gather, the replicated gradients' ring
    all-reduce) over both ranks = 2 × the prediction less the loss's 3 all-reduces of b·s (torch's all_reduce,
    not counted there), plus the course's position embedding (64 × 64): the course adds positions after the
    scatter, so their gradient is summed too (Megatron-LM adds them before it)."""
    t = 2
    rows = step_collectives(COURSE, Layout(tp=t, sequence_parallel=True), BATCH, seq_len=S)
    through_comm = sum(r.sent for r in rows if r.what != "vocabulary-parallel cross-entropy")
    positions = 2 * (t - 1) * 64 * H
    total = counted["sequence_tensor"][0].total
    assert total == t * through_comm + positions, (
        f"sequence_tensor: {total} elements counted, predicted {t * through_comm + positions:.0f} (layers, "
        f"embedding, head, replicated gradients); a difference of k·{BATCH * S * H} is k all-gathers or "
        f"reduce-scatters of b·s·h")
