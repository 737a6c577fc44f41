"""Data parallelism and ZeRO-1/2/3 equal single-process training; traffic and memory match the formulas exactly."""

import pytest
import torch

import coursekit
from coursekit.collectives import owned_segment, ring_traffic, segment_bounds
from coursekit.measure.memory import comm_elements, expected_held_bytes, formula_bytes, peak_held_bytes
from coursekit.models import TeacherData, loss_fn, tiny_mlp
from coursekit.parallel.data import DataParallel, ZeRO, average_gradients, broadcast_parameters, shard_batch
from coursekit.train import train
from coursekit.measure.verify import assert_equivalent, compare

from strategy_options import config_for

STRATEGIES = ("naive", "bucketed", "zero1", "zero2", "zero3")
PSI_MLP = 5508  # tiny_mlp(): 16*64+64 + 64*64+64 + 64*4+4, divisible by 1, 2, 3, 4


def _all_strategies(rank, world_size, configs):
    """Run every (strategy, kwargs) on the same ranks (one launch instead of many)."""
    return [train(rank, world_size, strategy, **config_for(strategy, kwargs)) for strategy, kwargs in configs]


_references: dict = {}


def _reference(**kwargs):
    """The single-process run (cached: several tests compare against the same one)."""
    key = repr(sorted(kwargs.items()))
    if key not in _references:
        _references[key] = train(0, 1, "single", **config_for("single", kwargs))["records"]
    return _references[key]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_strategy_equals_one_process(world_size):
    """Adam and SGD-momentum, 3 steps, a global batch of 10 (not divisible by 3 or 4), ring and torch collectives.

    Chapter 01's ring runs at every world size (planted bug caught: ZeRO taking segment ``rank`` instead of
    the ring's owned segment ``(rank + 1) % G`` at even G only).
    """
    configs = []
    for optimizer, lr, collectives in (("adam", 1e-2, "ring"), ("sgd", 0.1, "torch")):
        common = dict(model="mlp", steps=3, global_batch=10, optimizer=optimizer, lr=lr, bucket_elements=2000,
                      collectives=collectives)
        configs += [(s, common) for s in STRATEGIES]
    results = coursekit.launch(_all_strategies, world_size, configs, timeout=240)
    for i, (strategy, kwargs) in enumerate(configs):
        reference = _reference(**kwargs)
        report = compare(reference, [results[r][i]["records"] for r in range(world_size)])
        assert report.ok, f"{strategy}/{kwargs['optimizer']} on {world_size} ranks: {report}"
        losses = [results[r][i]["losses"] for r in range(world_size)]
        assert all(l == losses[0] for l in losses), "every rank reports the same global loss"


def test_transformer_with_tied_weights_and_a_frozen_parameter():
    common = dict(model="transformer", steps=2, global_batch=6, optimizer="adam", lr=1e-3, collectives="ring",
                  bucket_elements=20_000, freeze=("pos_emb.weight",))
    configs = [(s, common) for s in STRATEGIES]
    results = coursekit.launch(_all_strategies, 3, configs, timeout=240)
    reference = _reference(**common)
    assert "pos_emb.weight" not in reference[0]["grads"]
    assert "tok_emb.weight" in reference[0]["grads"] and "head.weight" not in reference[0]["grads"]  # tied: once
    for i, (strategy, _) in enumerate(configs):
        assert_equivalent(reference, [results[r][i]["records"] for r in range(3)])
    # the frozen parameter was never sharded nor updated: every rank still holds it, unchanged
    for r in range(3):
        for i in (2, 3, 4):  # zero1..3
            shards = results[r][i]["records"][0]["params"]  # one FlatShard per bucket
            assert all("pos_emb.weight" not in dict(shard.layout) for shard in shards)
            assert "pos_emb.weight" in shards[0].replicated


