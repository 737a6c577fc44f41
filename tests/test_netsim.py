"""The network model (coursekit.netsim) against closed forms, on traces the real collective code records.

Every test names the bug it was seen failing on (planted in netsim.py, then restored).
"""

from __future__ import annotations

import math

import pytest

from coursekit import netsim
from coursekit.netsim import Network, collective_time, collective_trace, simulate_time
from coursekit.comm.traffic import Traffic, Transfer

ALPHA, BW = 10e-6, 50e9          # 10 µs, 50 GB/s
NET = Network(bandwidth=BW, latency=ALPHA)
CASES = [(G, N) for G in (2, 3, 4, 8) for N in (16 * G, 16 * G + 1, 16 * G + G - 1, 1000)]


def _close(got: float, want: float, what: str) -> None:
    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=0.0), f"{what}: model {got!r} s, closed form {want!r} s"


@pytest.mark.parametrize("G,N", CASES)
def test_master_is_two_latencies_plus_everything_through_the_root(G, N):
    """T = 2α + 2(G−1)·N·b/B. Planted: a side's transfers not serialised (each transfer timed alone,
    the step = the slowest single transfer) -> model 2α + 2·N·b/B, fails for G ≥ 3."""
    t = collective_time("master", G, N, NET, itemsize=4)
    _close(t.total, 2 * ALPHA + 2 * (G - 1) * N * 4 / BW, f"master G={G} N={N}")
    # (a set: Traffic.steps() orders by (seq, src), which puts "broadcast" first at G = 2)
    assert {(s.phase, s.step, s.bottleneck) for s in t.steps} == {("gather", 0, (0, "net", "recv")),
                                                                    ("broadcast", 0, (0, "net", "send"))}
    _close(t.latency, 2 * ALPHA, "master latency part")


@pytest.mark.parametrize("G,N", CASES)
def test_naive_pays_one_latency_for_its_one_step(G, N):
    """T = α + (G−1)·N·b/B. Planted: latency added per transfer instead of once per side per step
    (each side pays (G−1)·α) -> fails for G ≥ 3."""
    t = collective_time("naive", G, N, NET, itemsize=4)
    _close(t.total, ALPHA + (G - 1) * N * 4 / BW, f"naive G={G} N={N}")
    assert len(t.steps) == 1


@pytest.mark.parametrize("G,N", CASES)
def test_ring_largest_segment_sets_every_step(G, N):
    """T = 2(G−1)·(α + ⌈N/G⌉·b/B). Planted: uneven segments ignored (a side's load taken as the
    step's mean transfer) -> fails where G does not divide N."""
    t = collective_time("ring", G, N, NET, itemsize=4)
    _close(t.total, 2 * (G - 1) * (ALPHA + math.ceil(N / G) * 4 / BW), f"ring G={G} N={N}")
    phases = [(s.phase, s.step) for s in t.steps]
    assert phases == [("reduce-scatter", s) for s in range(G - 1)] + [("all-gather", s) for s in range(G - 1)]
    _close(t.latency, 2 * (G - 1) * ALPHA, "ring latency part")


def test_two_level_network_hand_derived():
    """8 GPUs in nodes of 4: GPU r links to the others of its node at B_in, α_in, to other nodes at B, α.
    Ring: 3→4 and 7→0 cross nodes, so each step is max(α + s·b/B, α_in + s·b/B_in);
    master (root 0): gather brings 3N over the node link and 4N over the network, each on its own link;
    naive: each GPU sends 3N inside and 4N out. Planted: one link per GPU for both levels (loads summed)
    -> master 7N through the root's one side, fails; nodes ignored (every transfer on the network link)
    -> master fails (the ring does not notice: its steps are set by the slow link anyway)."""
    b_in, a_in = 400e9, 2e-6
    net = Network(BW, ALPHA, gpus_per_node=4, intra_bandwidth=b_in, intra_latency=a_in)
    G, N, b = 8, 8 * 1000 + 5, 4
    s = math.ceil(N / G)
    _close(collective_time("ring", G, N, net, b).total, 2 * (G - 1) * max(ALPHA + s * b / BW, a_in + s * b / b_in),
           "two-level ring")
    _close(collective_time("master", G, N, net, b).total, 2 * max(a_in + 3 * N * b / b_in, ALPHA + 4 * N * b / BW),
           "two-level master")
    _close(collective_time("naive", G, N, net, b).total, max(a_in + 3 * N * b / b_in, ALPHA + 4 * N * b / BW),
           "two-level naive")
    # inside one node only the fast links are used
    one_node = collective_time("ring", 4, 4000, net, b)
    _close(one_node.total, 6 * (a_in + 1000 * b / b_in), "ring in one node")
    assert {st.bottleneck[1] for st in one_node.steps} == {"intra"}


