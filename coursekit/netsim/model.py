"""The network model itself: a :class:`Network`, and how long a recorded trace takes on it.

The rule (one step at a time; each side busy ``α + L/B``; a step as long as its busiest side) and its
assumptions are stated once, in :mod:`coursekit.netsim`; :func:`closed_form_time` is the same rule
worked out by hand for each collective (tested equal to the replay wherever both run).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..comm.traffic import Traffic, Transfer

__all__ = ["Network", "StepTime", "Timing", "simulate_time", "closed_form_time", "COLLECTIVES"]

COLLECTIVES = ("master", "naive", "ring", "hierarchical")


@dataclass(frozen=True)
class Network:
    """``G`` GPUs on a non-blocking switch: ``bandwidth`` in bytes/s each way, ``latency`` in seconds.

    With ``gpus_per_node=k``, transfers inside a node use ``intra_bandwidth``
    and ``intra_latency`` (default: the same as between nodes). Every GPU has
    its own network link, so a node has ``k``. A flat ring that crosses nodes
    runs as ``ring_channels`` rings at once (NCCL's channels), each on its
    share of the data and leaving every node through another GPU's link
    (:mod:`coursekit.netsim`, "Channels"); None: one per GPU of a node, so
    the ring uses all ``k`` links. ``ring_channels=1`` is the course's
    ``ring_all_reduce`` as coded: one ring, one network link per node.
    """

    bandwidth: float
    latency: float
    gpus_per_node: int | None = None
    intra_bandwidth: float | None = None
    intra_latency: float | None = None
    ring_channels: int | None = None

    def __post_init__(self) -> None:
        c, k = self.ring_channels, self.gpus_per_node
        if c is not None and (c < 1 or (k is None and c > 1) or (k is not None and k % c)):
            raise ValueError(f"ring_channels={c} must be a divisor of gpus_per_node={k} "
                             f"(1 without nodes): a ring's channels share a node's network links.")

    def channels(self, world_size: int) -> int:
        """How many rings a flat ring over ``world_size`` GPUs runs at once: 1 inside one node or
        without nodes (nothing to spread), else ``ring_channels`` (default ``gpus_per_node``)."""
        k = self.gpus_per_node
        if k is None or world_size <= k:
            return 1
        return k if self.ring_channels is None else self.ring_channels

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


def closed_form_time(name: str, world_size: int, numel: int, network: Network, itemsize: int = 4) -> float:
    """The module docstring's closed forms, on one or two link levels (tested equal to :func:`collective_time`).

    With ``k = gpus_per_node`` (``G`` if None: one level), ``n = G/k`` nodes,
    ``T_l(L) = α_l + L·b/B_l`` the busy time of a side of level ``l`` carrying
    ``L`` elements, and a level counted only where the algorithm uses it:

    * master: ``2·max(T_intra((k−1)N), T_net((G−k)N))`` (the root's two receive sides, then send sides);
    * naive: ``max(T_intra((k−1)N), T_net((G−k)N))``;
    * ring: ``2(G−1)·max(T_intra(c'·s), T_net(s))`` with ``c = network.channels(G)`` rings,
      ``s = ⌈⌈N/c⌉/G⌉`` a channel's segment, ``c' = k − 1`` if ``c = k`` (each GPU is one channel's exit),
      else ``c`` (exact when ``c·G`` divides ``N`` or on one level; otherwise an upper bound, as the
      largest segment may not cross a node);
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
        c = network.channels(G)
        s = -(-(-(-N // c)) // G)    # ⌈⌈N/c⌉/G⌉: a channel's largest segment
        # per step each channel's exit GPU sends s over its network link; with c = k every GPU is one
        # channel's exit, so (c − 1)·s over NVLink, else some GPU sends all c segments over NVLink
        return 2 * (G - 1) * worst((c - 1 if c == k > 1 else c) * s, s)
    if name == "hierarchical":
        shard = -(-N // k)
        return 2 * (k - 1) * (busy("intra", shard) if k > 1 else 0.0) + 2 * (n - 1) * busy("net", -(-shard // n))
    raise ValueError(f"unknown collective {name!r}: use one of {', '.join(COLLECTIVES)}.")