def test_gradient_accumulation_communicates_once_per_step():
    common = dict(model="mlp", steps=3, global_batch=24, optimizer="sgd", lr=0.1, collectives="torch",
                  bucket_elements=1000)
    configs = [(s, dict(common, micro_batches=3)) for s in ("bucketed", "zero2")]
    results = coursekit.launch(_all_strategies, 2, configs, timeout=240)
    reference = _reference(**common)  # one big batch per step, no accumulation
    for i in range(len(configs)):
        assert_equivalent(reference, [results[r][i]["records"] for r in range(2)])
    # bucketed: every trainable element all-reduced exactly once per step, not once per micro-batch
    assert results[0][0]["elements_reduced"] == 3 * PSI_MLP


def _traffic(rank, world_size, strategies):
    out = []
    for strategy in strategies:
        result = train(rank, world_size, strategy, **config_for(strategy, dict(
            model="mlp", steps=2, global_batch=8, collectives="ring", count_traffic=True, record=False)))
        out.append((result["traffic"], result["memory"]))
    return out


@pytest.mark.parametrize("world_size", [3, 4])
def test_traffic_and_memory_match_the_formulas_exactly(world_size):
    strategies = ("naive", "zero1", "zero2", "zero3")
    results = coursekit.launch(_traffic, world_size, strategies, timeout=240)
    steps = 2
    for i, strategy in enumerate(strategies):
        traffic = coursekit.comm.Traffic.merge([results[r][i][0] for r in range(world_size)])
        stage = 0 if strategy == "naive" else int(strategy[-1])
        # total over all ranks: 2(N-1)Ψ per step (3(N-1)Ψ for ZeRO-3) ...
        assert traffic.total == steps * comm_elements(PSI_MLP, world_size, stage), strategy
        if stage:
            # ... which is 2Ψ(N-1)/N (3Ψ(N-1)/N) sent by every rank, Ψ divisible by N here
            per_rank = (3 if stage == 3 else 2) * PSI_MLP * (world_size - 1) // world_size
            assert traffic.sent == {r: steps * per_rank for r in range(world_size)}, strategy
        else:  # one ring all-reduce per parameter tensor: small tensors split unevenly over the ranks
            sizes = [p.numel() for p in tiny_mlp().parameters()]
            expected = {r: steps * sum(ring_traffic(n, world_size)[r] for n in sizes) for r in range(world_size)}
            assert traffic.sent == expected
        for r in range(world_size):
            memory = results[r][i][1]
            assert memory == expected_held_bytes(PSI_MLP, 6, world_size, r, stage), (strategy, r)
            formula = formula_bytes(PSI_MLP, world_size, stage)
            assert memory["params"] == formula["params"] and memory["grads"] == formula["grads"]
            assert memory["optimizer"] - formula["optimizer"] == (4 if stage else 4 * 6)  # Adam's step counters


def test_memory_shards_are_uneven_when_psi_does_not_divide():
    """Ψ = 5508 on 5 ranks: segments of 1102 and 1101 elements; each rank holds exactly its own."""
    results = coursekit.launch(lambda r, n: train(r, n, "zero3", steps=1, global_batch=5, collectives="torch",
                                                  record=False)["memory"], 5, timeout=240)
    sizes = set()
    for r, memory in enumerate(results):
        start, stop = segment_bounds(PSI_MLP, 5)[owned_segment(r, 5)]
        sizes.add(stop - start)
        assert memory == {"params": 4 * (stop - start), "grads": 4 * (stop - start),
                          "optimizer": 8 * (stop - start) + 4}
    assert sizes == {1101, 1102}


def _peaks(rank, world_size, bucket_elements):
    runs = [train(rank, world_size, s, **config_for(s, dict(model="transformer", steps=2, global_batch=6,
                  collectives="ring", record=False, bucket_elements=bucket_elements)))
            for s in ("naive", "zero1", "zero2", "zero3")]
    return [run["peak_memory"] for run in runs], runs[2]["bucket_sizes"]


