"""Mixed precision in ZeRO 1-3 (issue 23): bf16 compute, fp32 master weights, gradients reduced in a chosen dtype.

The reference is written out here, in one process, as the algorithm reads: an fp32 master copy of the weights
and a bf16 compute copy; each data-parallel rank's slice goes forward and backward through the compute copy
(bf16 gradients), the gradients are cast to the reduce dtype and averaged, Adam steps the fp32 master, and the
compute copy is cast from it again. ZeRO must give the same fp32 gradients and master weights, step by step,
to fp32 rounding (the sum's order differs), at 1-4 ranks and batches that do not divide evenly; and it must
agree with PyTorch's FSDP2 running the same policy (``fully_shard(mp_policy=MixedPrecisionPolicy(...))``).
"""

from __future__ import annotations

import copy

import pytest
import torch

import coursekit
from coursekit.measure.memory import mixed_peak_held_bytes
from coursekit.models import loss_fn
from coursekit.parallel.data import MixedPrecision, as_policy, shard_batch
from coursekit.train import make_model, train
from coursekit.measure.verify import compare, record_step

STEPS, BATCH = 3, 7


def hand_written(world_size: int, policy: MixedPrecision, steps: int = STEPS, batch: int = BATCH) -> list[dict]:
    """One process, the mixed-precision algorithm spelled out; one record per step (fp32 gradients, master)."""
    net, data = make_model("mlp", seed=0)
    master = [torch.nn.Parameter(p.detach().clone()) for p in net.parameters()]
    compute = copy.deepcopy(net).to(policy.param_dtype)
    optimizer = torch.optim.Adam(master, lr=1e-3)
    names = [name for name, _ in net.named_parameters()]
    records = []
    for step in range(steps):
        x, y = data.batch(step, batch)
        summed = [torch.zeros_like(p) for p in master]
        loss = 0.0
        for r in range(world_size):  # each rank's slice: its own bf16 backward
            xr, yr, weight = shard_batch(x, y, r, world_size)
            compute.zero_grad()
            out = compute(xr.to(policy.param_dtype)).to(policy.output_dtype or policy.param_dtype)
            scaled = loss_fn(out, yr) * weight
            scaled.backward()
            loss += scaled.item() / world_size
            for total, p in zip(summed, compute.parameters()):
                total += p.grad.to(policy.reduce_dtype or policy.param_dtype).float()
        for p, total in zip(master, summed):
            p.grad = total / world_size
        optimizer.step()
        with torch.no_grad():
            for c, p in zip(compute.parameters(), master):
                c.copy_(p)  # the compute copy, cast from the master
        records.append(record_step(None, loss, dict(zip(names, [p.grad for p in master])), dict(zip(names, master))))
    return records


def zero(rank, world_size, stage, precision):
    result = train(rank, world_size, f"zero{stage}", steps=STEPS, global_batch=BATCH, precision=precision,
                   collectives="ring")
    return result["records"], str(result["records"][-1]["params"][0].data.dtype)  # my first segment's dtype


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_bf16_equals_the_hand_written_mixed_precision_loop(stage, world_size):
    """fp32 gradients and fp32 master weights after every step, equal to the reference to fp32 rounding.

    Planted bugs, seen failing: gradients reduce-scattered in bf16 although ``reduce_dtype`` is fp32
    (``_to_reduce`` returning its input: "grad 'layers.0.weight' ... expected -0.00392151, got -0.00390625",
    bf16's rounding); a master made from the rounded bf16 copy (pieces cut from ``flat_param``: "param
    'layers.0.weight' ... expected 0.135111, got 0.134789" after the first step).
    """
    policy = as_policy("bf16")
    results = coursekit.launch(zero, world_size, stage, "bf16", timeout=120)
    ranks = [records for records, _ in results]
    report = compare(hand_written(world_size, policy), ranks, check_output=False)
    assert report.ok, f"ZeRO-{stage} bf16 at {world_size} ranks: {report}"
    assert {dtype for _, dtype in results} == {"torch.float32"}, "the optimiser's segments must be the fp32 master"


