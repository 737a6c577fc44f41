"""A network model: how long a recorded collective would take on a cluster of ``G`` GPUs.

The collectives of :mod:`coursekit.collectives` label every transfer with its
``(phase, step)``; :func:`coursekit.comm.simulate` records them (who sends how
many bytes to whom, in which step). This module *replays that trace* on a
modeled network. Nothing about an algorithm is written here: change the
collective and the model's times change with it.

    >>> net = Network(bandwidth=50e9, latency=10e-6)           # 50 GB/s each way, 10 µs
    >>> t = collective_time("ring", 8, 2**20, net)              # 1 Mi float32 on 8 GPUs
    >>> round(t.total * 1e6, 2), len(t.steps)                   # 2·7·(10 µs + 512 KiB/8 / 50 GB/s)
    (286.8, 14)

Assumptions, stated once
------------------------
* Each GPU has one full-duplex link to a non-blocking switch: ``B`` bytes/s
  out and, independently, ``B`` bytes/s in, with latency ``α``. With
  ``gpus_per_node=k``, GPUs ``r // k`` equal share a node and each GPU has a
  second link (``B_intra``, ``α_intra``, e.g. NVLink) used for every transfer
  to a GPU of its own node; transfers between nodes use the first link.
* A *side* is one direction of one link of one GPU (its send side, its
  receive side). A side carries one byte stream at a time: what goes over it
  is serialised.
* Steps run one after another: a ``(phase, step)`` group of the trace is one
  step, and the next starts when the last transfer of this one has arrived.
* Control messages (the length check) are ignored: only payload is timed.

The timing rule
---------------
In one step, a side that carries ``L`` bytes (summed over all its transfers)
is busy for ``α + L/B`` (its link's ``α`` and ``B``): latency is paid once
per side per step, since the messages queued on a side stream back to back
and their latencies overlap. The step takes the longest busy time over all
sides::

    T_step = max over sides (α_side + L_side / B_side),    T = Σ T_step

That the busiest side is also *enough* is the open-shop theorem: with a
non-blocking switch, transfers that may be cut into pieces can be scheduled
so that no side idles while it has bytes left. :class:`Timing` splits
``T`` into its latency part (Σ α of each step's busiest side) and bandwidth
part (Σ L/B).

The closed forms (``N`` elements of ``b`` bytes, one link level)
----------------------------------------------------------------
* **master** (receives every gradient, then sends the sum back): step
  "gather" puts ``(G−1)·N·b`` bytes through the root's receive side, step
  "broadcast" as many through its send side (the others carry ``N·b``)::

      T_master = 2·α + 2·(G−1)·N·b/B          (grows linearly in G)

* **naive** (everyone sends everything to everyone, one step): every side
  carries ``(G−1)·N·b``::

      T_naive = α + (G−1)·N·b/B

* **ring**: ``2·(G−1)`` steps, in each every GPU sends one segment to its
  right neighbour; segments hold ``⌈N/G⌉`` or ``⌊N/G⌋`` elements and the
  largest is sent in every step, so::

      T_ring = 2·(G−1)·(α + ⌈N/G⌉·b/B)       (bandwidth term ≈ 2·N·b/B, flat in G)

* **hierarchical** (:mod:`coursekit.hierarchical`, ``k`` GPUs per node, ``n = G/k`` nodes): the
  inner ring's ``2(k−1)`` steps over the node links, each set by the largest
  segment ``⌈N/k⌉``; the ``k`` outer rings (one per local rank, at the same
  time) take ``2(n−1)`` steps over the network, set by the largest shard's
  largest segment::

      T_hier = 2·(k−1)·(α_intra + ⌈N/k⌉·b/B_intra) + 2·(n−1)·(α + ⌈⌈N/k⌉/n⌉·b/B)

  268 latencies instead of the flat ring's 2,046 at 1,024 GPUs in nodes of 8,
  and ``1/k`` of the bytes per GPU over the network. Its stages are labelled
  apart ("inner reduce-scatter", "outer reduce-scatter", ...): steps with one
  label are run as one step, so colliding labels would overlap two stages.

With nodes, apply the rule per link: e.g. a ring of ``G = 8`` in nodes of 4
sends ``3→4`` and ``7→0`` between nodes and the rest inside, so each step is
``max(α + s·b/B, α_intra + s·b/B_intra)`` with ``s = ⌈N/G⌉``.

Recording large ``G``
---------------------
Every message of these collectives has an *affine* size in ``q = ⌊N/G⌋``
for a fixed remainder ``N mod G`` (whole tensors: ``G·q + r``; segments:
``q`` or ``q + 1``). So :func:`collective_trace` records the pattern twice,
at ``q = 1`` and ``q = 2`` (tiny tensors), checks both have the same
transfers, and extrapolates each message's size to the requested ``N``:
exact, not an approximation (tested against direct recordings). The
recording is a *dry run* of the same collective code: every rank in turn in
this thread, sends complete at once (the threaded simulator's waits cost
about ``G`` times more per message, too slow at ``G = 1,024``); it is tested
equal to :func:`coursekit.comm.simulate`'s trace. Groups are :class:`RankGroup`
rank lists (:func:`node_groups` gives a rank's node and its cross-node ring).

What it costs: the trace holds every message, ``2G(G−1)`` for the ring, and
Python spends tens of µs on each, so recording the flat ring at ``G = 1,024``
(2·10⁶ messages, four runs of every rank) takes minutes, not seconds; ``G ≤
64`` takes about a second. The busiest side per link kind and step is cached
(:func:`collective_time`), so a recorded trace is timed on a new network in
``O(steps)``. Beyond the recorded sizes use :func:`closed_form_time`, tested
equal to the model wherever both run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, Sequence

import torch

from . import comm, comm_state
from .traffic import Traffic, Transfer

__all__ = ["Network", "StepTime", "Timing", "RankGroup", "node_groups", "simulate_time", "collective_trace",
           "collective_time", "closed_form_time", "crossover", "calibrate", "COLLECTIVES"]


@dataclass(frozen=True)
class Network:
    """``G`` GPUs on a non-blocking switch: ``bandwidth`` in bytes/s each way, ``latency`` in seconds.

    With ``gpus_per_node=k``, transfers inside a node use ``intra_bandwidth``
    and ``intra_latency`` (default: the same as between nodes).
    """

    bandwidth: float
    latency: float
    gpus_per_node: int | None = None
    intra_bandwidth: float | None = None
    intra_latency: float | None = None

    def link(self, src: int, dst: int) -> tuple[str, float, float]:
        """``(name, bandwidth, latency)`` of the link a transfer ``src → dst`` uses."""
        k = self.gpus_per_node
        if k is not None and src // k == dst // k:
            bandwidth = self.bandwidth if self.intra_bandwidth is None else self.intra_bandwidth
            latency = self.latency if self.intra_latency is None else self.intra_latency
            return "intra", bandwidth, latency
        return "net", self.bandwidth, self.latency

    def level(self, link: str) -> tuple[float, float]:
        """``(bandwidth, latency)`` of link kind ``"net"`` (between nodes) or ``"intra"`` (inside one)."""
        if link == "intra":
            return (self.bandwidth if self.intra_bandwidth is None else self.intra_bandwidth,
                    self.latency if self.intra_latency is None else self.intra_latency)
        return self.bandwidth, self.latency


@dataclass(frozen=True)
class StepTime:
    """One step: its time, split into latency + bandwidth, and the side that set it."""

    phase: str | None
    step: int | None
    seconds: float
    latency: float
    bandwidth: float
    bottleneck: tuple[int, str, str]   # (gpu, link "net"/"intra", "send"/"recv")
    bytes: int                         # bytes through that side


@dataclass(frozen=True)
class Timing:
    """A collective's modeled time: ``total`` seconds = ``latency`` + ``bandwidth`` parts, per step."""

    steps: tuple[StepTime, ...]

    @property
    def total(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def latency(self) -> float:
        return sum(s.latency for s in self.steps)

    @property
    def bandwidth(self) -> float:
        return sum(s.bandwidth for s in self.steps)

    def __repr__(self) -> str:
        return (f"Timing({self.total:.6g} s = latency {self.latency:.6g} + bandwidth {self.bandwidth:.6g}, "
                f"{len(self.steps)} steps)")


def _step_time(key: tuple, transfers: list[Transfer], network: Network, itemsize: int | None) -> StepTime:
    """The timing rule for one step: the busiest side's ``α + L/B``."""
    load: dict[tuple[int, str, str], int] = {}
    links: dict[str, tuple[float, float]] = {}
    for t in transfers:
        name, bandwidth, latency = network.link(t.src, t.dst)
        links[name] = (bandwidth, latency)
        nbytes = t.numel * (t.itemsize if itemsize is None else itemsize)
        for side in ((t.src, name, "send"), (t.dst, name, "recv")):
            load[side] = load.get(side, 0) + nbytes

    def busy(side):
        bandwidth, latency = links[side[1]]
        return latency + load[side] / bandwidth, latency, load[side] / bandwidth

    side = max(sorted(load), key=lambda s: busy(s)[0])   # sorted: the lowest such side on a tie
    seconds, latency, transfer = busy(side)
    return StepTime(key[0], key[1], seconds, latency, transfer, side, load[side])


def simulate_time(traffic: Traffic, network: Network, itemsize: int | None = None) -> Timing:
    """Replay a recorded trace on ``network``: one :class:`StepTime` per ``(phase, step)``, in order.

    Only payload is timed (control messages are ignored). ``itemsize`` (bytes
    per element) overrides the recorded one, e.g. 2 to time bf16 gradients
    from a float32 recording.
    """
    return Timing(tuple(_step_time(key, transfers, network, itemsize) for key, transfers in traffic.steps()))


# ----------------------------------------------------------------- recording the trace
def _collectives() -> dict[str, Callable]:
    from .collectives import master_all_reduce, naive_all_reduce, ring_all_reduce
    from .hierarchical import hierarchical_all_reduce

    return {"master": master_all_reduce, "naive": naive_all_reduce, "ring": ring_all_reduce,
            "hierarchical": hierarchical_all_reduce}


COLLECTIVES = ("master", "naive", "ring", "hierarchical")


def node_groups(rank: int, world_size: int, gpus_per_node: int) -> tuple[RankGroup, RankGroup]:
    """``(inner, outer)`` of global ``rank``: its node's GPUs, and the GPUs of its local index on every
    node, laid out as ``Mesh({"node": G // k, "local": k})`` lays them out (rank = node·k + local)."""
    k = gpus_per_node
    if k < 1 or world_size % k:
        raise ValueError(f"gpus_per_node={k} must divide the world size {world_size}.")
    node, local = divmod(rank, k)
    return RankGroup(tuple(range(node * k, node * k + k))), RankGroup(tuple(range(local, world_size, k)))


def _record_rank(rank: int, world_size: int, name: str, numel: int, gpus_per_node: int | None = None) -> None:
    if name == "hierarchical":
        inner, outer = node_groups(rank, world_size, gpus_per_node or world_size)
        _collectives()[name](torch.zeros(numel), inner=inner, outer=outer)
    else:
        _collectives()[name](torch.zeros(numel))


class _Done:
    """A send or receive of the dry run: complete once ``wait()`` has filled the buffer (if anything)."""

    def __init__(self, fill: Callable[[], None] = lambda: None):
        self.fill = fill

    def is_completed(self) -> bool:
        return False

    def wait(self) -> bool:
        self.fill()
        return True


@dataclass(frozen=True)
class RankGroup:
    """A process group of the dry run: its members' global ranks, in group order.

    What :func:`collective_trace` passes as ``group=`` (e.g. a node's GPUs to
    :func:`coursekit.hierarchical.hierarchical_all_reduce`); the dry-run
    transport understands it as ``torch.distributed`` understands a process group.
    """

    ranks: tuple[int, ...]


class _DryTransport:
    """One rank of a *dry run*: sends complete at once, a receive gets the matching message of an
    earlier pass if there was one (control messages; payload values are not kept). ``group`` is
    None (every rank) or a :class:`RankGroup`; mail is keyed by global ranks."""

    name = "dry run"

    def __init__(self, rank: int, size: int, mail: dict, counts: dict):
        self.me, self.size, self.mail, self.counts = rank, size, mail, counts

    def rank(self, group) -> int:
        return self.me if group is None else group.ranks.index(self.me)

    def world_size(self, group) -> int:
        return self.size if group is None else len(group.ranks)

    def global_rank(self, group, rank: int) -> int:
        return rank if group is None else group.ranks[rank]

    def group_rank(self, group, global_rank: int) -> int:
        return global_rank if group is None else group.ranks.index(global_rank)

    def _next(self, way: str, src: int, dst: int) -> int:
        """The index of this message among those ``src`` sent to ``dst`` (as the sender or receiver counts)."""
        k = self.counts.get((way, src, dst), 0)
        self.counts[(way, src, dst)] = k + 1
        return k

    def isend(self, tensor, dst, group):
        dst = self.global_rank(group, dst)
        k = self._next("send", self.me, dst)
        if comm_state.kind() == "control":
            self.mail[(self.me, dst, k)] = tensor.clone()
        return _Done()

    def irecv(self, tensor, src, group):
        src = self.global_rank(group, src)
        message = self.mail.get((src, self.me, self._next("recv", src, self.me)))
        return _Done(lambda: None if message is None else tensor.copy_(message))

    def send(self, tensor, dst, group):
        self.isend(tensor, dst, group).wait()

    def recv(self, tensor, src, group):
        self.irecv(tensor, src, group).wait()


def _dry_run(name: str, world_size: int, numel: int, gpus_per_node: int | None = None) -> Traffic:
    """Record ``name``'s trace with every rank run in turn in this thread (O(transfers), not O(G·transfers)).

    Collecting passes gather the control messages (a length check is sent
    before any check is verified; a rank whose check finds nothing yet stops
    there), until a pass runs every rank through or brings no new message:
    one pass for one-stage collectives, one more per later stage whose checks
    wait on ranks that run after this one (the hierarchical all-reduce's outer
    and second inner stage). A last pass reruns every rank with all of them and
    records. Valid for collectives whose transfers do not depend on the values
    received (all of :data:`COLLECTIVES`); tested equal to
    :func:`coursekit.comm.simulate`'s trace (and to real ranks' for the
    hierarchical one).
    """
    mail: dict = {}
    records = [Traffic(world_size=world_size) for _ in range(world_size)]

    def run_every_rank(recording: bool) -> int:
        counts: dict = {}
        stopped = 0
        for rank in range(world_size):
            transport = _DryTransport(rank, world_size, mail, counts)
            try:
                with comm.using(transport, recorders=(records[rank],) if recording else (), seq=0):
                    _record_rank(rank, world_size, name, numel, gpus_per_node)
            except ValueError:
                if recording:
                    raise
                stopped += 1
        return stopped

    while True:
        before = len(mail)
        if not run_every_rank(False) or len(mail) == before:
            break
    run_every_rank(True)
    return Traffic.merge(records)


@lru_cache(maxsize=64)
def _recorded(name: str, world_size: int, numel: int, dry: bool = True, gpus_per_node: int | None = None) -> Traffic:
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}: use one of {', '.join(COLLECTIVES)}.")
    if name != "hierarchical":
        gpus_per_node = None   # the others' traces do not depend on it: one recording serves every k
    if dry or name == "hierarchical":   # (the threaded simulator has no process groups)
        return _dry_run(name, world_size, numel, gpus_per_node)
    _, traffic = comm.simulate(_record_rank, world_size, name, numel, timeout=600.0)
    return traffic