def _buckets_backward_first(model, capacity):
    """Bucket sizes as the docs state the rule: whole parameters, last first, a new bucket when one would overflow."""
    sizes, current = [], 0
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        if current and current + p.numel() > capacity:
            sizes.append(current)
            current = 0
        current += p.numel()
    return sizes + [current]


def test_peak_memory_zero2_holds_its_shard_and_one_bucket_not_every_gradient():
    """Peak bytes during the step (not after it), per rank, against the formulas; course transformer, 3 ranks.

    Plain data parallelism and ZeRO-1 hold every gradient at the end of backward: 4Ψ bytes. ZeRO-2
    reduce-scatters each bucket as backward completes it and frees it, so at the moment bucket b is
    reduced a rank holds that bucket and its segments of buckets 0..b: 4·max_b(size_b + Σ_{k≤b} seg_k),
    below plain data parallelism by the difference. ZeRO-3 (whole-model gather) holds the full
    parameters on top of its own segments while it computes: 4(Ψ + Σ seg).

    Seen failing with the planted bugs "ZeRO-2 keeps each bucket's full gradient after reduce-scattering
    it" (``bucket.grad = None`` dropped: "rank 0: ZeRO-2's gradient peak 559104 != 198996") and "memory
    measured by the loop only, not inside backward" (ZeRO's ``peak.note`` before freeing a bucket
    dropped: "... peak 139776 != 198996", just the shard).
    """
    from coursekit.models import count_parameters, tiny_transformer
    world_size, capacity = 3, 17_000
    psi = count_parameters(tiny_transformer())
    sizes = _buckets_backward_first(tiny_transformer(), capacity)
    assert len(sizes) > 4 and max(sizes) < psi / 4, sizes  # several buckets, each well below the model
    results = coursekit.launch(_peaks, world_size, capacity, timeout=240)
    assert results[0][1] == sizes, "ZeRO's buckets are not the documented packing"
    n_tensors = len([p for p in tiny_transformer().parameters()])
    for r in range(world_size):
        naive, zero1, zero2, zero3 = results[r][0]
        for stage, peak in enumerate(results[r][0]):  # the library's formula (drawn in chapter 02) agrees
            formula = peak_held_bytes(psi, n_tensors, world_size, r, stage, sizes if stage else None)
            assert {k: peak[k] for k in formula} == formula, f"rank {r}, stage {stage}"
        segments = [stop - start for start, stop in (segment_bounds(n, world_size)[owned_segment(r, world_size)]
                                                     for n in sizes)]
        mine = sum(segments)
        for name, peak in (("naive", naive), ("zero1", zero1)):
            assert peak["grads"] == 4 * psi, f"rank {r}, {name}: every gradient exists at the end of backward"
        expected = 4 * max(size + sum(segments[:b + 1]) for b, size in enumerate(sizes))
        assert zero2["grads"] == expected, f"rank {r}: ZeRO-2's gradient peak {zero2['grads']} != {expected}"
        assert zero3["grads"] == expected, f"rank {r}: ZeRO-3 frees gradients as ZeRO-2 does"
        assert [p["params"] for p in (naive, zero1, zero2)] == [4 * psi] * 3, f"rank {r}"
        assert zero3["params"] == 4 * (psi + mine), f"rank {r}: full gather + own segments"
        pieces = sum(1 for n in segments if n)
        assert zero2["optimizer"] == zero1["optimizer"] == 8 * mine + 4 * pieces, f"rank {r}: Adam's m, v, steps"


def _timeline(rank, world_size):
    kw = dict(model="mlp", steps=2, global_batch=16, record=False, trace=True, bucket_elements=1000)
    return [train(rank, world_size, "bucketed", overlap=o, **kw)["spans"] for o in (True, False)]


