"""Compute priced by shape (coursekit/costmodel/kernels.py): Korthikanti et al. 2022's eight A100 iterations with one
hardware description, and the step's parts each priced once.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198),
Table 3 (heads, hidden, layers, tensor and pipeline parallel sizes, GPUs, global batch; micro-batch 4 for 22B and
1 for the others; s = 2,048, V = 51,200) and Table 5 (seconds an iteration: "full recompute" and "present work",
sequence parallelism + selective recomputation). The interleaving depth, which the paper does not print, is the one
Calculon's validation of the same table uses (calculon-ai/calculon at caa4b11, validation/seqsel/tab5/*.json:
``pipeline_interleaving`` 3 for 175B and 530B, 1 for 1T); the description is Calculon's systems/a100_80g.json
(:meth:`Hardware.a100`), not fitted to these rows.

How they ran (Megatron-LM, 2022): tensor parallelism's collectives on the critical path; the pipeline's sends
waited on (its p2p_communication then waited on each ``batch_isend_irecv``) and scattered over tp (Narayanan et al.
2021, section 4.1; with sequence parallelism the activation is split already); one data-parallel replica.
"""

import math

import pytest

from coursekit.costmodel import (Hardware, Layout, ModelConfig, bubble_fraction, communication_time,
                                 compute_time, kernel_time, step_time)
from coursekit.costmodel.kernels import curve_share, matmul_seconds

