"""Mixed precision for plain data parallelism, as DDP is used with it: the forward under ``torch.autocast``.

``train(..., "naive" | "bucketed" | "sharded_optimizer" | "torch_ddp", precision="bf16")``: fp32 parameters (the
master weights), bf16 matmuls, fp32 gradients all-reduced in fp32. Checked against a one-process reference written
here (the same model and batch under ``torch.autocast``), against DDP under autocast, and against fp32 (so that
bf16 is seen to be on). ``precision="fp16"`` adds a loss scale: checked step by step against DDP, autocast and
``torch.amp.GradScaler`` written out here as a PyTorch user writes them.

Tolerances are bf16's. Two half-batches in bf16 round differently from one whole batch: measured here, the
step-0 gradients of 2 and 3 ranks differ from one process's bf16 gradients by 0.24% and 0.68% (per-tensor norm),
as much as bf16 differs from fp32 (0.70%); fp32 runs differ by 2.4e-07.

Planted bugs, seen failing:
* the forward not under autocast -> "bf16 is on" fails (the gradients are fp32's to 1e-7);
* autocast's output left in bf16 for the loss (DDP's is cast to fp32) -> the equality with DDP under autocast;
* a bf16 reduce accepted -> the refusal test;
* fp16: the gradients not unscaled before the step; the backward not scaled (no step skipped, the scale never
  moves) -- see ``test_fp16_*``'s docstring.
"""

from __future__ import annotations

import pytest
import torch

import coursekit
from coursekit.models import LanguageData, loss_fn, tiny_transformer
from coursekit.parallel.data import LossScaler, shard_batch
from coursekit.train import train
from coursekit.measure.verify import compare, record_step

BATCH = 7
STRATEGIES = ("naive", "bucketed", "sharded_optimizer", "torch_ddp")


def _relative(got: dict, want: dict) -> float:
    return max(((got[n] - want[n]).norm() / want[n].norm()).item() for n in want)


