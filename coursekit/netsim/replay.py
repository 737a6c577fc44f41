"""Recording a collective's trace at any ``G`` (a dry run of the same code) and replaying it on a :class:`Network`.

How the recording stays exact and cheap at ``G = 1,024`` (affine message sizes, a dry run with sends
that complete at once) is told in :mod:`coursekit.netsim`'s docstring, under "Recording large G".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

import torch

from .. import comm
from ..comm import state as comm_state
from ..comm.traffic import Traffic, Transfer
from .model import COLLECTIVES, Network, StepTime, Timing, closed_form_time

__all__ = ["RankGroup", "node_groups", "collective_trace", "channel_trace", "collective_time", "crossover"]


# ----------------------------------------------------------------- recording the trace
def _collectives() -> dict[str, Callable]:
    from ..collectives import master_all_reduce, naive_all_reduce, ring_all_reduce
    from ..collectives.hierarchical import hierarchical_all_reduce

    return {"master": master_all_reduce, "naive": naive_all_reduce, "ring": ring_all_reduce,
            "hierarchical": hierarchical_all_reduce}



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
    :func:`coursekit.collectives.hierarchical.hierarchical_all_reduce`); the dry-run
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


def collective_trace(name: str, world_size: int, numel: int, gpus_per_node: int | None = None,
                     channels: int = 1) -> Traffic:
    """The trace of collective ``name`` on ``world_size`` ranks for ``numel`` elements (float32).

    Recorded directly when ``numel < 2·G``; otherwise recorded at ``q = 1``
    and ``q = 2`` elements per rank (same remainder) and every message's size
    extrapolated affinely to ``q = ⌊numel/G⌋`` (see the module docstring).
    ``gpus_per_node`` is the ``k`` of ``"hierarchical"``; ``channels > 1``
    lays the ring as that many rings over nodes of ``gpus_per_node``
    (:func:`channel_trace`). The others ignore both.
    """
    if name == "ring" and channels > 1:
        return channel_trace(world_size, numel, gpus_per_node or world_size, channels)
    q, r = divmod(numel, world_size)
    if q < 2:
        return _recorded(name, world_size, numel, gpus_per_node=gpus_per_node)
    one = _recorded(name, world_size, world_size + r, gpus_per_node=gpus_per_node)
    two = _recorded(name, world_size, 2 * world_size + r, gpus_per_node=gpus_per_node)
    if [_shape(t) for t in one.transfers] != [_shape(t) for t in two.transfers]:
        raise RuntimeError(f"{name}: the trace's pattern changes with the size; record it directly instead.")
    transfers = [replace(a, numel=a.numel + (q - 1) * (b.numel - a.numel)) for a, b in zip(one.transfers, two.transfers)]
    return Traffic(transfers, world_size)


def channel_trace(world_size: int, numel: int, gpus_per_node: int, channels: int) -> Traffic:
    """A flat ring laid as ``channels`` rings at once (NCCL's channels), over nodes of ``gpus_per_node``.

    The data is cut into ``channels`` chunks (sizes differing by at most one
    element); channel ``j`` runs the recorded ring on its chunk, its ring
    positions placed on GPUs rotated by ``j·k/channels`` inside every node.
    So channel ``j`` leaves each node from local GPU ``(k − 1 + j·k/c) mod k``
    and enters the next at ``j·k/c``: the channels use ``c`` different network
    links of a node. Steps keep the ring's labels, so the channels run
    together (the same step of each is one step of the model).
    """
    k, c = gpus_per_node, channels
    if c < 1 or k % c:
        raise ValueError(f"channels={c} must divide gpus_per_node={k}.")

    def gpu(position: int, j: int) -> int:
        node, local = divmod(position, k)
        size = min(k, world_size - node * k)          # a last node that is not full
        return node * k + (local + j * k // c) % size

    transfers = []
    for j in range(c):
        chunk = numel // c + (j < numel % c)
        for t in collective_trace("ring", world_size, chunk).transfers:
            transfers.append(replace(t, src=gpu(t.src, j), dst=gpu(t.dst, j), meta=t.meta + (("channel", j),)))
    return Traffic(transfers, world_size)


@lru_cache(maxsize=256)
def _busiest_sides(name: str, world_size: int, numel: int, gpus_per_node: int | None, channels: int = 1) -> tuple:
    """Per step of the trace: ``(key, ((link, elements, side), ...))``, the busiest side of each link kind.

    All sides of one link kind share ``α`` and ``B``, so the busiest one of each
    kind is all the timing rule needs: a network's time is then ``O(steps)``,
    whatever the number of transfers (the widget redraws from this).
    """
    grouping = Network(1.0, 0.0, gpus_per_node)
    out = []
    for key, transfers in collective_trace(name, world_size, numel, gpus_per_node, channels).steps():
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
    node size (the whole world as one node if None); ``"ring"`` runs ``network.channels(world_size)``
    rings at once.
    """
    steps = []
    channels = network.channels(world_size) if name == "ring" else 1
    for key, sides in _busiest_sides(name, world_size, numel, network.gpus_per_node, channels):
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


def crossover(first: str, second: str, world_size: int, network: Network, itemsize: int = 4,
              time: Callable[..., float] | None = None, hi: int = 2**30) -> int | None:
    """The smallest message, in elements and a multiple of ``c·G``, from which ``first`` is faster than ``second``.

    Searched over ``numel = c·G·m`` for ``m`` in ``[1, hi]``, ``c = network.channels(G)`` (multiples of
    ``c·G``: the closed forms are exact there, and the model records one pattern for all of them).
    ``time(name, G, numel, network, itemsize)`` is :func:`closed_form_time` by default; pass
    ``lambda *a: collective_time(*a).total`` to search the model itself. Binary search: assumes
    one crossing (both times are maxima of lines in ``N``). None if ``first`` is never faster in the
    range; ``c·G`` if it always is; a ValueError if it is faster only below some size.

        >>> crossover("ring", "naive", 1024, Network(50e9, 10e-6)) * 4 // 1024    # KiB of float32
        980
    """
    time = time or closed_form_time
    lo, unit = 1, world_size * network.channels(world_size)

    def faster(m: int) -> bool:
        numel = m * unit
        return time(first, world_size, numel, network, itemsize) < time(second, world_size, numel, network, itemsize)

    if faster(lo):
        if faster(hi):
            return unit
        raise ValueError(f"{first} beats {second} on small messages and loses on large ones: ask "
                         f"crossover({second!r}, {first!r}, ...) for the size from which {second} wins.")
    if not faster(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if faster(mid) else (mid, hi)
    return hi * unit