# (name, heads, hidden, layers, pp, GPUs, global batch, micro-batch, v; seconds: full recompute, present work)
TABLE_5 = [("22B", 64, 6144, 48, 1, 8, 4, 4, 1, 1.42, 1.10),
           ("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 18.13, 13.75),
           ("530B", 128, 20480, 105, 35, 280, 280, 1, 3, 49.05, 37.83),
           ("1T", 160, 25600, 128, 64, 512, 512, 1, 1, 94.42, 71.49)]
ROWS = [(row, mode) for row in TABLE_5 for mode in ("full", "selective")]


def _run(row, mode):
    name, heads, hidden, layers, pp, gpus, batch, micro, v, _, _ = row
    config = ModelConfig(51200, 2048, hidden, layers, heads, name=f"Korthikanti {name}")
    layout = Layout(tp=8, pp=pp, micro_batches=batch // micro, chunks=v, recompute=mode,
                    schedule="interleaved" if v > 1 else "1f1b", sequence_parallel=mode == "selective")
    assert layout.gpus == gpus, f"{name}: Table 3's {gpus} GPUs are tp 8 × pp {pp}"
    return config, layout, batch


def _predicted(row, mode, hardware=None):
    config, layout, batch = _run(row, mode)
    return step_time(config, layout, hardware or Hardware.a100(), batch, scatter_gather=True)


@pytest.mark.parametrize("row,mode", ROWS, ids=[f"{r[0]}-{m}" for r, m in ROWS])
def test_korthikanti_table_5_within_10_percent(row, mode):
    """Each of Table 5's eight iterations within ±10% with one A100 description, nothing fitted per row.

    Planted and seen failing: every matmul at 1.0 of peak ("22B selective: 0.99 s predicted, Table 5 1.1 s:
    -10.1%"; the other seven stay inside, which is why the bubble and the curve have tests of their own below).
    The bubble added twice is *not* seen here (1T's rows move +9% to +11% only with its exposed waits in it too):
    test_the_bubble_is_priced_once_of_a_micro_batchs_whole_time sees it."""
    measured = row[9] if mode == "full" else row[10]
    predicted = _predicted(row, mode).total
    assert predicted == pytest.approx(measured, rel=0.10), (
        f"{row[0]} {mode}: {predicted:.2f} s predicted, Table 5 {measured} s: {predicted / measured - 1:+.1%}")


def test_a_single_efficiency_cannot_price_the_eight():
    """The issue's point, checked: the share of peak each row would need to match its measured time with the
    scalar model (FLOPs / (peak · e) + the bubble, as Hardware() prices it) spreads far wider than ±10% around any
    one value, while the priced-by-shape errors stay within [-10%, +10%]. (max/min of the needed shares > 1.2.)"""
    needed = []
    for row, mode in ROWS:
        config, layout, batch = _run(row, mode)
        scalar = step_time(config, layout, Hardware(), batch, scatter_gather=True, efficiency=1.0)
        measured = row[9] if mode == "full" else row[10]
        needed.append((scalar.compute + scalar.bubble) / (measured - scalar.exposed_communication))
    assert max(needed) / min(needed) > 1.2, [round(e, 2) for e in needed]


def test_the_bubble_is_priced_once_of_a_micro_batchs_whole_time():
    """175B, present work: the bubble is (p − 1)/(v·m) = 7/192 (Narayanan et al. 2021, section 2.2) of the
    micro-batches' kernels plus the tp and pp waits inside them (an idle share f = x/(1 + x) of the step), and the optimizer (after the flush) is outside it: the step is the sum
    of its parts, each once.

    Planted and seen failing: the kernels' bubble added twice in step_time ("bubble 0.85 s, by hand 0.46 s")."""
    config, layout, batch = _run(TABLE_5[1], "selective")
    a100 = Hardware.a100()
    x = (8 - 1) / (3 * 64)
    assert bubble_fraction(layout) == pytest.approx(x / (1 + x), rel=1e-12)
    step = step_time(config, layout, a100, batch, scatter_gather=True)
    kernels = kernel_time(config, layout, a100, batch)
    comm = communication_time(config, layout, a100, 1, scatter_gather=True)
    by_hand = (kernels.pipelined + comm.tp + comm.pp) * x
    assert step.bubble == pytest.approx(by_hand, rel=1e-9), f"bubble {step.bubble:.2f} s, by hand {by_hand:.2f} s"
    assert step.compute == pytest.approx(kernels.pipelined + kernels.optimizer, rel=1e-12)
    assert step.total == pytest.approx(kernels.total + by_hand + comm.tp + comm.pp, rel=1e-9)


def test_a_matmuls_share_of_peak_follows_its_size():
    """Calculon's a100_80g.json curve, read as a step function: 0.95 from 128 GFLOP, 0.9 from 16, 0.6 from 1,
    0.1 below. A 12.9-GFLOP batched QKᵀ of 175B (b·a/t = 12 heads of 2,048 × 128 × 2,048) runs at 0.6, the
    232-GFLOP qkv at 0.95: a second per FLOP differs by 0.95/0.6.

    Planted and seen failing: Hardware.a100()'s curve as one share of 1.0 ("[1.0, 1.0, ...] == [0.95, 0.95, ...]")."""
    a100 = Hardware.a100()
    assert [curve_share(a100.matmul_efficiency, g * 1e9) for g in (500, 128, 20, 16, 12.9, 1, 0.5)] == [
        0.95, 0.95, 0.9, 0.9, 0.6, 0.6, 0.1]
    qk, qkv = 2 * 12 * 2048 * 128 * 2048, 2 * 2048 * 12288 * 4608
    assert matmul_seconds(qk, a100) / qk == pytest.approx(1 / (312e12 * 0.6), rel=1e-12)
    assert matmul_seconds(qkv, a100) / qkv == pytest.approx(1 / (312e12 * 0.95), rel=1e-12)


def test_one_efficiency_given_is_still_one_efficiency():
    """An explicit efficiency on a priced-by-shape card is the old model: FLOPs / (peak · e), nothing else."""
    config, layout, batch = _run(TABLE_5[0], "full")
    t = compute_time(config, layout, Hardware.a100(), batch, efficiency=0.5)
    assert t.compute == pytest.approx(compute_time(config, layout, Hardware(), batch).compute, rel=1e-12)


def test_bad_descriptions_say_what_to_change():
    with pytest.raises(ValueError, match="largest first down to 0"):
        Hardware(matmul_efficiency=((1e9, 0.6), (128e9, 0.95), (0.0, 0.1)))
    with pytest.raises(ValueError, match="largest first down to 0"):
        Hardware(memory_efficiency=((1e6, 0.6),))
    with pytest.raises(ValueError, match="intra_efficiency must be > 0"):
        Hardware(intra_efficiency=math.nan)
    with pytest.raises(ValueError, match="capacity_factor must be a finite number"):
        ModelConfig(16, 8, 8, 1, 2, experts=4, capacity_factor=math.inf)
    with pytest.raises(ValueError, match="capacity_factor must be a finite number"):
        ModelConfig(16, 8, 8, 1, 2, experts=4, capacity_factor=math.nan)
    with pytest.raises(ValueError, match="no matmul_efficiency curve"):
        kernel_time(ModelConfig.gpt2_small(), Layout(), Hardware(), 8)
    moe = ModelConfig(16, 8, 8, 1, 2, experts=4)
    with pytest.raises(ValueError, match="mixture of experts"):
        compute_time(moe, Layout(), Hardware.a100(), 8)
