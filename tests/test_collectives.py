"""coursekit.collectives: correct sums, bit-identical ranks, exact traffic, the seed's worked example."""

import math

import pytest
import torch
import torch.distributed as dist

import coursekit
from coursekit import comm
from coursekit.collectives import (master_all_reduce, naive_all_reduce, owned_segment, replay, ring_all_gather,
                                   ring_all_reduce, ring_reduce_scatter, ring_traffic, ring_walkthrough,
                                   segment_bounds)

ALGORITHMS = {"naive": naive_all_reduce, "master": master_all_reduce, "ring": ring_all_reduce}
TIMEOUT = 180.0


def _input(rank, numel, dtype):
    generator = torch.Generator().manual_seed(1000 * rank + numel)
    return torch.randn(numel, generator=generator, dtype=torch.float64).to(dtype)


def _reference(world_size, numel, dtype):
    """Single-process reference: the float64 sum of every rank's input."""
    return sum(_input(r, numel, dtype).double() for r in range(world_size))


def _against_torch(rank, world_size, cases):
    out = []
    for numel, dtype in cases:
        x = _input(rank, numel, dtype)
        theirs = x.float().clone()
        dist.all_reduce(theirs)  # gloo sums float32; our float16/bfloat16 sums are compared with it loosely
        row = {"numel": numel, "dtype": str(dtype), "torch": theirs}
        for name, fn in ALGORITHMS.items():
            mine = x.clone()
            returned = fn(mine)
            assert returned is mine, f"{name} must work in place and return its tensor"
            row[name] = mine
        out.append(row)
    return out


CASES = [(n, torch.float32) for n in (0, 1, 3, 4, 10, 37, 1000)] + \
        [(37, torch.float64), (37, torch.float16), (37, torch.bfloat16)]
TOLERANCE = {"torch.float32": 1e-5, "torch.float64": 1e-5, "torch.float16": 1e-2, "torch.bfloat16": 5e-2}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_matches_torch_all_reduce_and_reference_bit_identical_on_every_rank(world_size):
    results = coursekit.launch(_against_torch, world_size, CASES, timeout=TIMEOUT)
    for index, (numel, dtype) in enumerate(CASES):
        reference = _reference(world_size, numel, dtype)
        scale = max(1.0, reference.abs().max().item() if numel else 1.0)
        for name in ALGORITHMS:
            first = results[0][index][name]
            assert first.dtype == dtype and first.shape == (numel,)
            for rank in range(world_size):  # every rank bit-identical: replicas must not drift
                assert torch.equal(results[rank][index][name], first), (name, numel, dtype, rank)
            tol = TOLERANCE[str(dtype)] * scale
            assert torch.allclose(first.double(), reference, atol=tol, rtol=0), (name, numel, dtype)
            assert torch.allclose(first.double(), results[0][index]["torch"].double(), atol=tol, rtol=0)


def test_world_size_one_changes_nothing_and_sends_nothing():
    def run(rank, world_size):
        x = torch.arange(5.0)
        with comm.record() as traffic:
            outs = [fn(x.clone()) for fn in ALGORITHMS.values()]
            segment = ring_reduce_scatter(x.clone())
        return outs, segment, traffic

    outs, segment, traffic = coursekit.launch(run, 1, timeout=TIMEOUT)[0]
    assert all(torch.equal(o, torch.arange(5.0)) for o in outs) and torch.equal(segment, torch.arange(5.0))
    assert traffic.transfers == []


def _subgroups(rank, world_size):
    pair, triple = dist.new_group([1, 3]), dist.new_group([0, 2, 3])  # every rank must create every group
    x = torch.full((7,), float(rank + 1))
    out = {}
    for label, ranks, group in (("pair", [1, 3], pair), ("triple", [0, 2, 3], triple)):
        if rank in ranks:
            with comm.record() as traffic:
                out[label] = {name: fn(x.clone(), group=group) for name, fn in ALGORITHMS.items()}
            out[label + "_traffic"] = traffic
            ref = x.clone()
            dist.all_reduce(ref, group=group)
            out[label + "_torch"] = ref
    return out


def test_subset_groups_sum_only_their_ranks_and_count_global_ranks():
    results = coursekit.launch(_subgroups, 4, timeout=TIMEOUT)
    for label, ranks in (("pair", [1, 3]), ("triple", [0, 2, 3])):
        expected = torch.full((7,), float(sum(r + 1 for r in ranks)))
        for rank in ranks:
            assert torch.equal(results[rank][label + "_torch"], expected)
            for name in ALGORITHMS:
                assert torch.equal(results[rank][label][name], expected), (label, name, rank)
        traffic = comm.Traffic.merge([results[r][label + "_traffic"] for r in ranks])
        assert {t.src for t in traffic.transfers} | {t.dst for t in traffic.transfers} == set(ranks)