def test_bucketed_all_reduce_starts_inside_backward_only_when_overlapping():
    overlapped, waiting = coursekit.launch(_timeline, 2, timeout=120)[0]
    for spans, should_overlap in ((overlapped, True), (waiting, False)):
        for rank in (0, 1):
            backward = [s for s in spans if s.rank == rank and s.kind == "backward"]
            idle = [s for s in spans if s.rank == rank and s.kind == "idle"]  # the wait at the end of backward
            comm = [s for s in spans if s.rank == rank and s.kind == "comm"]
            assert len(comm) == 2 * 4  # 4 buckets per step (see test_bucket_layout)
            started_inside = [any(b.start <= c.start < b.end for b in backward)
                              and not any(i.start <= c.start < i.end for i in idle) for c in comm]
            if should_overlap:
                assert sum(started_inside) >= 2 * 3, "all but the last bucket start during backward"
            else:
                assert not any(started_inside), "without overlap, nothing starts before backward ends"


def test_bucket_layout():
    model = DataParallel(tiny_mlp(seed=0), bucket_elements=1000)
    sizes = [b.buffer.numel() for b in model.buckets]
    assert sum(sizes) == PSI_MLP
    # reverse order of the forward pass; a parameter larger than the bucket gets one of its own
    assert [p.shape for p in model.buckets[0].params] == [torch.Size([4]), torch.Size([4, 64]), torch.Size([64])]
    assert sizes == [4 + 256 + 64, 4096, 64, 1024]
    assert all(p.grad.data_ptr() >= b.buffer.data_ptr() for b in model.buckets for p in b.params)  # views
    one = DataParallel(tiny_mlp(seed=0), bucket_cap_mb=None)
    assert len(one.buckets) == 1


def test_bad_input_is_rejected_with_what_to_do():
    with pytest.raises(ValueError, match="at least 4"):
        shard_batch(torch.zeros(3), torch.zeros(3), 0, 4)
    with pytest.raises(ValueError, match="stage must be 1"):
        ZeRO(tiny_mlp(), lambda p: torch.optim.SGD(p, lr=0.1), stage=4)
    with pytest.raises(ValueError, match="strategy="):
        train(0, 1, "zero4")
    with pytest.raises(ValueError, match="world_size=1"):
        train(0, 2, "single")
    with pytest.raises(ValueError, match="bucket_elements"):
        DataParallel(tiny_mlp(), bucket_elements=0)
    with pytest.raises(coursekit.RankError, match="cannot feed 4 ranks"):
        coursekit.launch(lambda r, n: train(r, n, "naive", global_batch=3), 4, timeout=120)


def test_uneven_batch_weights_make_the_average_exact():
    x, y = TeacherData().batch(0, 10)
    model = tiny_mlp(seed=0)
    whole = loss_fn(model(x), y)
    pieces = [shard_batch(x, y, r, 4) for r in range(4)]
    assert [p[0].shape[0] for p in pieces] == [3, 3, 2, 2]
    averaged = sum(loss_fn(model(px), py) * w for px, py, w in pieces) / 4
    assert torch.allclose(averaged, whole, atol=1e-6)


def test_average_gradients_with_torch_or_ring_is_the_same():
    def run(rank, world_size):
        out = []
        for which in ("torch", "ring"):
            from coursekit.collectives import get_collectives
            model = tiny_mlp(seed=0)
            x, y, w = shard_batch(*TeacherData().batch(0, 8), rank, world_size)
            (loss_fn(model(x), y) * w).backward()
            average_gradients(model, all_reduce=get_collectives(which).all_reduce)
            out.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        return out
    results = coursekit.launch(run, 3, timeout=120)
    for torch_grad, ring_grad in results:
        assert torch.allclose(torch_grad, ring_grad, atol=1e-7)
        assert torch.equal(ring_grad, results[0][1])  # bit-identical replicas


class _WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 2)
        self.unused = torch.nn.Linear(4, 2)  # never called: its bucket must still be synchronised

    def forward(self, x):
        return self.used(x)