def _one_process(bf16: bool) -> dict:
    model = tiny_transformer(seed=0)
    x, y = LanguageData(seed=0).batch(0, BATCH)
    if bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x).float()
    else:
        out = model(x)
    loss_fn(out, y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _step0(rank, world_size):
    """Every strategy's step-0 gradients in bf16, on one set of ranks (one launch per world size)."""
    import warnings
    warnings.filterwarnings("ignore", message="Full backward hook")
    return {s: train(rank, world_size, s, model="transformer", steps=1, global_batch=BATCH,
                     precision="bf16")["records"][0]["grads"] for s in STRATEGIES}


@pytest.fixture(scope="module")
def references():
    return _one_process(bf16=True), _one_process(bf16=False)


@pytest.fixture(scope="module")
def runs():
    return {world_size: coursekit.launch(_step0, world_size, timeout=300)[0] for world_size in (2, 3)}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_data_parallelism_is_one_process_under_autocast(references, runs, strategy, world_size):
    bf16, fp32 = references
    grads = runs[world_size][strategy]
    assert _relative(grads, bf16) < 0.02, f"{strategy}: {_relative(grads, bf16):.2%} from one process's bf16"
    assert _relative(grads, fp32) > 1e-4, f"{strategy}: bf16 is not on (the gradients are fp32's)"


@pytest.mark.parametrize("world_size", [2, 3])
def test_ours_equal_ddp_under_autocast(runs, world_size):
    """The course's data parallelism and DDP, both under autocast: the same gradients to fp32's rounding."""
    ddp = runs[world_size]["torch_ddp"]
    for strategy in ("naive", "bucketed", "sharded_optimizer"):
        assert _relative(runs[world_size][strategy], ddp) < 1e-5, (strategy, _relative(runs[world_size][strategy], ddp))


@pytest.mark.parametrize("strategy", ["naive", "bucketed"])
def test_a_bf16_reduce_is_refused_with_what_to_use(strategy):
    with pytest.raises(ValueError, match="only 'bf16' or 'fp16'.*'zero2'"):
        train(0, 1, strategy, model="transformer", steps=1, precision="bf16-reduce-bf16")


FP16_STEPS, INIT_SCALE = 10, 2.0 ** 24  # a scale far too large: the first steps overflow and are skipped
FP16_RELATIVE = 4 * 2.0 ** -11          # four of fp16's roundings, per tensor (see the test's docstring)
FP16_STRATEGIES = ("naive", "bucketed", "sharded_optimizer", "torch_ddp", "torch_zero1")


def ddp_autocast_grad_scaler(rank, world_size):
    """PyTorch's fp16 recipe for DDP, written out: autocast around the forward, ``scaler.scale(loss).backward()``,
    ``scaler.step(optimizer)``, ``scaler.update()``. One record per step, and the scale after each."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model, data = tiny_transformer(seed=0), LanguageData(seed=0)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    records, scales = [], []
    for step in range(FP16_STEPS):
        x, y, weight = shard_batch(*data.batch(step, BATCH), rank, world_size)
        with torch.autocast("cpu", dtype=torch.float16):
            out = ddp(x).float()
        loss = loss_fn(out, y) * weight
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # unscales the gradients in place; skips the step if one is inf or NaN
        scaler.update()
        total = loss.detach().double() / world_size
        dist.all_reduce(total)
        records.append(record_step(None, total.item(), {n: p.grad.clone() for n, p in model.named_parameters()},
                                   model))
        scales.append(scaler.get_scale())
        optimizer.zero_grad(set_to_none=True)
    return records, scales


def _fp16(rank, world_size):
    import warnings
    warnings.filterwarnings("ignore", message="Full backward hook")
    runs = {}
    for strategy in FP16_STRATEGIES:
        result = train(rank, world_size, strategy, model="transformer", steps=FP16_STEPS, global_batch=BATCH,
                       precision="fp16", loss_scaler=LossScaler(init_scale=INIT_SCALE))
        runs[strategy] = result["records"], result["loss_scale"], result["skipped_steps"], result.get("inf_checks")
    return ddp_autocast_grad_scaler(rank, world_size), runs


@pytest.mark.parametrize("world_size", [2, 3])
def test_fp16_data_parallelism_is_ddp_with_autocast_and_grad_scaler(world_size):
    """fp16 with a dynamic loss scale, 2 and 3 ranks, batch 7 (uneven): every strategy skips the steps PyTorch's
    recipe skips (the same final scale), then trains alike; the course's check sends nothing (the averaged
    gradients are the same bits on every rank), where ZeRO's is an all-reduce.

    "Alike": PyTorch's own strategies and, at 2 ranks, the course's to fp32 rounding (a sum of two is the same in
    any order). At 3 ranks the ring adds in another order than gloo, the weights differ in their last fp32 bit
    after the first kept step, and fp16 compute turns that into fp16-sized differences: measured per tensor at
    most 5.9e-4 of its norm (fp16 keeps 11 bits: 2^-11 = 4.9e-4), so the bound is ``FP16_RELATIVE``.

    Planted bugs, seen failing: the gradients checked but not unscaled ("grad 'tok_emb.weight' ... expected
    0.0185151, got 4853.63" at the first kept step); the backward not scaled, or the step not checked (no step
    skipped, the scale never moves: "naive: (16777216.0, 0) != (262144.0, 6)").
    """
    ranks = coursekit.launch(_fp16, world_size, timeout=300)
    reference, scales = ranks[0][0]
    skipped = sum(1 for before, after in zip([INIT_SCALE] + scales, scales) if after < before)
    assert 0 < skipped < FP16_STEPS - 2, f"the case must skip some steps and then train (skipped {skipped})"
    for strategy in FP16_STRATEGIES:
        for _, runs in ranks:
            records, scale, skips, checks = runs[strategy]
            assert (scale, skips) == (scales[-1], skipped), f"{strategy}: {(scale, skips)} != {(scales[-1], skipped)}"
            assert checks in (None, 0), f"{strategy}: {checks} all-reduces of the overflow flag; replicated needs 0"
        kept = [runs[strategy][0][skipped:] for _, runs in ranks]
        if world_size == 2 or strategy.startswith("torch"):
            report = compare(reference[skipped:], kept, check_output=False, rtol=1e-4, atol=1e-6)
            assert report.ok, f"{strategy} fp16 against DDP + autocast + GradScaler, after the skipped steps: {report}"
            continue
        for step, (want, *got) in enumerate(zip(reference[skipped:], *kept), start=skipped):
            for rank, record in enumerate(got):
                for kind in ("grads", "params"):
                    error = _relative(record[kind], want[kind])
                    assert error < FP16_RELATIVE, (f"{strategy}, rank {rank}, step {step}: {kind} {error:.1e} of their "
                                                   f"norm from DDP + autocast + GradScaler's (bound {FP16_RELATIVE})")