def test_non_contiguous_input_is_handled_or_rejected_clearly():
    def run(rank, world_size):
        base = torch.arange(12.0).reshape(3, 4) * (rank + 1)
        outs = {name: fn(base.clone().t()) for name, fn in ALGORITHMS.items()}
        try:
            ring_reduce_scatter(base.clone().t())
            error = None
        except ValueError as exc:
            error = str(exc)
        return outs, error

    results, _ = comm.simulate(run, 3)
    expected = torch.arange(12.0).reshape(3, 4).t() * 6
    for outs, error in results:
        for name, out in outs.items():
            assert torch.equal(out, expected) and not out.is_contiguous(), name
        assert "contiguous" in error and ".contiguous()" in error


def _mismatched(rank, world_size, lengths, name):
    ALGORITHMS[name](torch.ones(lengths[rank]))


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("lengths", [[4, 4, 5, 5], [5, 4, 4, 4]])
def test_mismatched_lengths_raise_a_clear_error_on_real_ranks(name, lengths):
    # a clear error from the rank that noticed, never gloo aborting a rank (SIGABRT) or a hang
    with pytest.raises(coursekit.RankError, match="same length"):
        coursekit.launch(_mismatched, 4, lengths, name, timeout=TIMEOUT)


def _mismatched_dtype(rank, world_size, name):
    ALGORITHMS[name](torch.ones(4, dtype=torch.float64 if rank == 1 else torch.float32))


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_mismatched_dtypes_raise_a_clear_error_on_real_ranks(name):
    """Planted bug: LengthCheck compares lengths only -- gloo then aborts a rank ("16 vs 8") instead."""
    with pytest.raises(coursekit.RankError) as caught:
        coursekit.launch(_mismatched_dtype, 3, name, timeout=TIMEOUT)
    message = str(caught.value)
    assert "4 elements of torch.float64" in message and "4 elements of torch.float32" in message, message
    assert "same length and dtype" in message, message


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_mismatched_lengths_or_dtypes_raise_in_the_simulator(name):
    with pytest.raises(comm.SimulatorError, match=r"has [45] elements of torch.float32 but rank \d has [45] elements.*same length"):
        comm.simulate(_mismatched, 3, [4, 4, 5], name)
    with pytest.raises(comm.SimulatorError, match="float64"):
        comm.simulate(lambda r, g: ALGORITHMS[name](torch.ones(4, dtype=torch.float64 if r else torch.float32)), 2)


# ---------------------------------------------------------------- traffic, counted exactly
def _count(rank, world_size, name, numel):
    with comm.record() as traffic:
        ALGORITHMS[name](torch.ones(numel))
    return traffic


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_traffic_is_exactly_the_formula(world_size):
    numel = 7 * world_size + 3  # not divisible by world_size
    G, N = world_size, numel
    naive = comm.simulate(_count, G, "naive", N).traffic
    assert naive.total == G * (G - 1) * N
    assert naive.sent == naive.received == {r: (G - 1) * N for r in range(G)}
    assert len(naive.control) == G * (G - 1)

    master = comm.simulate(_count, G, "master", N).traffic
    assert master.total == 2 * (G - 1) * N
    assert all(0 in link for link in master.links)  # every element goes into or out of the root
    assert master.sent[0] == master.received[0] == (G - 1) * N and master.busiest_rank == 0
    assert all(master.sent[r] == master.received[r] == N for r in range(1, G))

    ring = comm.simulate(_count, G, "ring", N).traffic
    assert ring.total == 2 * (G - 1) * N
    assert ring.sent == ring_traffic(N, G)
    lengths = [b - a for a, b in segment_bounds(N, G)]
    for r in range(G):
        assert ring.sent[r] == 2 * N - lengths[(r + 1) % G] - lengths[(r + 2) % G]
    assert set(ring.links) == {(r, (r + 1) % G) for r in range(G)}  # neighbours only
    assert max(t.numel for t in ring.payload) == math.ceil(N / G)  # segments, never whole tensors
    assert ring.messages == 2 * (G - 1) * G
    assert max(ring.sent.values()) - min(ring.sent.values()) <= 2
    assert len(ring.control) == G