def traffic(rank, world_size, precision):
    out = {}
    for stage in (1, 2, 3):
        result = train(rank, world_size, f"zero{stage}", steps=1, global_batch=BATCH, precision=precision,
                       collectives="ring", count_traffic=True, record=False)
        out[stage] = (result["traffic"], result["numel"])
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-reduce-bf16"])
def test_bytes_on_the_wire_are_the_reduce_dtype_and_the_compute_dtype_exactly(precision):
    """A step's payload bytes, summed over 3 ranks: the reduce-scatter's ``(N−1)·Ψ`` elements in ``reduce_dtype``,
    each all-gather's ``(N−1)·Ψ`` in ``param_dtype`` (one per step; ZeRO-3 gathers twice, for forward and backward).

    So fp32 sends 8(N−1)Ψ bytes, bf16 with an fp32 reduce 6(N−1)Ψ, bf16 throughout 4(N−1)Ψ (ZeRO-3: 12, 8, 6).
    Planted bug, seen failing: the reduce dtype ignored (bf16 reduced in bf16: "ZeRO-1 bf16: 44064 bytes sent
    in a step", 4 bytes per element instead of 6).
    """
    policy, n = as_policy(precision), 3
    reduce_bytes = (policy.reduce_dtype or policy.param_dtype or torch.float32).itemsize
    param_bytes = (policy.param_dtype or torch.float32).itemsize
    results = coursekit.launch(traffic, n, precision, timeout=120)
    for stage in (1, 2, 3):
        psi = results[0][stage][1]
        total = sum(r[stage][0].total_bytes for r in results)
        gathers = 2 if stage == 3 else 1
        assert total == (n - 1) * psi * (reduce_bytes + gathers * param_bytes), \
            f"ZeRO-{stage} {precision}: {total} bytes sent in a step"


def fsdp_and_zero3(rank, world_size):
    kw = dict(steps=STEPS, global_batch=BATCH, precision="bf16", model="transformer")
    return train(rank, world_size, "torch_fsdp", **kw)["records"], train(rank, world_size, "zero3", **kw)["records"]


@pytest.mark.parametrize("world_size", [2, 3])
def test_zero3_bf16_equals_fsdp2_with_the_same_policy(world_size):
    """PyTorch's FSDP2 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32, output_dtype=fp32)``) and
    ZeRO-3 with the same policy: losses, fp32 gradients and fp32 parameters alike after every step, on the
    course transformer (tied embedding) at a batch that does not divide evenly.

    Planted bug, seen failing: ZeRO computing in fp32 (``param_dtype`` ignored): "grad 'tok_emb.weight' ...
    expected -0.00820923, got -0.00817251" (140 divergences).
    """
    results = coursekit.launch(fsdp_and_zero3, world_size, timeout=240)
    fsdp, ours = results[0][0], [zero3 for _, zero3 in results]
    report = compare(fsdp, ours, check_output=False, rtol=1e-4, atol=1e-6)
    assert report.ok, f"ZeRO-3 bf16 against FSDP2 bf16 at {world_size} ranks: {report}"


def test_a_policy_that_is_not_floating_point_is_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="floating-point dtype"):
        MixedPrecision(param_dtype=torch.int8)
    with pytest.raises(ValueError, match="MixedPrecision"):
        as_policy("bf17")


def peaks(rank, world_size, precision, capacity):
    runs = {stage: train(rank, world_size, f"zero{stage}", model="transformer", steps=2, global_batch=6,
                         collectives="ring", record=False, bucket_elements=capacity, precision=precision)
            for stage in (1, 2, 3)}
    return {stage: run["peak_memory"] for stage, run in runs.items()}, runs[2]["bucket_sizes"]


@pytest.mark.parametrize("precision", ["bf16", "bf16-reduce-bf16"])
def test_peak_bytes_per_stage_are_the_mixed_precision_formulas(precision):
    """Peak bytes per kind on every rank of 3, course transformer in buckets of ≤ 17,000 elements, from the sizes.

    With compute in 2 bytes (bf16), a reduce in ``r`` bytes (4 for fp32, 2 for bf16) and my segments' fp32
    master, Adam state and gradients (4 bytes each):

    * parameters: the bf16 copy, 2Ψ, at every stage (ZeRO-3 gathers it whole while it computes);
    * optimiser state, the ZeRO paper's K = 12 on my segments: the fp32 master, m and v, 12·Σseg, plus
      Adam's step counter (4 bytes per segment);
    * gradients: a bucket of bf16 gradients is cast to the reduce dtype before it is reduced (a copy when
      ``r`` = 4) and my fp32 segment is made from the result. ZeRO-1 keeps the whole bf16 buffer (2Ψ) and
      reduces bucket by bucket in the step: 2Ψ + max_b(c·size_b + 4·Σ_{k≤b} seg_k); ZeRO-2/3 hold one
      bucket at a time during backward: max_b((2 + c)·size_b + 4·Σ_{k≤b} seg_k), with ``c`` = ``r`` when the
      cast copies and 0 when it does not.

    Planted bugs, seen failing: the cast buffer not counted (``_reducing`` left out of ``held_tensors``:
    "rank 0, ZeRO-1 bf16: gradient peak 349440 != 408660"); the master kept whole on every rank (each piece
    a view of a full copy: "optimiser state 3214876", not 12·34944 + 4·7).
    """
    from coursekit.collectives import owned_segment, segment_bounds
    from coursekit.models import count_parameters, tiny_transformer
    world_size, capacity = 3, 17_000
    psi = count_parameters(tiny_transformer())
    cast = 4 if as_policy(precision).reduce_dtype == torch.float32 else 0
    results = coursekit.launch(peaks, world_size, precision, capacity, timeout=240)
    sizes = results[0][1]
    assert sum(sizes) == psi and len(sizes) > 4, sizes
    for r in range(world_size):
        segments = [stop - start for start, stop in (segment_bounds(n, world_size)[owned_segment(r, world_size)]
                                                     for n in sizes)]
        mine, pieces = sum(segments), sum(1 for n in segments if n)
        one_bucket = [4 * sum(segments[:b + 1]) for b in range(len(sizes))]   # my fp32 segments so far
        expected = {
            1: 2 * psi + max(cast * size + so_far for size, so_far in zip(sizes, one_bucket)),
            2: max((2 + cast) * size + so_far for size, so_far in zip(sizes, one_bucket)),
        }
        expected[3] = expected[2]
        for stage in (1, 2, 3):
            peak = results[r][0][stage]
            assert peak["params"] == 2 * psi, f"rank {r}, ZeRO-{stage}: the bf16 parameters, {peak['params']}"
            assert peak["optimizer"] == 12 * mine + 4 * pieces, \
                f"rank {r}, ZeRO-{stage}: fp32 master + Adam's m, v on my segments, {peak['optimizer']}"
            assert peak["grads"] == expected[stage], \
                f"rank {r}, ZeRO-{stage} {precision}: gradient peak {peak['grads']} != {expected[stage]}"
            library = mixed_peak_held_bytes(psi, world_size, r, stage, sizes, reduce_bytes=4 if cast else 2)
            assert {k: peak[k] for k in library} == library, f"rank {r}, ZeRO-{stage}: coursekit.measure.memory's formula"