def _start_and_unused(rank, world_size):
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])  # noqa: E731
    started = []
    for wrap in ("broadcast", "bucketed", "zero1", "zero3"):
        model = tiny_mlp(seed=rank)  # every rank starts different ...
        if wrap == "broadcast":
            broadcast_parameters(model)
        elif wrap == "bucketed":
            DataParallel(model)
        else:
            zero = ZeRO(model, lambda ps: torch.optim.SGD(ps, lr=0.1), stage=int(wrap[-1]), collectives="torch")
            zero._gather_params()  # stage 3 keeps only a segment between steps
        started.append(flat(model))
    torch.manual_seed(rank)
    model = DataParallel(_WithUnused(), bucket_elements=8)
    model(torch.randn(3, 4)).sum().backward()
    model.finish_gradient_synchronization()
    return started, [p.grad.clone() for p in model.parameters()]


def test_every_wrapper_starts_from_rank_zero_and_unused_parameters_do_not_hang():
    results = coursekit.launch(_start_and_unused, 3, timeout=120)
    rank0 = torch.cat([p.detach().reshape(-1) for p in tiny_mlp(seed=0).parameters()])
    for started, _ in results:
        for flat in started:
            assert torch.equal(flat, rank0)  # ... and all start from rank 0's weights
    grads = [g for _, g in results]
    for g in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(g, grads[0]))  # the used grads are averaged
    assert torch.count_nonzero(grads[0][2]) == 0 and torch.count_nonzero(grads[0][3]) == 0  # unused: zeros


def _untouched_buckets(rank, world_size):
    torch.manual_seed(rank)
    model = DataParallel(_WithUnused(), bucket_elements=8)  # unused.bias, unused.weight: one bucket each
    for p in model.module.unused.parameters():
        p.grad.fill_(rank + 1.0)  # in place, into the bucket: no hook will fire for it, and it differs per rank
    model(torch.randn(3, 4)).sum().backward()  # averaged when backward ends
    model.finish_gradient_synchronization()  # nothing left to do: must not divide again
    return [p.grad.clone() for p in model.module.unused.parameters()]


def test_a_bucket_no_hook_touched_is_still_averaged():
    """Planted bug: the end of backward skips buckets whose hooks never fired (or a second call divides again)."""
    results = coursekit.launch(_untouched_buckets, 3, timeout=120)
    for rank, grads in enumerate(results):
        for g in grads:
            assert torch.equal(g, torch.full_like(g, 2.0)), f"rank {rank}: {g.tolist()} is not the mean (1+2+3)/3"


def _four_small_layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])


def test_buckets_pack_several_tensors_each_in_backward_order():
    """Planted bug: packing closes a bucket one tensor early (``>=`` for ``>``) or never packs two tensors."""
    model = DataParallel(_four_small_layers(), bucket_elements=24)  # weights of 16 elements, biases of 4
    names = {id(p): n for n, p in model.module.named_parameters()}
    assert [[names[id(p)] for p in b.params] for b in model.buckets] == [
        ["3.bias", "3.weight", "2.bias"], ["2.weight", "1.bias"], ["1.weight", "0.bias"], ["0.weight"]]


def _packed_buckets_average(rank, world_size):
    import torch.distributed as dist

    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(rank))  # different data per rank
    plain = _four_small_layers()
    plain(x).pow(2).sum().backward()
    local = [None] * world_size
    dist.all_gather_object(local, [p.grad for p in plain.parameters()])
    model = DataParallel(_four_small_layers(), bucket_elements=24)
    model(x).pow(2).sum().backward()
    model.finish_gradient_synchronization()
    return local, [p.grad.clone() for p in model.module.parameters()]


def test_every_packed_bucket_is_averaged():
    """Planted bug: one bucket (here any of four) is never all-reduced."""
    for rank, (local, averaged) in enumerate(coursekit.launch(_packed_buckets_average, 3, timeout=120)):
        for i, got in enumerate(averaged):
            mean = sum(grads[i] for grads in local) / 3
            assert torch.allclose(got, mean, atol=1e-6), f"rank {rank}, parameter {i}: not the mean of the ranks'"