def _shape(t: Transfer) -> tuple:
    return (t.phase, t.step, t.src, t.dst, t.kind, t.meta, t.seq)


def collective_trace(name: str, world_size: int, numel: int, gpus_per_node: int | None = None) -> Traffic:
    """The trace of collective ``name`` on ``world_size`` ranks for ``numel`` elements (float32).

    Recorded directly when ``numel < 2·G``; otherwise recorded at ``q = 1``
    and ``q = 2`` elements per rank (same remainder) and every message's size
    extrapolated affinely to ``q = ⌊numel/G⌋`` (see the module docstring).
    ``gpus_per_node`` is the ``k`` of ``"hierarchical"`` (the others ignore it).
    """
    q, r = divmod(numel, world_size)
    if q < 2:
        return _recorded(name, world_size, numel, gpus_per_node=gpus_per_node)
    one = _recorded(name, world_size, world_size + r, gpus_per_node=gpus_per_node)
    two = _recorded(name, world_size, 2 * world_size + r, gpus_per_node=gpus_per_node)
    if [_shape(t) for t in one.transfers] != [_shape(t) for t in two.transfers]:
        raise RuntimeError(f"{name}: the trace's pattern changes with the size; record it directly instead.")
    transfers = [replace(a, numel=a.numel + (q - 1) * (b.numel - a.numel)) for a, b in zip(one.transfers, two.transfers)]
    return Traffic(transfers, world_size)