def test_control_messages_are_ignored():
    """The length check's control messages add nothing. Planted: replaying traffic.transfers instead of
    the payload -> the control messages form an extra step ("check lengths") and add time."""
    trace = netsim.replay._recorded("ring", 4, 40)
    assert trace.control, "the recorded ring should contain its length check"
    payload_only = Traffic([t for t in trace.transfers if t.kind == "payload"], 4)
    assert simulate_time(trace, NET) == simulate_time(payload_only, NET)
    extra = Traffic(trace.transfers + [Transfer("late check", 0, 0, 1, 10**9, 8, "control")], 4)
    assert simulate_time(extra, NET) == simulate_time(payload_only, NET)


def test_itemsize_overrides_the_recorded_one():
    """bf16 from a float32 recording: half the bandwidth term. Planted: itemsize ignored -> 2x the bytes."""
    t4, t2 = collective_time("ring", 4, 4096, NET, itemsize=4), collective_time("ring", 4, 4096, NET, itemsize=2)
    _close(t2.bandwidth, t4.bandwidth / 2, "bf16 bandwidth term")
    _close(t2.latency, t4.latency, "latency unchanged")


@pytest.mark.parametrize("name", netsim.COLLECTIVES)
@pytest.mark.parametrize("G,N", [(3, 300), (3, 301), (4, 402), (8, 8 * 37 + 5), (5, 64)])
def test_extrapolated_trace_equals_direct_recording(name, G, N):
    """The pattern recorded at ⌊N/G⌋ = 1 and 2, extrapolated to N, equals a trace recorded at N by
    comm.simulate (the threaded simulator). Planted: linear scaling by ⌊N/G⌋ of the q = 1 recording
    -> the length check's control messages grow with N and, where G does not divide N, segments are off."""
    direct = netsim.replay._recorded(name, G, N, dry=False)
    extrapolated = collective_trace(name, G, N)
    assert extrapolated.trace() == direct.trace(), f"{name} G={G} N={N}: extrapolated trace differs"
    assert simulate_time(extrapolated, NET) == simulate_time(direct, NET)


@pytest.mark.parametrize("name", netsim.COLLECTIVES)
@pytest.mark.parametrize("G,N", [(2, 3), (3, 7), (4, 1), (4, 2), (6, 13)])
def test_dry_run_records_what_the_simulator_records(name, G, N):
    """The single-thread dry run (used so G = 1,024 records in seconds) gives comm.simulate's trace, in
    the same order. Planted: one message counter per link shared by sender and receiver -> the length
    check reads another message and raises."""
    dry, threaded = netsim.replay._recorded(name, G, N, dry=True), netsim.replay._recorded(name, G, N, dry=False)
    key = [(t.phase, t.step, t.src, t.dst, t.numel, t.kind, t.meta, t.seq) for t in threaded.transfers]
    assert [(t.phase, t.step, t.src, t.dst, t.numel, t.kind, t.meta, t.seq) for t in dry.transfers] == key


