"""What was sent: one :class:`Transfer` per point-to-point message, one :class:`Collective` per call of torch's
collectives through ``comm``, and :class:`Traffic`, a run's worth of them.

:func:`coursekit.comm.record` fills a :class:`Traffic` with every message this
rank sends; :meth:`Traffic.merge` joins the per-rank records into the whole
picture, and its properties answer what a learner asks of it (total elements,
per-rank and per-link load, the busiest rank). Plain data: nothing here talks
to another rank.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Transfer", "Collective", "CollectiveCounts", "Traffic"]


@dataclass(frozen=True)
class Transfer:
    """One point-to-point message, as seen by its sender.

    ``kind`` is ``"payload"`` for data or ``"control"`` for bookkeeping such as
    the length check before a collective (not counted in :attr:`Traffic.total`).
    """

    phase: str | None
    step: int | None
    src: int
    dst: int
    numel: int
    itemsize: int
    kind: str = "payload"
    meta: tuple = ()
    seq: int = 0

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value given to :func:`phase`, e.g. ``t.get("segment")``."""
        return dict(self.meta).get(key, default)


@dataclass(frozen=True)
class Collective:
    """One call of a ``torch.distributed`` collective through ``comm`` (:func:`coursekit.comm.all_reduce`, ...).

    ``numel``: the size of the reduced tensor, or of everything gathered (``b·s·h`` for a layer's activations,
    not the bytes on the wire); ``direction``: ``"forward"``, or ``"backward"`` when autograd issued it;
    ``start_ns``/``end_ns``: ``time.perf_counter_ns()`` around the blocking call (the same for one issued
    ``async_op``); ``source``: ``"comm"`` (torch's, through :mod:`coursekit.comm`) or ``"collectives"`` (a set
    of :mod:`coursekit.collectives`, as a data-parallel strategy chose it: the ring's or torch's).
    """

    op: str
    direction: str
    numel: int
    itemsize: int
    start_ns: int = 0
    end_ns: int = 0
    source: str = "comm"

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9


class CollectiveCounts:
    """How many collectives, and of how many elements, keyed ``(op, direction)``: read from a list of
    :class:`Collective` records, those of one ``source`` if given (live: a record still being filled is read as
    it is now).

        >>> counts = CollectiveCounts([Collective("all_reduce", "forward", 6, 4), Collective("all_reduce", "forward", 2, 4)])
        >>> counts.calls["all_reduce", "forward"], counts.elements["all_reduce", "forward"]
        (2, 8)
    """

    OPS, DIRECTIONS = ("all_reduce", "all_gather"), ("forward", "backward")

    def __init__(self, records: list, source: str | None = None):
        self._all, self.source = records, source

    @property
    def records(self) -> list:
        """The records counted: every one, or those of :attr:`source` (``Collective.source``)."""
        return self._all if self.source is None else [c for c in self._all if c.source == self.source]

    @property
    def calls(self) -> Counter:
        return Counter((c.op, c.direction) for c in self.records)

    @property
    def elements(self) -> Counter:
        out: Counter = Counter()
        for c in self.records:
            out[c.op, c.direction] += c.numel
        return out

    def total(self, op: str) -> int:
        """Elements of every ``op`` call, forward and backward."""
        return sum(c.numel for c in self.records if c.op == op)

    @property
    def seconds(self) -> float:
        """Wall time spent inside the blocking calls."""
        return sum(c.seconds for c in self.records)

    def as_dict(self, prefix: str = "tp_") -> dict[str, int]:
        """Flat counters, e.g. ``{"tp_all_reduce_forward_calls": 5, "tp_all_reduce_forward_elements": ...}``."""
        calls, elements = self.calls, self.elements
        return {f"{prefix}{op}_{direction}_{what}": counter[op, direction]
                for op in self.OPS for direction in self.DIRECTIONS
                for what, counter in (("calls", calls), ("elements", elements))}