@lru_cache(maxsize=256)
def _busiest_sides(name: str, world_size: int, numel: int, gpus_per_node: int | None) -> tuple:
    """Per step of the trace: ``(key, ((link, elements, side), ...))``, the busiest side of each link kind.

    All sides of one link kind share ``α`` and ``B``, so the busiest one of each
    kind is all the timing rule needs: a network's time is then ``O(steps)``,
    whatever the number of transfers (the widget redraws from this).
    """
    grouping = Network(1.0, 0.0, gpus_per_node)
    out = []
    for key, transfers in collective_trace(name, world_size, numel, gpus_per_node).steps():
        load: dict[tuple[int, str, str], int] = {}
        for t in transfers:
            link = grouping.link(t.src, t.dst)[0]
            for side in ((t.src, link, "send"), (t.dst, link, "recv")):
                load[side] = load.get(side, 0) + t.numel
        best: dict[str, tuple[int, tuple]] = {}
        for side in sorted(load):   # sorted: the lowest side of a kind on a tie
            if side[1] not in best or load[side] > best[side[1]][0]:
                best[side[1]] = (load[side], side)
        out.append((key, tuple((link, n, side) for link, (n, side) in sorted(best.items()))))
    return tuple(out)


def collective_time(name: str, world_size: int, numel: int, network: Network, itemsize: int = 4) -> Timing:
    """Modeled time of all-reducing ``numel`` elements of ``itemsize`` bytes with ``name``
    ("master", "naive", "ring", "hierarchical") on ``world_size`` GPUs of ``network``.

    Equal to ``simulate_time(collective_trace(...), network, itemsize)`` (tested), computed from the
    busiest side of each link kind per step. ``"hierarchical"`` uses ``network.gpus_per_node`` as its
    node size (the whole world as one node if None).
    """
    steps = []
    for key, sides in _busiest_sides(name, world_size, numel, network.gpus_per_node):
        best = None
        for link, elements, side in sides:
            bandwidth, latency = network.level(link)
            nbytes = elements * itemsize
            busy = (latency + nbytes / bandwidth, latency, nbytes / bandwidth)
            if best is None or busy[0] > best[0][0] or (busy[0] == best[0][0] and side < best[1]):
                best = (busy, side, nbytes)
        (seconds, latency, transfer), side, nbytes = best
        steps.append(StepTime(key[0], key[1], seconds, latency, transfer, side, nbytes))
    return Timing(tuple(steps))