@pytest.mark.parametrize("name", netsim.COLLECTIVES)
def test_calibration_recovers_alpha_and_bandwidth_exactly(name):
    """Synthetic 2-rank timings from a known network: calibrate() returns it, and predicts the samples.
    Planted: α taken as the fitted intercept itself (not divided by the model's latency terms) ->
    ring and master come back with 2α."""
    true = Network(bandwidth=1.2e9, latency=35e-6)
    sizes = [2 ** k for k in range(12, 27, 2)]                     # 4 KiB .. 64 MiB
    samples = [(n, collective_time(name, 2, n // 4, true).total) for n in sizes]
    fitted = netsim.calibrate(samples, name, world_size=2)
    assert math.isclose(fitted.latency, true.latency, rel_tol=1e-6), (fitted, true)
    assert math.isclose(fitted.bandwidth, true.bandwidth, rel_tol=1e-6), (fitted, true)
    for n, seconds in samples:
        assert math.isclose(collective_time(name, 2, n // 4, fitted).total, seconds, rel_tol=1e-6)


def test_unknown_collective_is_named():
    with pytest.raises(ValueError, match="unknown collective 'tree'"):
        collective_time("tree", 4, 100, NET)


def test_large_world_and_tensor_through_the_extrapolated_pattern():
    """G = 64 and N = 10⁹ + 7 bf16 (no such tensor is ever built): the three closed forms still hold.
    Planted: linear scaling of the q = 1 recording (N = G + 7 elements, times q) -> master 5.59 s, not 5.04."""
    G, N, b = 64, 10**9 + 7, 2
    _close(collective_time("master", G, N, NET, b).total, 2 * ALPHA + 2 * (G - 1) * N * b / BW, "master G=64")
    _close(collective_time("naive", G, N, NET, b).total, ALPHA + (G - 1) * N * b / BW, "naive G=64")
    _close(collective_time("ring", G, N, NET, b).total, 2 * (G - 1) * (ALPHA + math.ceil(N / G) * b / BW),
           "ring G=64")


# ----------------------------------------------------------------- hierarchical all-reduce (issue 11 item 3)
NVLINK, A_IN = 450e9, 2e-6       # NVLink 4 per direction, 2 µs
IB, A_IB = 50e9, 10e-6           # 400 Gb/s InfiniBand, 10 µs


def _two_level(k: int) -> Network:
    return Network(IB, A_IB, gpus_per_node=k, intra_bandwidth=NVLINK, intra_latency=A_IN)


def _hierarchical_closed_form(G: int, k: int, N: int, b: int = 4) -> float:
    """Derived here, not read from netsim: the inner ring has 2(k−1) steps over NVLink, each set by the
    largest segment ⌈N/k⌉; the n = G/k outer rings (one per local rank, concurrent) have 2(n−1) steps
    over InfiniBand, set by the largest shard's largest segment ⌈⌈N/k⌉/n⌉."""
    n, shard = G // k, -(-N // k)
    return 2 * (k - 1) * (A_IN + shard * b / NVLINK) + 2 * (n - 1) * (A_IB + -(-shard // n) * b / IB)


@pytest.mark.parametrize("G,k,N", [(4, 2, 1001), (8, 4, 8 * 100), (8, 2, 8 * 100 + 3), (16, 4, 1000),
                                   (32, 8, 32 * 50), (12, 3, 12 * 7 + 5)])
def test_hierarchical_model_is_its_closed_form(G, k, N):
    """Planted: the stages' labels colliding (no prefix in hierarchical._Prefixed) -> G=4: 2 steps
    instead of 4 and the model times step 0 of the inner and outer reduce-scatter as one."""
    t = collective_time("hierarchical", G, N, _two_level(k))
    _close(t.total, _hierarchical_closed_form(G, k, N), f"hierarchical G={G} k={k} N={N}")
    n = G // k
    assert len(t.steps) == 2 * (k - 1) + 2 * (n - 1), [(s.phase, s.step) for s in t.steps]
    assert [s.bottleneck[1] for s in t.steps] == ["intra"] * (k - 1) + ["net"] * 2 * (n - 1) + ["intra"] * (k - 1)


@pytest.mark.parametrize("name", netsim.COLLECTIVES)
@pytest.mark.parametrize("G,N,k", [(8, 8005, 4), (6, 61, 3), (8, 8, 2), (4, 3, None)])
def test_fast_time_equals_the_replay(name, G, N, k):
    """collective_time (busiest side per link kind) equals simulate_time on the whole trace.
    Planted: the busiest side taken over both link kinds at once (the first kind's) -> the ring on
    G=8, k=4 loses its network term."""
    net = Network(BW, ALPHA) if k is None else Network(BW, ALPHA, gpus_per_node=k, intra_bandwidth=NVLINK,
                                                        intra_latency=A_IN)
    trace = collective_trace(name, G, N, gpus_per_node=k)
    assert collective_time(name, G, N, net) == simulate_time(trace, net, 4)


@pytest.mark.parametrize("name", netsim.COLLECTIVES)
@pytest.mark.parametrize("G,k", [(16, 4), (32, 8), (8, 1), (8, 8), (2, 8), (4, 8)])
def test_closed_form_time_equals_the_model(name, G, k):
    """netsim.closed_form_time (what the notebook draws beyond the recorded G) equals the model where G
    divides N, also for fewer GPUs than a node holds. Planted: the master's network side counted with G−1
    (not G−k) senders -> fails for k > 1; k not capped at G (G=2, k=8: "0 nodes") -> master G=2 k=8
    N=2: model 4.000249e-06 s, closed form 4.000036e-06 s."""
    if name == "hierarchical" and G < k:
        pytest.skip("the hierarchical all-reduce needs whole nodes")
    net = _two_level(k)
    for N in (G, 3 * G, 1000 * G):
        _close(netsim.closed_form_time(name, G, N, net), collective_time(name, G, N, net).total,
               f"{name} G={G} k={k} N={N}")


def test_crossover_of_the_model_equals_the_closed_forms_at_32():
    """At G = 32 in nodes of 8 the model's own crossovers (binary search on replayed traces) land on the
    multiple of G the closed forms give. Planted: closed_form_time's hierarchical outer stage with 2n
    steps instead of 2(n−1) -> hierarchical beats naive from 52032 elements, not 41312."""
    G, net = 32, _two_level(8)
    model = lambda *a: collective_time(*a).total  # noqa: E731
    for first, second in (("hierarchical", "naive"), ("ring", "naive"), ("hierarchical", "master")):
        assert netsim.crossover(first, second, G, net, time=model, hi=2**12) == \
            netsim.crossover(first, second, G, net, hi=2**12), (first, second)


def test_crossover_at_1024_gpus_against_the_hand_solved_lines():
    """1,024 GPUs, 8 per node: solve naive = hierarchical and naive = ring by hand (both linear in N
    above a few elements) and compare with netsim.crossover. The hierarchical all-reduce beats the flat
    ring at every size (fewer latencies: 268 vs 2,046; and 1/k of the bytes over InfiniBand).
    Planted: the ring's step set by the NVLink side only (max over levels dropped) -> ring beats naive
    from 51200 elements, not 252928; crossover returning the last slower size, not the first faster
    -> one multiple of G lower."""
    G, k, b = 1024, 8, 4
    n, net = G // k, _two_level(k)
    # naive: one step, each GPU sends (G−k)·N over InfiniBand (it dominates NVLink's (k−1)·N here)
    naive_lat, naive_bw = A_IB, (G - k) * b / IB
    hier_lat = 2 * (k - 1) * A_IN + 2 * (n - 1) * A_IB
    hier_bw = 2 * (k - 1) * b / (k * NVLINK) + 2 * (n - 1) * b / (G * IB)
    ring_lat, ring_bw = 2 * (G - 1) * A_IB, 2 * (G - 1) * b / (G * IB)
    for first, lat, bw in (("hierarchical", hier_lat, hier_bw), ("ring", ring_lat, ring_bw)):
        n_star = (lat - naive_lat) / (naive_bw - bw)                  # equal times at N = n_star
        want = (int(n_star // G) + 1) * G                             # the first multiple of G beyond it
        assert netsim.crossover(first, "naive", G, net) == want, (first, n_star)
    assert netsim.crossover("hierarchical", "ring", G, net) == G      # faster from the smallest size on
    assert netsim.crossover("ring", "hierarchical", G, net) is None
    _close(netsim.closed_form_time("ring", G, G, net) - ring_bw * G, ring_lat, "ring latency term")