def grad_scaler_reference(world_size: int, init_scale: float, steps: int):
    """One process, fp16 compute copy and fp32 master stepped through ``torch.amp.GradScaler`` (PyTorch's own)."""
    policy = as_policy("fp16")
    net, data = make_model("mlp", seed=0)
    names = [name for name, _ in net.named_parameters()]
    master = [torch.nn.Parameter(p.detach().clone()) for p in net.parameters()]
    compute = copy.deepcopy(net).to(torch.float16)
    optimizer = torch.optim.Adam(master, lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    records, scales = [], []
    for step in range(steps):
        x, y = data.batch(step, BATCH)
        summed, total_loss = [torch.zeros_like(p) for p in master], 0.0
        for r in range(world_size):
            xr, yr, weight = shard_batch(x, y, r, world_size)
            compute.zero_grad()
            loss = loss_fn(compute(xr.to(torch.float16)).to(policy.output_dtype), yr) * weight
            total_loss += loss.item() / world_size
            scaler.scale(loss).backward()
            for total, p in zip(summed, compute.parameters()):
                total += p.grad.float()
        for p, total in zip(master, summed):
            p.grad = total / world_size
        scaler.step(optimizer)       # unscales, skips the step if any gradient is inf or NaN
        scaler.update()
        scales.append(scaler.get_scale())
        with torch.no_grad():
            for c, p in zip(compute.parameters(), master):
                c.copy_(p)
        records.append(record_step(None, total_loss, dict(zip(names, [p.grad for p in master])),
                                   dict(zip(names, master))))
    return records, scales


def fp16_zero(rank, world_size, stage, init_scale, steps):
    from coursekit.parallel.data import LossScaler
    result = train(rank, world_size, f"zero{stage}", steps=steps, global_batch=BATCH, precision="fp16",
                   loss_scaler=LossScaler(init_scale=init_scale))
    return result["records"], result["loss_scale"], result["skipped_steps"], result["inf_checks"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fp16_loss_scaling_skips_the_steps_torch_grad_scaler_skips(stage):
    """fp16 with a loss scale far too large: the first steps overflow on some rank, every rank skips them and
    halves the scale, as ``torch.amp.GradScaler`` does; then both train alike (3 ranks, batch 7).

    Planted bugs, seen failing: the overflow checked on my segments only (no all-reduce of the flag: a rank
    whose segments stayed finite stepped, "(131072.0, 7, 12) == (65536.0, 8, 12)"); the gradients not
    unscaled ("grad 'layers.0.weight' ... expected 0.00592899, got 388.562").
    """
    world_size, init_scale, steps = 3, 2.0 ** 24, 12
    reference, scales = grad_scaler_reference(world_size, init_scale, steps)
    skipped = sum(1 for before, after in zip([init_scale] + scales, scales) if after < before)
    assert 0 < skipped < steps - 2, f"the case must skip some steps and then train (skipped {skipped})"
    results = coursekit.launch(fp16_zero, world_size, stage, init_scale, steps, timeout=180)
    for records, scale, skips, checks in results:
        assert (scale, skips, checks) == (scales[-1], skipped, steps), (scale, skips, checks)
    ranks = [records[skipped:] for records, *_ in results]
    report = compare(reference[skipped:], ranks, check_output=False, rtol=1e-4, atol=1e-6)
    assert report.ok, f"ZeRO-{stage} fp16 against GradScaler after the skipped steps: {report}"


def units_bf16(rank, world_size):
    return train(rank, world_size, "zero3_units", steps=STEPS, global_batch=BATCH, precision="bf16")["records"]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_zero3_units_bf16_equals_the_hand_written_loop(world_size):
    """ZeRO-3 one unit at a time (each MLP layer a unit) in bf16: fp32 gradients and master equal to the reference.

    Planted bug, seen failing: a unit's gradient reduce-scattered in bf16 (``reduce_dtype`` ignored): "grad
    'layers.0.weight' ... expected -0.00392151, got -0.00390625".
    """
    ranks = coursekit.launch(units_bf16, world_size, timeout=120)
    report = compare(hand_written(world_size, as_policy("bf16")), ranks, check_output=False)
    assert report.ok, f"zero3_units bf16 at {world_size} ranks: {report}"


def fsdp_and_units(rank, world_size):
    kw = dict(steps=STEPS, global_batch=BATCH, precision="bf16", model="transformer")
    return train(rank, world_size, "torch_fsdp", **kw)["records"], train(rank, world_size, "zero3_units", **kw)["records"]


def test_zero3_units_bf16_equals_fsdp2_unit_for_unit():
    """The same units as FSDP2's (each block, then the root) and the same policy: equal step by step, 3 ranks.

    Planted bug, seen failing: the units kept in fp32 (``param_dtype`` not handed to ``Unit``): "grad
    'tok_emb.weight' ... expected -0.0082194, got -0.00817252" (140 divergences).
    """
    results = coursekit.launch(fsdp_and_units, 3, timeout=240)
    report = compare(results[0][0], [units for _, units in results], check_output=False, rtol=1e-4, atol=1e-6)
    assert report.ok, f"zero3_units bf16 against FSDP2 bf16: {report}"


def fsdp_and_units_fp16(rank, world_size):
    from coursekit.parallel.data import LossScaler
    runs = []
    for strategy in ("torch_fsdp", "zero3_units"):
        result = train(rank, world_size, strategy, steps=12, global_batch=BATCH, precision="fp16", model="transformer",
                       loss_scaler=LossScaler(init_scale=2.0 ** 24))
        runs.append((result["records"], result["loss_scale"], result["skipped_steps"], result.get("inf_checks")))
    return runs


def test_zero3_units_fp16_equals_fsdp2_with_grad_scaler():
    """fp16 one unit at a time with a dynamic loss scale, against FSDP2 with the same policy and
    ``torch.amp.GradScaler``: the same steps skipped (the scale from 2^24 down), one all-reduce of the overflow
    flag a step (each rank sees only its segments), then equal step by step (3 ranks, batch 7).

    Planted bugs, seen failing: the flag not all-reduced (each rank judged its own segments: "rank 0: (524288.0,
    5, 0) != (131072.0, 7, 12)": rank 0 stepped on gradients another rank saw overflow); the scale hook not
    registered ("rank 0: (16777216.0, 0, 12) != (131072.0, 7, 12)").
    """
    results = coursekit.launch(fsdp_and_units_fp16, 3, timeout=240)
    (reference, scale, skipped, _), _ = results[0]
    assert 0 < skipped < 10, f"the case must skip some steps and then train (skipped {skipped})"
    for rank, (_, (records, got_scale, got_skipped, checks)) in enumerate(results):
        assert (got_scale, got_skipped, checks) == (scale, skipped, 12), \
            f"rank {rank}: {(got_scale, got_skipped, checks)} != {(scale, skipped, 12)}"
    report = compare(reference[skipped:], [units[0][skipped:] for _, units in results], check_output=False,
                     rtol=1e-4, atol=1e-6)
    assert report.ok, f"zero3_units fp16 against FSDP2 + GradScaler after the skipped steps: {report}"


def fp16_without_scaling(rank, world_size):
    result = train(rank, world_size, "zero2", steps=2, global_batch=BATCH, precision="fp16", loss_scaler=False,
                   record=False)
    return result["loss_scale"], result["skipped_steps"], result["inf_checks"], result["losses"]


def test_fp16_without_a_loss_scaler_when_asked():
    """``loss_scaler=False``: fp16 runs unscaled (no scale, no skipped step, no overflow check), to show what
    loss scaling is for. Planted bug, seen failing: False read as "the default" (a dynamic scaler made anyway:
    the scale and the checks reported)."""
    for scale, skipped, checks, losses in coursekit.launch(fp16_without_scaling, 2, timeout=120):
        assert (scale, skipped, checks) == (None, 0, 0) and all(loss == loss for loss in losses)