# ----------------------------------------------------------------- closed forms
def closed_form_time(name: str, world_size: int, numel: int, network: Network, itemsize: int = 4) -> float:
    """The module docstring's closed forms, on one or two link levels (tested equal to :func:`collective_time`).

    With ``k = gpus_per_node`` (``G`` if None: one level), ``n = G/k`` nodes,
    ``T_l(L) = α_l + L·b/B_l`` the busy time of a side of level ``l`` carrying
    ``L`` elements, and a level counted only where the algorithm uses it:

    * master: ``2·max(T_intra((k−1)N), T_net((G−k)N))`` (the root's two receive sides, then send sides);
    * naive: ``max(T_intra((k−1)N), T_net((G−k)N))``;
    * ring: ``2(G−1)·max(T_intra(s), T_net(s))``, ``s = ⌈N/G⌉`` (exact when ``G`` divides ``N``
      or on one level; otherwise an upper bound, as the largest segment may not cross a node);
    * hierarchical: ``2(k−1)·T_intra(⌈N/k⌉) + 2(n−1)·T_net(⌈⌈N/k⌉/n⌉)``.

    For ``N ≥ G`` (no empty segments) and ``k`` dividing ``G`` (or ``G < k``: one node). Cheap at
    any ``G``: the notebook draws it up to 1,024.
    """
    G, N = world_size, numel
    k = min(network.gpus_per_node or G, G)   # fewer GPUs than a node holds: all on node 0
    n = G // k

    def busy(level: str, elements: int) -> float:
        bandwidth, latency = network.level(level if network.gpus_per_node else "net")
        return latency + elements * itemsize / bandwidth

    def worst(intra: int, net: int) -> float:
        return max([busy("intra", intra)] * (k > 1) + [busy("net", net)] * (n > 1))

    if name == "master":
        return 2 * worst((k - 1) * N, (G - k) * N)
    if name == "naive":
        return worst((k - 1) * N, (G - k) * N)
    if name == "ring":
        s = -(-N // G)
        return 2 * (G - 1) * worst(s, s)
    if name == "hierarchical":
        shard = -(-N // k)
        return 2 * (k - 1) * (busy("intra", shard) if k > 1 else 0.0) + 2 * (n - 1) * busy("net", -(-shard // n))
    raise ValueError(f"unknown collective {name!r}: use one of {', '.join(COLLECTIVES)}.")


def crossover(first: str, second: str, world_size: int, network: Network, itemsize: int = 4,
              time: Callable[..., float] | None = None, hi: int = 2**30) -> int | None:
    """The smallest message, in elements and a multiple of ``G``, from which ``first`` is faster than ``second``.

    Searched over ``numel = G·m`` for ``m`` in ``[1, hi]`` (multiples of ``G``: the closed forms are
    exact there, and the model records one pattern for all of them). ``time(name, G, numel,
    network, itemsize)`` is :func:`closed_form_time` by default; pass
    ``lambda *a: collective_time(*a).total`` to search the model itself. Binary search: assumes
    one crossing (both times are maxima of lines in ``N``). None if ``first`` is never faster in the
    range; ``G`` if it always is.

        >>> crossover("ring", "naive", 1024, Network(50e9, 10e-6)) * 4 // 1024    # KiB of float32
        980
    """
    time = time or closed_form_time
    lo = 1

    def faster(m: int) -> bool:
        numel = m * world_size
        return time(first, world_size, numel, network, itemsize) < time(second, world_size, numel, network, itemsize)

    if faster(lo):
        return world_size
    if not faster(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if faster(mid) else (mid, hi)
    return hi * world_size


# ----------------------------------------------------------------- calibration
def calibrate(samples: Sequence[tuple[float, float]], name: str = "ring", world_size: int = 2,
              itemsize: int = 4) -> Network:
    """The :class:`Network` whose model reproduces measured ``(bytes, seconds)`` pairs of one collective.

    ``time = a + c·bytes`` is fitted by :func:`coursekit.bench.allreduce.fit_alpha_beta`
    (least squares, weighted by 1/time). The model's own time is linear in
    the bytes too, ``n_α·α + k·bytes/B``; its coefficients ``n_α`` (latency
    terms) and ``k`` (bytes through the busiest side per byte all-reduced)
    are read from the model itself, so ``α = a/n_α`` and ``B = k/c``.
    """
    from .bench.allreduce import fit_alpha_beta

    rows = [{"algorithm": name, "bytes": nbytes, "seconds": seconds} for nbytes, seconds in samples]
    fits = fit_alpha_beta(rows)
    if name not in fits:
        raise ValueError("calibrate needs at least two (bytes, seconds) samples.")
    a, c = fits[name]
    numel = 64 * world_size   # a multiple of G: the bandwidth coefficient is exact
    latency_terms = collective_time(name, world_size, numel, Network(math.inf, 1.0), itemsize).total
    per_byte = collective_time(name, world_size, numel, Network(1.0, 0.0), itemsize).total / (numel * itemsize)
    return Network(bandwidth=per_byte / c if c > 0 else math.inf, latency=a / latency_terms)
