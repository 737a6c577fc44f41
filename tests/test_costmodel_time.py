"""The cost model's time half: FLOPs against Narayanan et al. 2021's published figures, compute and bubble time,
communication times through chapter 01's network model on the right link, and the step time's sum.

Sources: Korthikanti et al. 2022 Table 5 (at its test); Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM" (arXiv:2104.04473): Table 1 (models of 1.7 B to
1008 B parameters, V = 51,200, s = 2,048; per-GPU throughput), eq. 2 (P = 12lh²(1 + 13/(12h) + (V + s)/(12lh))),
eq. 3 (F = 96Bslh²(1 + s/(6h) + V/(16lh)) per iteration with recomputation), eq. 4 and section 5.1 (8TP/(nX):
GPT-3 175 B, 300 B tokens, 1,024 A100s at 140 TFLOP/s per GPU, batch 1,536 -> 34 days; 1 T parameters, 450 B
tokens, 3,072 A100s at 163 TFLOP/s per GPU, 502 PFLOP/s aggregate -> 84 days). (163 TFLOP/s and 502 PFLOP/s
are the 1 T model's, not GPT-3's.)

Planted and seen failing: full recomputation's 96 as 72 (the extra forward left out: "Megatron 25600x128,
recompute='full': 0.7503 of eq. 3's 96·B·s·L·h²(...)", "26.1 days, paper 34"); no recomputation as 96;
attention's 12·L·s·h as 6·L·s·h ("175B: 50.71% model FLOPs utilisation, Table 5 51.4%"); the bubble as
f·compute instead of f/(1 − f)·compute; the all-reduce's 2(G−1) steps as G−1; tp not innermost on the mesh.
"""

import pytest

from coursekit.costmodel import (Hardware, Layout, ModelConfig, axis_network, bubble_fraction, communication_time,
                                 compute_flops, compute_time, group_network, step_collectives, step_time)
from coursekit.costmodel import num_params
from coursekit.models import tiny_transformer
from coursekit.parallel.pipeline import bubble_formula

DAY = 86_400
# Narayanan et al. 2021, Table 1: (parameters in billions, heads, hidden, layers); V = 51,200, s = 2,048
TABLE_1 = [(1.7, 24, 2304, 24), (18.4, 48, 6144, 40), (145.6, 96, 12288, 80), (310.1, 128, 16384, 96),
           (529.6, 128, 20480, 105), (1008.0, 160, 25600, 128)]


def _megatron(heads, hidden, layers):
    return ModelConfig(51200, 2048, hidden, layers, heads, name=f"Megatron {hidden}x{layers}")


@pytest.mark.parametrize("billions,heads,hidden,layers", TABLE_1)
def test_parameters_and_flops_equal_narayanan_table_1_and_eq_3(billions, heads, hidden, layers):
    """P rounds to Table 1's count; the FLOPs of one sequence equal eq. 3 (96, with recomputation) and its
    no-recomputation form (72, V/(12hL)) to 0.3%: eq. 3 counts matmuls only (12Lh² + Vh), P here also the
    biases, LayerNorms and positions."""
    config = _megatron(heads, hidden, layers)
    assert round(num_params(config).total / 1e9, 1) == billions
    B, s, h, L, V = 1, 2048, hidden, layers, 51200
    for recompute, k, d in (("none", 72, 12), ("full", 96, 16)):
        paper = k * B * s * L * h * h * (1 + s / (6 * h) + V / (d * h * L))
        ours = compute_flops(config, B * s, recompute).total
        assert ours == pytest.approx(paper, rel=3e-3), (
            f"{config.name}, recompute={recompute!r}: {ours / paper:.4f} of eq. 3's {k}·B·s·L·h²(...)")


@pytest.mark.parametrize("config,tokens,gpus,per_gpu,days", [
    (_megatron(96, 12288, 96), 300e9, 1024, 140e12, 34),      # GPT-3 175 B (V = 51,200 as the paper runs it)
    (_megatron(160, 25600, 128), 450e9, 3072, 163e12, 84)])   # the 1 T model
def test_training_days_equal_narayanan_section_5_1(config, tokens, gpus, per_gpu, days):
    """The paper's 8TP/(nX) rounds eq. 3 (drops s/(6h) and V/(16lh)): ours, the full eq., is within 3%."""
    seconds = compute_flops(config, tokens, "full").total / (gpus * per_gpu)
    assert seconds / DAY == pytest.approx(days, rel=0.03), f"{config.name}: {seconds / DAY:.1f} days, paper {days}"
    assert 8 * tokens * num_params(config).total / (gpus * per_gpu) / DAY == pytest.approx(days, abs=0.5)


# Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198):
# Table 3 (heads, hidden, layers, GPUs, global batch; s = 2,048, V = 51,200, A100 at 312 TFLOP/s) and Table 5
# (seconds per iteration with sequence parallelism + selective recomputation, model FLOPs utilisation in %)
TABLE_5 = [("22B", 64, 6144, 48, 8, 4, 1.10, 41.5), ("175B", 96, 12288, 96, 64, 64, 13.75, 51.4),
           ("530B", 128, 20480, 105, 280, 280, 37.83, 56.0), ("1T", 160, 25600, 128, 512, 512, 71.49, 56.3)]


@pytest.mark.parametrize("name,heads,hidden,layers,gpus,batch,seconds,mfu", TABLE_5)
def test_model_flops_equal_korthikanti_table_5_utilisation(name, heads, hidden, layers, gpus, batch, seconds, mfu):
    """Model FLOPs (no recomputation counted, their eq. 7 = Narayanan's 72 form) / (GPUs · 312 TFLOP/s · the
    measured iteration time) is the MFU they publish, to 0.25 points (the times are given to 3-4 digits)."""
    flops = compute_flops(_megatron(heads, hidden, layers), batch * 2048, "none").total
    ours = 100 * flops / (gpus * 312e12 * seconds)
    assert ours == pytest.approx(mfu, abs=0.25), f"{name}: {ours:.2f}% model FLOPs utilisation, Table 5 {mfu}%"


def test_6pt_is_six_times_the_course_models_parameters():
    """The dense part is 6·P·T with P the course transformer's own numel(); attention 12·L·s·h per token."""
    model, config = tiny_transformer(), ModelConfig.course()
    flops = compute_flops(config, tokens=1000)
    assert flops.dense == 6 * sum(p.numel() for p in model.parameters()) * 1000
    assert flops.attention == 12 * 2 * 64 * 64 * 1000 and flops.recompute == 0
    selective = compute_flops(config, tokens=1000, recompute="selective")
    assert selective.recompute == 4 * 2 * 64 * 64 * 1000, "selective: attention's forward again"
    with pytest.raises(ValueError, match="recompute must be one of"):
        compute_flops(config, 1, recompute="some")


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 8, 8, 1), ("interleaved", 4, 8, 2),
                                            ("zb_h1", 4, 4, 1)])
def test_compute_time_and_the_bubble(schedule, p, m, v):
    """compute = FLOPs / gpus / (peak · efficiency); a rank idle f of the step: bubble = f/(1 − f) · compute,
    (p − 1)/m for GPipe and 1F1B, (p − 1)/(v·m) interleaved (Narayanan et al. 2021, section 2.2)."""
    config, hardware = ModelConfig.gpt3_175b(), Hardware()
    layout = Layout(tp=8, pp=p, dp=2, micro_batches=m, chunks=v, schedule=schedule)
    t = compute_time(config, layout, hardware, global_batch=64)
    flops = compute_flops(config, 64 * 2048).total
    assert t.compute == pytest.approx(flops / (16 * p) / (312e12 * 0.5), rel=1e-12)
    f = float(bubble_formula(schedule, p, m, v))
    assert bubble_fraction(layout) == f and t.bubble == pytest.approx(t.compute * f / (1 - f), rel=1e-12)
    if schedule != "zb_h1":
        assert t.bubble == pytest.approx(t.compute * (p - 1) / (v * m), rel=1e-12)
    assert compute_time(config, Layout(tp=8), hardware, 8).bubble == 0


def test_each_axis_uses_the_link_its_ranks_share():
    """Mesh order pp, dp, sp, tp (tp innermost): 8 GPUs per node."""
    a100 = Hardware()
    links = {a: axis_network(Layout(dp=4, tp=8), a100, a)[1] for a in ("tp", "dp")}
    assert links == {"tp": "intra", "dp": "net"}, f"tp = 8 fills a node, dp rings cross nodes: {links}"
    assert axis_network(Layout(dp=4, tp=2), a100, "dp")[1] == "intra", "2·4 ranks fit one node of 8"
    network, link = axis_network(Layout(dp=8, tp=2), a100, "dp")              # 16 ranks: 4 per node, 2 nodes
    assert (link, network.gpus_per_node) == ("intra+net", 4), "a dp ring of 8, 2 apart: 4 in each of 2 nodes"
    assert axis_network(Layout(pp=4, dp=2, tp=8), a100, "pp")[1] == "net", "pp is outermost: a node per stage"


