"""Mixed precision on every layout of the composed strategy, and on ``coursekit train`` (issue 41, item 1).

``train(..., "hybrid", precision="bf16")`` computes under ``torch.autocast`` on any layout: fp32 weights, gradients
and Adam, 16-bit matmuls. Each layout is held, step by step (loss, every gradient, every weight; 3 Adam steps, a
global batch of 5 that no degree divides), to one process doing the same with chapter 02's ``"naive"`` on one rank
-- PyTorch's recipe, autocast around the forward, checked against DDP in ``test_parallel_data_amp.py``.

The band is the course's for the dtype (``coursekit.measure.verify.TOLERANCES``): bf16 keeps 8 significant bits, so
one rounding moves a value by up to 2^-9 = 0.2% of it; a layout rounds other partial sums than one process does (a
tensor-parallel matmul rounds each half before they are added), so it may differ by a few roundings: rtol 2e-2
(about five bf16 roundings) and atol 1e-2 of the tensor's largest value. fp16 (11 bits) is held to the same band:
Adam's first step moves every weight by lr = 1e-3, up or down by the sign of its gradient whatever its size, so a
gradient near 0 that rounds to the other sign puts two runs 2e-3 apart: the weights' band is Adam's, not the
dtype's (fp16's own, atol 1e-3, fails on one weight by 1.7e-3 after one step).

That a layout really computed in 16 bits is read from what it sent: tensor parallelism's all-reduces of activations
carry 2-byte elements (the embedding's lookups and the vocabulary-parallel loss's sums stay fp32), ring attention's
keys and values too; the gradients' reduce over dp x sp carries 4.

Planted bugs, seen failing:
* the forward not under autocast (precision read, then ignored) -> "tp2: the activations' all-reduces carried
  [4]-byte elements, none 2", "sp2: ring attention's keys and values carried [4] bytes" (the loss and gradients
  alone stay inside the band: bf16 moves this model's loss by 1e-4);
* fp16's unscale and its flag left out of ``Hybrid.step`` -> "fp16 tp2: NOT equivalent: first divergence at step 0, grad
  'tok_emb.weight' ... expected -0.00566825, got -371.442" (65,536 times too large);
  and test_an_overflow_skips_the_step_on_every_rank "skipped [0, 0, 0, 0]".
"""

from __future__ import annotations

import pytest
import torch

import coursekit
from coursekit.capstone import Config, one_process_losses
from coursekit.capstone.__main__ import main, with_flags
from coursekit.capstone.run import check
from coursekit.comm.mesh import Mesh
from coursekit.measure.verify import TOLERANCES, compare
from coursekit.parallel.data import LossScaler
from coursekit.parallel.hybrid import mesh_shape
from coursekit.train import OptionError, train

STEPS, BATCH = 3, 5
H = 64  # the course transformer's width: an activation all-reduce has b·s·h elements (the loss's, b·s, fp32 logits)


def _layout(rank, world_size, shape, precision, options):
    micro = 2 if shape.get("pp", 1) > 1 else 1
    result = train(rank, world_size, "hybrid", model="transformer", mesh=Mesh(mesh_shape(**shape)), steps=STEPS,
                   global_batch=BATCH, micro_batches=micro, precision=precision, count_traffic=True, **options)
    traffic = result["traffic"]
    return {"records": result["records"], "skipped": result["skipped_steps"], "scale": result["loss_scale"],
            "forward_all_reduce": sorted({c.itemsize for c in traffic.collectives  # activations: b·s·h elements
                                          if c.op == "all_reduce" and c.direction == "forward" and c.numel % H == 0}),
            "ring_kv": sorted({t.itemsize for t in traffic.payload if t.phase and t.phase.startswith("ring kv")}),
            "gradient_reduce": sorted({t.itemsize for t in traffic.payload
                                       if t.phase in ("reduce-scatter", "all-gather")})}


def _one_process(rank, world_size, precision):
    return train(rank, world_size, "naive", model="transformer", steps=STEPS, global_batch=BATCH,
                 precision=precision)["records"]


_REFERENCE: dict = {}


def reference(precision: str) -> list[dict]:
    if precision not in _REFERENCE:
        _REFERENCE[precision] = coursekit.launch(_one_process, 1, precision, timeout=60)[0]
    return _REFERENCE[precision]


LAYOUTS = {"tp2": dict(tp=2), "pp2": dict(pp=2), "sp2": dict(sp=2), "dp2_zero1": dict(dp=2),
           "dp2xtp2": dict(dp=2, tp=2), "pp2xsp2": dict(pp=2, sp=2), "pp2xtp2": dict(pp=2, tp=2)}