@dataclass
class Traffic:
    """Every transfer recorded in one run, and the numbers a learner asks of it.

        >>> traffic = Traffic([Transfer("ring", 0, src=0, dst=1, numel=6, itemsize=4),
        ...                    Transfer("ring", 0, src=1, dst=0, numel=2, itemsize=4)], world_size=2)
        >>> traffic.total, traffic.sent, traffic.links, traffic.busiest_rank
        (8, {0: 6, 1: 2}, {(0, 1): 6, (1, 0): 2}, 0)
    """

    transfers: list = field(default_factory=list)
    world_size: int | None = None
    collectives: list = field(default_factory=list)  # this rank's torch collectives through comm, in order
    #: seconds this rank's waits on isend/irecv blocked, by the phase the transfer was posted in (timing: not compared)
    waited: dict = field(default_factory=dict, compare=False)

    # ---------------------------------------------------------------- building
    @classmethod
    def merge(cls, parts: "list[Traffic]") -> "Traffic":
        """Combine per-rank records (e.g. the list ``launch`` returned) into one, in send order."""
        transfers = [t for part in parts if part is not None for t in part.transfers]
        sizes = [p.world_size for p in parts if p is not None and p.world_size]
        merged = cls(sorted(transfers, key=lambda t: (t.seq, t.src)), max(sizes) if sizes else None)
        merged.collectives = [c for part in parts if part is not None for c in part.collectives]
        for part in parts:
            for name, seconds in ({} if part is None else part.waited).items():
                merged.note_wait(name, seconds)
        return merged

    def note_wait(self, phase: str | None, seconds: float) -> None:
        """Add ``seconds`` a wait blocked to ``phase``'s (:class:`coursekit.comm.Work` calls it)."""
        self.waited[phase] = self.waited.get(phase, 0.0) + seconds

    def collective_counts(self, source: str = "comm") -> CollectiveCounts:
        """The collectives ``source`` issued (``"comm"``: torch's through comm; ``"collectives"``: a set of
        :mod:`coursekit.collectives`), counted by ``(op, direction)``; read as the record is now."""
        return CollectiveCounts(self.collectives, source)

    # ---------------------------------------------------------------- views
    @property
    def payload(self) -> list:
        return [t for t in self.transfers if t.kind == "payload"]

    @property
    def control(self) -> list:
        return [t for t in self.transfers if t.kind == "control"]

    @property
    def total(self) -> int:
        """Elements of payload moved, summed over every link."""
        return sum(t.numel for t in self.payload)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.payload)

    @property
    def messages(self) -> int:
        return len(self.payload)

    def _ranks(self) -> list[int]:
        seen = {t.src for t in self.transfers} | {t.dst for t in self.transfers}
        top = max(seen, default=-1) + 1
        return list(range(max(top, self.world_size or 0)))

    @property
    def sent(self) -> dict[int, int]:
        """Payload elements each rank sent."""
        out = {r: 0 for r in self._ranks()}
        for t in self.payload:
            out[t.src] += t.numel
        return out

    @property
    def received(self) -> dict[int, int]:
        """Payload elements each rank received."""
        out = {r: 0 for r in self._ranks()}
        for t in self.payload:
            out[t.dst] += t.numel
        return out

    @property
    def links(self) -> dict[tuple[int, int], int]:
        """Payload elements per directed link ``(src, dst)``."""
        out: dict[tuple[int, int], int] = defaultdict(int)
        for t in self.payload:
            out[(t.src, t.dst)] += t.numel
        return dict(out)

    @property
    def busiest_rank(self) -> int | None:
        """The rank that sent plus received the most (the lowest such rank on a tie)."""
        sent, received = self.sent, self.received
        if not sent:
            return None
        return max(sent, key=lambda r: (sent[r] + received[r], -r))

    def steps(self) -> list[tuple[tuple[str | None, int | None], list]]:
        """Payload transfers grouped by ``(phase, step)``, in the order they happened."""
        groups: dict = {}
        for t in self.payload:
            groups.setdefault((t.phase, t.step), []).append(t)
        return list(groups.items())

    def trace(self) -> list[tuple]:
        """A canonical, comparable form: two runs of the same algorithm give equal traces."""
        return sorted((t.phase or "", -1 if t.step is None else t.step, t.src, t.dst, t.numel, t.kind, t.meta)
                      for t in self.transfers)

    def summary(self) -> str:
        """A short text table: totals, per-rank sent/received, busiest rank."""
        sent, received = self.sent, self.received
        lines = [f"{self.messages} messages, {self.total} elements ({self.total_bytes} bytes) of payload"
                 f"{f', {len(self.control)} control messages' if self.control else ''}",
                 "rank    sent  received"]
        lines += [f"{r:>4} {sent[r]:>7} {received[r]:>9}" for r in sent]
        lines.append(f"busiest rank: {self.busiest_rank}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Traffic({self.messages} messages, {self.total} elements, "
                f"world_size={self.world_size}, busiest_rank={self.busiest_rank})")