def test_a_flattened_group_uses_the_link_its_ranks_share():
    """dp×sp: D·G ranks tp apart. tp = 4, sp = 2, dp = 2 on nodes of 8: sp alone (2 ranks 4 apart) in a node,
    dp alone (2 ranks 8 apart) one per node, dp×sp (4 ranks 4 apart) 2 in each of 2 nodes.

    Planted bug, seen failing: the stride taken over the group's own first axis too ('net' for dp×sp)."""
    a100, layout = Hardware(), Layout(tp=4, sp=2, dp=2)
    links = {a: group_network(layout, a100, a)[1] for a in (("sp",), ("dp",), ("sp", "dp"))}
    assert links == {("sp",): "intra", ("dp",): "net", ("sp", "dp"): "intra+net"}, links
    assert group_network(layout, a100, ("sp", "dp"))[0].gpus_per_node == 2
    assert group_network(Layout(sp=2, dp=4), a100, ("sp", "dp"))[1] == "intra", "2·4 ranks fit one node of 8"
    with pytest.raises(ValueError, match="adjacent"):
        group_network(layout, a100, ("tp", "dp"))


def test_data_and_sequence_gradients_are_timed_as_one_ring():
    """GPT-2 small, dp = 2 × sp = 2 in one node: the gradients are one ring of 4 ranks, 2·3 steps of ⌈Ψ/4⌉ over
    NVLink (not 2·1 steps of ⌈Ψ/2⌉ twice), booked under dp; sp times attention only (3 ring rows a layer).
    With tp = 4 the group spans 2 nodes: every step waits on the hop between them.

    Planted bug, seen failing: the combined row over dp ranks only (dp time 2·1 steps of Ψ/2)."""
    config, a100 = ModelConfig.gpt2_small(), Hardware()
    psi = num_params(config).total
    t = communication_time(config, Layout(dp=2, sp=2), a100, 1)
    assert t.dp == pytest.approx(2 * 3 * (5e-6 + -(-psi // 4) * 2 / 300e9), rel=1e-12)
    block = 1024 // 2 * 768
    hop = lambda n: 5e-6 + n * 2 / 300e9  # noqa: E731
    assert t.sp == pytest.approx(12 * (hop(2 * block) + hop(4 * block) + hop(2 * block)), rel=1e-12)
    psi = -(-psi // 4)
    mixed = 2 * 3 * max(5e-6 + -(-psi // 4) * 2 / 300e9, 10e-6 + -(-psi // 4) * 2 / 25e9)
    assert communication_time(config, Layout(tp=4, dp=2, sp=2), a100, 1).dp == pytest.approx(mixed, rel=1e-12)


def test_the_dp_reason_names_the_flattened_group_and_its_link():
    """GPT-2 small, dp 2 × sp 2 on one node: the reason says one all-reduce over dp×sp = 4 ranks, on NVLink,
    with the dp time; with ZeRO-1 the dp line is ZeRO's own (the sp sum stays apart).
    Planted bug, seen failing: the reason written for dp's own group ("dp = 2 inside the node (NVLink): the
    all-reduce of the gradients takes 1.27 ms (9% of the step)")."""
    from coursekit.costmodel import evaluate

    config = ModelConfig.gpt2_small()
    best = evaluate(config, Layout(dp=2, sp=2), Hardware(), 8)
    line = [r for r in best.reasons if r.startswith("dp = 2")][0]
    assert "inside the node (NVLink): the one all-reduce of the gradients over dp×sp = 4 ranks takes" in line, line
    zero = evaluate(config, Layout(dp=2, sp=2, zero=1), Hardware(), 8)
    assert "ZeRO-1 collectives take" in [r for r in zero.reasons if r.startswith("dp = 2")][0]


def test_tensor_parallel_time_is_its_all_reduces_on_nvlink():
    """GPT-2 small, tp = 4, 2 samples: (4L + 2) all-reduces of b·s·h and 3 of b·s, each 2(t−1) ring steps of
    α_intra + ⌈N/t⌉·2 bytes / B_intra (chapter 01's closed form, written out)."""
    config, a100 = ModelConfig.gpt2_small(), Hardware()
    t = communication_time(config, Layout(tp=4), a100, micro_batch=2).tp
    step = lambda n: 2 * 3 * (5e-6 + -(-n // 4) * 2 / 300e9)  # noqa: E731
    assert t == pytest.approx(50 * step(2 * 1024 * 768) + 3 * step(2 * 1024), rel=1e-12)


def test_communication_time_is_per_step_every_micro_batch_of_it():
    """Seconds a *step*: tensor parallelism's all-reduces run for every micro-batch, so 192 micro-batches take
    192 times one (chapter 08 prints both; it once called the step's 38.5 s "per micro-batch"). Planted, seen
    failing: the micro-batches left out of the tp rows (ratio 1)."""
    config, a100 = ModelConfig.gpt3_175b(), Hardware()
    one = communication_time(config, Layout(dp=8, tp=16, pp=8, micro_batches=1), a100, 1).tp
    step = communication_time(config, Layout(dp=8, tp=16, pp=8, micro_batches=192), a100, 1).tp
    assert step == pytest.approx(192 * one, rel=1e-12), (step, one)


def test_data_parallel_time_across_nodes_and_zero_3():
    """dp = 4 outside tp = 8: one GPU per node in each ring, so InfiniBand: 2·3 steps of ⌈Ψ/4⌉ (Ψ = P/8);
    ZeRO-3 (m = 1) 1.5 times as long: 2 all-gathers + 1 reduce-scatter, 3·3 steps."""
    config, a100 = ModelConfig.gpt3_175b(), Hardware()
    psi = -(-num_params(config).total // 8)
    ring = 2 * 3 * (10e-6 + -(-psi // 4) * 2 / 25e9)
    assert communication_time(config, Layout(dp=4, tp=8), a100, 1).dp == pytest.approx(ring, rel=1e-12)
    assert communication_time(config, Layout(dp=4, tp=8, zero=3), a100, 1).dp == pytest.approx(1.5 * ring, rel=1e-12)
    # dp = 8 outside tp = 2: 4 of each ring in a node, 2 nodes; every step waits on the hop between nodes
    psi = -(-num_params(config).total // 2)
    mixed = 2 * 7 * max(5e-6 + -(-psi // 8) * 2 / 300e9, 10e-6 + -(-psi // 8) * 2 / 25e9)
    assert communication_time(config, Layout(dp=8, tp=2), a100, 1).dp == pytest.approx(mixed, rel=1e-12)


def test_ulysses_all_to_all_is_one_step_and_ring_attention_g_minus_1():
    """Ulysses' all-to-all of this rank's N: one step, (G−1)·⌈N/G⌉ elements through each side; ring attention
    G−1 hops of 2 blocks forward, G−1 of 4 and one of 2 backward: on NVLink at sp = 4."""
    config, a100, b = ModelConfig.gpt2_small(), Hardware(), 1
    block = b * 1024 // 4 * 768
    hop = lambda n: 5e-6 + n * 2 / 300e9  # noqa: E731
    ulysses = communication_time(config, Layout(sp=4), a100, b, attention="ulysses").sp
    gradients = 2 * 3 * hop(-(-num_params(config).total // 4))
    a2a = lambda n: 5e-6 + 3 * -(-n // 4) * 2 / 300e9  # noqa: E731
    assert ulysses == pytest.approx(12 * 2 * (a2a(3 * block) + a2a(block)) + gradients, rel=1e-12)
    ring = communication_time(config, Layout(sp=4), a100, b).sp
    assert ring == pytest.approx(12 * (3 * hop(2 * block) + 3 * hop(4 * block) + hop(2 * block)) + gradients,
                                 rel=1e-12)


def test_step_time_adds_compute_bubble_and_exposed_communication():
    config, a100 = ModelConfig.gpt3_175b(), Hardware()
    layout = Layout(dp=2, tp=8, pp=8, micro_batches=8, recompute="full")
    t = step_time(config, layout, a100, global_batch=32)
    c = compute_time(config, layout, a100, 32)
    comm = communication_time(config, layout, a100, micro_batch=2)
    assert (t.compute, t.bubble, t.communication) == (c.compute, c.bubble, comm)
    assert t.total == pytest.approx(c.compute + c.bubble + comm.total, rel=1e-12)
    hidden = step_time(config, layout, a100, 32, dp_overlap=1.0)
    assert hidden.exposed.dp == 0 and hidden.total == pytest.approx(t.total - comm.dp, rel=1e-12)
    assert t.communication.pp > 0 and t.communication.sp == 0
    with pytest.raises(ValueError, match="use a multiple of 16"):
        step_time(config, layout, a100, global_batch=24)
    with pytest.raises(ValueError, match="dp_overlap is the share"):
        step_time(config, layout, a100, 32, dp_overlap=1.5)
    with pytest.raises(TypeError, match="pass a ModelConfig with that seq_len"):
        step_time(config, layout, a100, 32, seq_len=1024)


def test_collectives_of_a_step_are_listed_per_axis():
    """A layout of degree 1 everywhere communicates nothing; each axis's rows name what they carry."""
    assert step_collectives(ModelConfig.course(), Layout(), 4) == ()
    rows = step_collectives(ModelConfig.course(), Layout(dp=2, tp=2, pp=2, sp=2), 4)
    assert {r.axis for r in rows} == {"dp", "tp", "pp", "sp"} and all(r.what for r in rows)
    with pytest.raises(ValueError, match="attention must be one of"):
        step_collectives(ModelConfig.course(), Layout(sp=2), 4, attention="flash")


def test_the_worked_examples_in_the_docstrings_hold():
    """Each module's doctest is a worked example a learner reads: they must stay true."""
    import doctest

    from coursekit.costmodel import comm, compute, step
    for module in (comm, compute, step):
        failures, tried = doctest.testmod(module)
        assert tried and not failures, f"{module.__name__}: {failures} of {tried} examples fail"