def test_ring_traffic_divisible_and_tiny_lengths():
    assert ring_traffic(12, 4) == {r: 2 * 3 * 12 // 4 for r in range(4)}
    traffic = comm.simulate(_count, 5, "ring", 3).traffic  # two segments empty: not sent at all
    assert traffic.total == 2 * 4 * 3 and traffic.sent == ring_traffic(3, 5)
    assert all(t.numel == 1 for t in traffic.payload)
    assert comm.simulate(_count, 3, "ring", 0).traffic.total == 0


def _traced(rank, world_size, numel):
    traces = {}
    for name, fn in ALGORITHMS.items():
        with comm.record() as traffic:
            fn(torch.ones(numel))
        traces[name] = traffic
    return traces


def test_simulator_trace_equals_real_trace():
    real = coursekit.launch(_traced, 4, 11, timeout=TIMEOUT)
    simulated = comm.simulate(_traced, 4, 11).results
    for name in ALGORITHMS:
        real_traffic = comm.Traffic.merge([r[name] for r in real])
        sim_traffic = comm.Traffic.merge([r[name] for r in simulated])
        assert real_traffic.trace() == sim_traffic.trace() and real_traffic.trace(), name
        assert real_traffic.total == {"naive": 4 * 3 * 11, "master": 2 * 3 * 11, "ring": 2 * 3 * 11}[name]


# ---------------------------------------------------------------- the seed's worked example (R5, R6)
SEED_ITERATION_1 = ["GPU1 sends a₁ to GPU2, added to b₁", "GPU2 sends b₂ to GPU3, added to c₂",
                    "GPU3 sends c₃ to GPU4, added to d₃", "GPU4 sends d₄ to GPU1, added to a₄"]
SEED_ITERATION_2 = ["GPU1 sends (d₄+a₄) to GPU2, added to b₄", "GPU2 sends (a₁+b₁) to GPU3, added to c₁",
                    "GPU3 sends (b₂+c₂) to GPU4, added to d₂", "GPU4 sends (c₃+d₃) to GPU1, added to a₃"]


def _check_seed_example(steps):
    assert [(s.phase, s.step) for s in steps] == [("reduce-scatter", i) for i in range(3)] + \
        [("all-gather", i) for i in range(3)]
    assert steps[0].describe() == SEED_ITERATION_1
    assert steps[1].describe() == SEED_ITERATION_2
    after_reduce = steps[2].state
    for rank in range(4):  # "afterwards every GPU holds one complete segment"
        complete = [k for k in range(4) if len(after_reduce[rank][k]) == 4]
        assert complete == [owned_segment(rank, 4)]
        assert sorted(after_reduce[rank][complete[0]]) == sorted(f"{l}{'₁₂₃₄'[complete[0]]}" for l in "abcd")
    # all-gather: the complete segments travel the same ring; at the end every GPU holds every sum
    for src, dst, k, value in steps[3].sends:
        assert dst == (src + 1) % 4 and k == owned_segment(src, 4) and len(value) == 4
    final = steps[-1].state
    for rank in range(4):
        for k in range(4):
            assert sorted(final[rank][k]) == sorted(f"{l}{'₁₂₃₄'[k]}" for l in "abcd")
            assert final[rank][k] == final[0][k]


def test_seed_worked_example_from_the_simulator():
    _check_seed_example(ring_walkthrough(4))


def test_seed_worked_example_from_a_real_4_rank_run():
    def run(rank, world_size):
        with comm.record() as traffic:
            ring_all_reduce(torch.full((4,), float(rank)))
        return traffic

    traffic = comm.Traffic.merge(coursekit.launch(run, 4, timeout=TIMEOUT))
    _check_seed_example(replay(traffic, 4))


@pytest.mark.parametrize("world_size", [2, 3, 5, 8])
def test_walkthrough_ends_fully_reduced_for_other_world_sizes(world_size):
    steps = ring_walkthrough(world_size)
    assert len(steps) == 2 * (world_size - 1)
    assert all(len(cell) == world_size for row in steps[-1].state for cell in row)


# ---------------------------------------------------------------- the two phases on their own
def test_reduce_scatter_returns_owned_segment_and_all_gather_restores_the_sum():
    def run(rank, world_size, numel):
        x = torch.arange(float(numel)) * (rank + 1)
        mine = ring_reduce_scatter(x)
        owned = mine.clone()
        out = torch.zeros(numel)
        ring_all_gather(owned, out)
        return owned, out

    for G, N in ((3, 10), (4, 3)):
        results, _ = comm.simulate(run, G, N)
        full = torch.arange(float(N)) * sum(range(1, G + 1))
        for rank, (owned, out) in enumerate(results):
            start, stop = segment_bounds(N, G)[owned_segment(rank, G)]
            assert torch.equal(owned, full[start:stop]) and torch.equal(out, full)


def test_all_gather_rejects_a_segment_of_the_wrong_length():
    with pytest.raises(comm.SimulatorError, match="owns segment"):
        comm.simulate(lambda r, g: ring_all_gather(torch.ones(4), torch.zeros(10)), 2)


def _unchecked(rank, world_size, numel):
    x = torch.arange(float(numel)) * (rank + 1)
    with comm.record() as traffic:
        ring_all_reduce(x, check_lengths=False)
        mine = ring_reduce_scatter(torch.ones(numel), check_lengths=False).clone()
        ring_all_gather(mine, torch.zeros(numel), check_lengths=False)
    return x, traffic


def test_check_lengths_false_sends_no_control_message_and_the_same_payload():
    """For callers whose lengths match by construction (ZeRO's buffers): no control message, the same
    payload traffic and result. Seen failing with the planted bug "check_lengths ignored" (``_check``
    always building a LengthCheck): "9 control messages with check_lengths=False" (3 calls on 3 ranks).
    """
    G, N = 3, 11
    results, _ = comm.simulate(_unchecked, G, N)
    traffic = comm.Traffic.merge([t for _, t in results])
    assert len(traffic.control) == 0, f"{len(traffic.control)} control messages with check_lengths=False"
    assert traffic.total == 2 * (G - 1) * N + 2 * (G - 1) * N  # all-reduce, then reduce-scatter + all-gather
    for x, _ in results:
        assert torch.equal(x, torch.arange(float(N)) * sum(range(1, G + 1)))