CASES = [("bf16", name) for name in LAYOUTS] + [("fp16", name) for name in ("tp2", "pp2")]


@pytest.mark.parametrize("precision,name", CASES, ids=[f"{p}-{n}" for p, n in CASES])
def test_every_layout_computes_in_16_bits_within_the_band_of_one_process(precision, name):
    shape = LAYOUTS[name]
    options = {"zero": 1} if name.endswith("zero1") else {}
    world = shape.get("dp", 1) * shape.get("tp", 1) * shape.get("pp", 1) * shape.get("sp", 1)
    ranks = coursekit.launch(_layout, world, shape, precision, options, timeout=120)
    rtol, atol = TOLERANCES[torch.bfloat16]
    report = compare(reference(precision), [r["records"] for r in ranks], rtol=rtol, atol=atol, check_output=False)
    assert report.ok, f"{precision} {name}: {report}"
    seen = ranks[0]
    if shape.get("tp", 1) > 1:  # the row-parallel layers' outputs; the embedding's lookups stay fp32
        assert 2 in seen["forward_all_reduce"], \
            f"{name}: the activations' all-reduces carried {seen['forward_all_reduce']}-byte elements, none 2"
    if shape.get("sp", 1) > 1:
        assert seen["ring_kv"] == [2], f"{name}: ring attention's keys and values carried {seen['ring_kv']} bytes"
    if shape.get("dp", 1) * shape.get("sp", 1) > 1:
        assert seen["gradient_reduce"] == [4], f"{name}: the gradients were reduced in {seen['gradient_reduce']} bytes"
    assert [r["skipped"] for r in ranks] == [0] * world


def test_an_overflow_skips_the_step_on_every_rank():
    """fp16 with a loss scale of 2^40 on pp2 x tp2: the gradient entering backward is about 1/(5 x 31) = 2^-7.3 a
    logit, times 2^40 = 2^32.7, beyond fp16's largest number (65,504 < 2^16), and each overflow only halves the
    scale: all three steps overflow, every rank skips all three, the scale ends at 2^37 everywhere, and no weight
    moves. (Here the inf reaches every rank by itself, through the pipeline's messages and the all-reduces; the flag
    is all-reduced over the whole world all the same, so that no layout can leave the ranks disagreeing.)"""
    shape = dict(pp=2, tp=2)
    ranks = coursekit.launch(_layout, 4, shape, "fp16", {"loss_scaler": LossScaler(init_scale=2.0 ** 40)}, timeout=120)
    assert [r["skipped"] for r in ranks] == [STEPS] * 4, f"skipped {[r['skipped'] for r in ranks]}"
    assert [r["scale"] for r in ranks] == [2.0 ** 37] * 4
    for r in ranks:
        first, last = r["records"][0]["params"].tensors, r["records"][-1]["params"].tensors
        assert all(torch.equal(first[n], last[n]) for n in first), "a weight moved in a skipped step"


def test_a_strategy_without_precision_names_the_one_that_has_it():
    with pytest.raises(OptionError, match="'hybrid'"):
        train(0, 1, "tensor", precision="bf16")
    with pytest.raises(coursekit.RankError) as caught:
        coursekit.launch(_layout, 1, {}, "bf16-reduce-bf16", {})
    assert "ValueError: precision='bf16-reduce-bf16' with 'hybrid': only 'bf16' or 'fp16'" in \
        caught.value.remote_traceback, caught.value.remote_traceback[-600:]
    with pytest.raises(ValueError) as caught:
        check(Config(precision="int8"))
    assert "use one of fp32, bf16, fp16" in str(caught.value)
    assert with_flags(caught.value).endswith("(command line: --precision)")


def test_coursekit_train_takes_precision(capsys):
    """``coursekit train --tp 2 --precision bf16`` trains (its layout line says bf16); the curve of a bf16 run
    equals PyTorch's autocast recipe on one process (``one_process_losses``) within bf16's band."""
    assert main(["--tp", "2", "--precision", "bf16", "--steps", "3", "--batch", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "coursekit capstone: tp2 bf16 on 2 rank(s)" in lines[0], lines[0]
    config = Config(tp=2, precision="bf16", steps=3, batch=5, quiet=True)
    from coursekit.capstone import run

    losses = coursekit.launch(run, 2, config)[0]["losses"]
    rtol = TOLERANCES[torch.bfloat16][0]
    assert all(abs(a - b) <= rtol * b for a, b in zip(losses, one_process_losses(config))), losses
