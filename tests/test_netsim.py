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
    -> master fails (the ring does not notice: its steps are set by the slow link anyway). The ring is
    one ring here (ring_channels=1); test_channelled_ring_* price NCCL's channels."""
    b_in, a_in = 400e9, 2e-6
    net = Network(BW, ALPHA, gpus_per_node=4, intra_bandwidth=b_in, intra_latency=a_in, ring_channels=1)
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
    trace = collective_trace(name, G, N, gpus_per_node=k, channels=net.channels(G) if name == "ring" else 1)
    assert collective_time(name, G, N, net) == simulate_time(trace, net, 4)


@pytest.mark.parametrize("name", netsim.COLLECTIVES)
@pytest.mark.parametrize("G,k", [(16, 4), (32, 8), (8, 1), (8, 8), (2, 8), (4, 8)])
def test_closed_form_time_equals_the_model(name, G, k):
    """netsim.closed_form_time (what the notebook draws beyond the recorded G) equals the model where c·G
    divides N (c the ring's channels), also for fewer GPUs than a node holds. Planted: the master's network side counted with G−1
    (not G−k) senders -> fails for k > 1; k not capped at G (G=2, k=8: "0 nodes") -> master G=2 k=8
    N=2: model 4.000249e-06 s, closed form 4.000036e-06 s."""
    if name == "hierarchical" and G < k:
        pytest.skip("the hierarchical all-reduce needs whole nodes")
    net = _two_level(k)
    c = net.channels(G)
    for N in (c * G, 3 * c * G, 1000 * c * G):
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
    """1,024 GPUs, 8 per node: solve naive = hierarchical, naive = ring and ring = hierarchical by hand (all
    linear in N above a few elements) and compare with netsim.crossover, which searches multiples of
    c·G = 8,192 elements. The ring runs 8 channels, so its bandwidth term is 2(G−1)/G·N·b/(8·B) (each step's
    largest side is a network link: N/(8G) elements against NVLink's 7N/(8G) at 9× the speed); the
    hierarchical all-reduce pays fewer latencies (268 against 2,046) but its NVLink stages on top of its
    network stage, so the ring wins from a few GB on. Planted: the ring's step set by the NVLink side only
    (max over levels dropped) -> ring beats naive from 57344 elements, not 253952; crossover returning
    the last slower size, not the first faster -> one multiple of c·G lower."""
    G, k, b = 1024, 8, 4
    n, net, unit = G // k, _two_level(k), k * G
    # naive: one step, each GPU sends (G−k)·N over InfiniBand (it dominates NVLink's (k−1)·N here)
    naive_lat, naive_bw = A_IB, (G - k) * b / IB
    hier_lat = 2 * (k - 1) * A_IN + 2 * (n - 1) * A_IB
    hier_bw = 2 * (k - 1) * b / (k * NVLINK) + 2 * (n - 1) * b / (G * IB)
    ring_lat, ring_bw = 2 * (G - 1) * A_IB, 2 * (G - 1) * b / (G * k * IB)
    for first, lat, bw, second, lat2, bw2 in (("hierarchical", hier_lat, hier_bw, "naive", naive_lat, naive_bw),
                                              ("ring", ring_lat, ring_bw, "naive", naive_lat, naive_bw),
                                              ("ring", ring_lat, ring_bw, "hierarchical", hier_lat, hier_bw)):
        n_star = (lat - lat2) / (bw2 - bw)                            # equal times at N = n_star
        want = (int(n_star // unit) + 1) * unit                       # the first multiple of c·G beyond it
        assert netsim.crossover(first, second, G, net) == want, (first, second, n_star)
    with pytest.raises(ValueError, match="ask crossover\\('ring', 'hierarchical'"):
        netsim.crossover("hierarchical", "ring", G, net)             # it wins below a size, not from one on
    _close(netsim.closed_form_time("ring", G, unit, net) - ring_bw * unit, ring_lat, "ring latency term")


# ----------------------------------------------------------------- channels (issue 56 §2)
def _ring_by_hand(G: int, k: int, c: int, N: int, b: int, net_bw: float, nvlink: float) -> tuple[float, float]:
    """(total, bandwidth part) of a ring of c channels over nodes of k, derived here: c·G divides N, so each
    channel's segment is s = N/(c·G); in a step each channel's exit GPU sends s over its own network link;
    over NVLink a GPU sends its other channels' segments, c − 1 of them when every GPU is one channel's
    exit (c = k), all c otherwise."""
    s = N // (c * G)
    inside = (c - 1 if c == k else c) * s
    net_side = (A_IB + s * b / net_bw, s * b / net_bw)
    nvlink_side = (A_IN + inside * b / nvlink, inside * b / nvlink)
    step = max(net_side, nvlink_side)
    return 2 * (G - 1) * step[0], 2 * (G - 1) * step[1]


@pytest.mark.parametrize("c", [1, 2, 4])
@pytest.mark.parametrize("nvlink", [NVLINK, 2 * IB])   # network-bound; NVLink-bound at c = 4 (3 segments at 2B)
def test_channelled_ring_hand_derived(c, nvlink):
    """16 GPUs in nodes of 4, N = 4·16·10⁶ float32 (a 4 MB segment per channel at c = 1: bandwidth, not
    latency, sets each step): the replayed trace of c channels equals the hand derivation, and
    network-bound its bandwidth term is 2(G−1)/G · N·b/(c·B). Planted, seen failing:
    the channels not rotated inside the node (all leave through local GPU 3) -> c = 2, 4 network-bound
    c times the bandwidth term; the chunks not split (each channel carries all of N) -> every c > 1;
    closed_form_time counting c (not c − 1) segments on NVLink at c = k -> c = 4 NVLink-bound."""
    G, k, N, b = 16, 4, 4 * 16 * 10**6, 4
    net = Network(IB, A_IB, gpus_per_node=k, intra_bandwidth=nvlink, intra_latency=A_IN, ring_channels=c)
    total, bandwidth = _ring_by_hand(G, k, c, N, b, IB, nvlink)
    t = collective_time("ring", G, N, net, b)
    _close(t.total, total, f"ring of {c} channels")
    _close(t.bandwidth, bandwidth, f"ring of {c} channels, bandwidth part")
    _close(netsim.closed_form_time("ring", G, N, net, b), total, f"closed form, {c} channels")
    if nvlink == NVLINK:
        _close(t.bandwidth, 2 * (G - 1) / G * N * b / (c * IB), "bandwidth term 2(G−1)/G·N·b/(c·B)")


def test_channels_default_to_one_per_gpu_of_a_node_and_only_across_nodes():
    """Default: k channels across nodes, one inside a node or without nodes; a count that does not divide
    the node is refused in one sentence. Each GPU then sends the same bytes between nodes: 2(G−1)·N/(k·G).
    Planted, seen failing: channels() ignoring the one-node case -> G = 4, k = 8 gives 8."""
    net = _two_level(8)
    assert (net.channels(1024), net.channels(8), net.channels(4), NET.channels(64)) == (8, 1, 1, 1)
    with pytest.raises(ValueError, match="ring_channels=3 must be a divisor of gpus_per_node=8"):
        Network(IB, A_IB, gpus_per_node=8, ring_channels=3)
    G, k, N = 16, 4, 16 * 4 * 10
    trace = collective_trace("ring", G, N, gpus_per_node=k, channels=k)
    across = {r: sum(t.numel for t in trace.payload if t.src == r and t.src // k != t.dst // k) for r in range(G)}
    assert set(across.values()) == {2 * (G - 1) * N // (k * G)}, across


def test_hierarchical_advantage_is_latency_at_the_chapters_sizes():
    """Chapter 01's cluster (1,000 GPUs in nodes of 8, 400 Gb/s and NVLink) by hand, through closed_form_time
    (recording a 1,000-GPU ring takes minutes; the closed form equals the model where both run, above):
    the ring 2·999 = 1,998 steps, the hierarchical 2·7 + 2·124 = 262. 14 GB of bf16 (N = 7·10⁹, s =
    N/8,000 = 875,000): a ring step is its network side, 10 µs + 1.75 MB / 50 GB/s = 45 µs, so 89.91 ms;
    the hierarchical 126.39 ms: the ring 1.4× faster. 4 MiB of float32: the ring is nearly all latency,
    1,998·10 µs = 19.98 ms, the hierarchical 2.5 ms. Planted, seen failing: ring_channels=1 by default
    (the old model) -> ring 579 ms at 14 GB."""
    G, k, n = 1000, 8, 125
    net = _two_level(k)
    ring, hier = (netsim.closed_form_time(name, G, 7 * 10**9, net, 2) for name in ("ring", "hierarchical"))
    _close(ring, 1998 * (A_IB + 875_000 * 2 / IB), "ring at 14 GB")
    shard = 7 * 10**9 // k
    _close(hier, 2 * (k - 1) * (A_IN + shard * 2 / NVLINK) + 2 * (n - 1) * (A_IB + 7 * 10**6 * 2 / IB),
           "hierarchical at 14 GB")
    assert 1.40 < hier / ring < 1.41
    small = netsim.closed_form_time("ring", G, 2**20, net, 4)
    assert 1998 * A_IB < small < 1998 * A_IB * 1.01
    assert netsim.closed_form_time("hierarchical", G, 2**20, net, 4) < small / 7
    # the step counts, on the model at a size it records quickly: 2(G−1) for the ring, 2(k−1) + 2(n−1)
    assert len(collective_time("ring", 32, 32 * 8, net).steps) == 62
    assert len(collective_time("hierarchical", 32, 32 * 8, net).steps) == 2 * 7 + 2 * 3
