"""All-reduce three ways, built only from point-to-point ``send``/``recv`` (seed claims R3–R7).

    >>> import torch, coursekit
    >>> from coursekit.collectives import ring_all_reduce
    >>> def step(rank, world_size):
    ...     grad = torch.full((10,), float(rank + 1))
    ...     return ring_all_reduce(grad).tolist()      # in place, like dist.all_reduce(grad)
    >>> coursekit.launch(step, 4)[0]
    [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]

Every function mirrors ``torch.distributed``: ``(tensor, group=None)``, works in
place, returns the tensor, sums (``op=SUM``). The same code runs on real ranks
and in :func:`coursekit.comm.simulate`, and every transfer is counted by
:func:`coursekit.comm.record`.

Traffic, for ``N`` elements on ``G`` ranks (payload elements over all links):

==================  ==================  =========================================
algorithm           total               busiest rank sends + receives
==================  ==================  =========================================
naive               G·(G−1)·N           2·(G−1)·N (every rank)
master (root)       2·(G−1)·N           2·(G−1)·N, all through the root
ring                2·(G−1)·N exactly   ≈ 4·(G−1)·N/G (see :func:`ring_traffic`)
==================  ==================  =========================================

Every rank ends with bit-identical values: each sum is formed in one fixed
order (rank order for naive and master, along the ring for ring), never in
"my own order", which would differ in the last bits between ranks.

Before any payload moves, ranks exchange ``(length, dtype)`` with their peers
(a few *control* messages, counted apart from the payload), so mismatched
tensors raise a clear error instead of hanging or aborting gloo. The price is
one extra message latency per call: noticeable for tiny tensors, negligible
for large ones.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from . import comm

__all__ = ["naive_all_reduce", "master_all_reduce", "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce",
           "segment_bounds", "owned_segment", "ring_traffic", "RingStep", "ring_walkthrough", "seed_label"]

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


# --------------------------------------------------------------------------
# Segments: who owns what.
# --------------------------------------------------------------------------
def segment_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the ``world_size`` segments of a flat tensor of ``numel`` elements.

    Same split as ``torch.tensor_split(flat, world_size)``: the first
    ``numel % world_size`` segments have one element more. Some are empty when
    ``numel < world_size``.

        >>> segment_bounds(10, 4)
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for k in range(world_size):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def owned_segment(rank: int, world_size: int) -> int:
    """The segment a rank holds fully reduced after :func:`ring_reduce_scatter`: ``(rank + 1) % world_size``.

    Why not ``rank``: in step 1 rank ``r`` sends its own segment ``r`` to its
    right neighbour (the seed's "GPU1 sends a₁ to GPU2", R5), so after ``G−1``
    steps the complete sum of segment ``r`` arrives one rank further on.
    """
    return (rank + 1) % world_size


def ring_traffic(numel: int, world_size: int) -> dict[int, int]:
    """Payload elements each rank *sends* in :func:`ring_all_reduce` (each also receives the same total).

    Rank ``r`` sends every segment except ``(r+1) % G`` in reduce-scatter and
    every segment except ``(r+2) % G`` in all-gather, so it sends
    ``2·N − len((r+1) % G) − len((r+2) % G)`` elements. Summed over ranks that
    is exactly ``2·(G−1)·N`` for any ``N``; when ``G`` divides ``N`` every rank
    sends ``2·(G−1)·N/G``. (Empty segments are not sent at all.)

        >>> ring_traffic(10, 4)
        {0: 15, 1: 16, 2: 15, 3: 14}
    """
    if world_size == 1:
        return {0: 0}
    lengths = [stop - start for start, stop in segment_bounds(numel, world_size)]
    return {r: 2 * numel - lengths[(r + 1) % world_size] - lengths[(r + 2) % world_size] for r in range(world_size)}


# --------------------------------------------------------------------------
# Helpers: a flat view, a reusable receive buffer, the length check.
# --------------------------------------------------------------------------
def _flat(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {type(tensor).__name__}.")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} works in place on the tensor's memory, which must be contiguous; "
                         f"this one is a strided view (shape {tuple(tensor.shape)}, stride {tensor.stride()}). "
                         f"Pass tensor.contiguous() and copy the result back.")
    return tensor.view(-1)


_scratch = threading.local()  # per thread: the simulator runs each rank as a thread


def _buffer(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A receive buffer of ``numel`` elements, reused across calls (fresh large allocations page-fault)."""
    key = (like.dtype, like.device)
    cache = getattr(_scratch, "buffers", None)
    if cache is None:
        cache = _scratch.buffers = {}
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel]


def _describe(signature: list[int]) -> str:
    numel, code = signature
    return f"{numel} elements of {_DTYPES[code] if 0 <= code < len(_DTYPES) else 'another dtype'}"


class _LengthCheck:
    """Tell the ranks that send to us our ``(numel, dtype)``; hear it from the ranks we send to.

    Gloo aborts the whole process when a message does not fit its receive
    buffer. So the rule is: **never send payload to a rank before knowing its
    length equals ours** (:meth:`verify` just before the first payload send).
    Receives can then be posted at once, sized for our own length: a message
    of another length is never sent. The control message and the first
    receive travel at the same time, so the check adds almost no latency.
    A rank that finds a mismatch raises; its peers wait on it until the
    launcher (or the simulator) stops them and reports that error.
    """

    def __init__(self, flat: torch.Tensor, name: str, group, send_to: list[int], recv_from: list[int]):
        code = _DTYPES.index(flat.dtype) if flat.dtype in _DTYPES else -1
        self.mine = torch.tensor([flat.numel(), code], dtype=torch.int64)
        self.name, self.group, self.recv_from = name, group, recv_from
        self.theirs = [torch.empty(2, dtype=torch.int64) for _ in recv_from]
        with comm.control(), comm.phase("check lengths"):
            self.receives = [comm.irecv(buf, peer, group) for buf, peer in zip(self.theirs, recv_from)]
            self.sends = [comm.isend(self.mine, peer, group) for peer in send_to]

    def finish(self) -> None:
        """Wait for our own control sends (they completed long ago; this just keeps it tidy)."""
        for work in self.sends:
            work.wait()

    def verify(self) -> None:
        """Wait for the peers' ``(numel, dtype)`` and raise if any differs from ours."""
        for work in self.receives:
            work.wait()
        for peer, other in zip(self.recv_from, self.theirs):
            if not torch.equal(other, self.mine):
                raise ValueError(f"{self.name}: rank {comm.get_rank(self.group)} has {_describe(self.mine.tolist())} "
                                 f"but rank {peer} has {_describe(other.tolist())}. Every rank must pass a tensor "
                                 f"of the same length and dtype (did one rank build its gradients differently?).")


# --------------------------------------------------------------------------
# Naive: everyone sends everything to everyone (R3).
# --------------------------------------------------------------------------
def naive_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank sends its whole tensor to every other rank, then adds all ``G`` tensors in rank order.

    Traffic: ``G·(G−1)·N`` elements; every rank sends and receives ``(G−1)·N``.

        >>> naive_all_reduce(grad)      # doctest: +SKIP
    """
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    flat = _flat(work, "naive_all_reduce")
    size, rank = comm.get_world_size(group), comm.get_rank(group)
    if size == 1:
        return tensor
    peers = [p for p in range(size) if p != rank]
    check = _LengthCheck(flat, "naive_all_reduce", group, peers, peers)
    everyone = _buffer(size * flat.numel(), flat).view(size, flat.numel())
    everyone[rank].copy_(flat)
    with comm.phase("exchange", step=0, op="all"):
        works = [comm.irecv(everyone[p], p, group) for p in peers if flat.numel()]
        check.verify()
        works += [comm.isend(flat, p, group) for p in peers if flat.numel()]
        for w in works:
            w.wait()
    check.finish()
    flat.copy_(everyone[0])
    for p in range(1, size):  # the same order on every rank: bit-identical results
        flat.add_(everyone[p])
    if work is not tensor:
        tensor.copy_(work)
    return tensor


# --------------------------------------------------------------------------
# Single master ("parameter server"): all to one, one to all (R4).
# --------------------------------------------------------------------------
def master_all_reduce(tensor: torch.Tensor, root: int = 0, group=None) -> torch.Tensor:
    """Every rank sends its tensor to ``root``, which adds them in rank order and sends the sum back.

    Traffic: ``2·(G−1)·N`` elements, every one of them into or out of ``root``
    (it receives ``(G−1)·N`` and sends ``(G−1)·N``; the others ``N`` each way).

        >>> master_all_reduce(grad, root=0)      # doctest: +SKIP
    """
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    flat = _flat(work, "master_all_reduce")
    size, rank = comm.get_world_size(group), comm.get_rank(group)
    if not 0 <= root < size:
        raise ValueError(f"master_all_reduce: root={root} is not a rank of this group (0..{size - 1}).")
    if size == 1:
        return tensor
    others = [p for p in range(size) if p != root]
    if rank == root:
        check = _LengthCheck(flat, "master_all_reduce", group, others, others)
        everyone = _buffer(size * flat.numel(), flat).view(size, flat.numel())
        everyone[root].copy_(flat)
        with comm.phase("gather", step=0, op="sum"):
            works = [comm.irecv(everyone[p], p, group) for p in others if flat.numel()]
            for w in works:
                w.wait()
        flat.copy_(everyone[0])
        for p in range(1, size):  # rank order: the same sum whichever rank is root
            flat.add_(everyone[p])
        check.verify()  # before the first send back
        with comm.phase("broadcast", step=0, op="copy"):
            works = [comm.isend(flat, p, group) for p in others if flat.numel()]
            for w in works:
                w.wait()
        check.finish()
    else:
        check = _LengthCheck(flat, "master_all_reduce", group, [root], [root])
        check.verify()  # before sending to the root
        check.finish()
        if flat.numel():
            with comm.phase("gather", step=0, op="sum"):
                comm.send(flat, root, group)
            with comm.phase("broadcast", step=0, op="copy"):
                comm.recv(flat, root, group)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


# --------------------------------------------------------------------------
# Ring: reduce-scatter then all-gather (R5, R6).
# --------------------------------------------------------------------------
def _send(segment: torch.Tensor, right: int, group, phase: str, step: int, k: int, op: str):
    """Start sending segment ``k`` to the right neighbour, labelled for the record; None if it is empty."""
    if not segment.numel():
        return None  # empty segments (N < G) are skipped on both sides
    with comm.phase(phase, step=step, segment=k, op=op):
        return comm.isend(segment, right, group)


def _recv(into: torch.Tensor, left: int, group):
    return comm.irecv(into, left, group) if into.numel() else None


def ring_reduce_scatter(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Phase 1 of the ring ("share-reduce", R5). Returns this rank's fully reduced segment (a view).

    The flat tensor is split like ``torch.tensor_split(tensor.view(-1), G)``
    (:func:`segment_bounds`). In step ``s = 0 … G−2`` rank ``r`` sends its
    running sum of segment ``(r − s) % G`` to rank ``r+1`` and adds what rank
    ``r−1`` sends into segment ``(r − s − 1) % G``. Afterwards rank ``r`` holds
    the complete sum of segment :func:`owned_segment` ``= (r + 1) % G``, returned
    as a view into ``tensor``; the other segments of ``tensor`` hold partial
    sums (scratch). ``tensor`` must be contiguous. With ``G = 1`` the whole
    tensor is returned.

    Each rank sends ``N − len(segment (r+1) % G)`` elements, ``(G−1)·N`` in all.

        >>> mine = ring_reduce_scatter(grad)      # doctest: +SKIP
    """
    flat = _flat(tensor, "ring_reduce_scatter")
    size, rank = comm.get_world_size(group), comm.get_rank(group)
    if size == 1:
        return flat
    check = _LengthCheck(flat, "ring_reduce_scatter", group, [(rank - 1) % size], [(rank + 1) % size])
    return _reduce_scatter(flat, size, rank, group, check)


def _reduce_scatter(flat: torch.Tensor, size: int, rank: int, group, check: _LengthCheck | None) -> torch.Tensor:
    right, left, steps = (rank + 1) % size, (rank - 1) % size, size - 1
    segments = flat.tensor_split(size)
    width = segments[0].numel()  # the largest segment
    scratch = _buffer(2 * width, flat)
    buffers = (scratch[:width], scratch[width:])  # two: receive step s+1 while adding step s

    def receive(step):  # in step s, segment (r - s - 1) % G arrives from the left
        k = (rank - step - 1) % size
        into = buffers[step % 2][:segments[k].numel()]
        return k, into, _recv(into, left, group)

    incoming = receive(0)
    if check is not None:
        check.verify()  # before the first send: see _LengthCheck
    sending = _send(segments[rank], right, group, "reduce-scatter", 0, rank, "sum")  # step 0: own segment r
    for step in range(steps):
        k, into, receiving = incoming
        if step + 1 < steps:
            # Posted early, so the left neighbour's next send finds its receive waiting.
            incoming = receive(step + 1)
        if receiving is not None:
            receiving.wait()
            segments[k].add_(into)  # "added to b₁" (R5)
        if sending is not None:
            sending.wait()
        if step + 1 < steps:  # pass on the running sum we just added to
            sending = _send(segments[k], right, group, "reduce-scatter", step + 1, k, "sum")
    if check is not None:
        check.finish()
    return segments[owned_segment(rank, size)]


def ring_all_gather(segment: torch.Tensor, out: torch.Tensor, group=None) -> torch.Tensor:
    """Phase 2 of the ring ("share-only", R6): every rank ends with every rank's segment in ``out``.

    ``segment`` is this rank's piece, i.e. segment :func:`owned_segment`
    ``(r + 1) % G`` of ``out`` (as :func:`ring_reduce_scatter` returns it);
    it is copied there unless it already is that view. In step ``s`` rank ``r``
    sends segment ``(r + 1 − s) % G`` to rank ``r+1`` and receives segment
    ``(r − s) % G`` from rank ``r−1`` straight into ``out``. Returns ``out``.

    Each rank sends ``N − len(segment (r+2) % G)`` elements, ``(G−1)·N`` in all.

        >>> ring_all_gather(mine, grad)      # doctest: +SKIP
    """
    flat = _flat(out, "ring_all_gather")
    size, rank = comm.get_world_size(group), comm.get_rank(group)
    start, stop = segment_bounds(flat.numel(), size)[owned_segment(rank, size)]
    if segment.numel() != stop - start:
        raise ValueError(f"ring_all_gather: rank {rank} owns segment {owned_segment(rank, size)} of out "
                         f"(elements {start}:{stop}, {stop - start} of them) but was given a segment of "
                         f"{segment.numel()} elements. Pass the view ring_reduce_scatter returned.")
    check = _LengthCheck(flat, "ring_all_gather", group, [(rank - 1) % size], [(rank + 1) % size]) \
        if size > 1 else None
    _all_gather(segment, flat, size, rank, group, check)
    return out


def _all_gather(segment: torch.Tensor, flat: torch.Tensor, size: int, rank: int, group,
                check: _LengthCheck | None = None) -> None:
    right, left, steps = (rank + 1) % size, (rank - 1) % size, size - 1
    segments = flat.tensor_split(size)
    own = owned_segment(rank, size)
    if segment.data_ptr() != segments[own].data_ptr() and segments[own].numel():
        segments[own].copy_(segment.reshape(-1))
    if size == 1:
        return
    # Every segment arrives straight into its place in out, so all receives can be posted now:
    # in step s, segment (r - s) % G comes from the left.
    receiving = [((rank - s) % size, _recv(segments[(rank - s) % size], left, group)) for s in range(steps)]
    if check is not None:
        check.verify()  # before the first send: see _LengthCheck
    sending = _send(segments[own], right, group, "all-gather", 0, own, "copy")
    for step, (k, work) in enumerate(receiving):
        if work is not None:
            work.wait()
        if sending is not None:
            sending.wait()
        if step + 1 < steps:  # pass on what just arrived
            sending = _send(segments[k], right, group, "all-gather", step + 1, k, "copy")
    if check is not None:
        check.finish()


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Ring all-reduce = :func:`ring_reduce_scatter` then :func:`ring_all_gather`, in place (R5–R7).

    ``2·(G−1)`` steps; each rank sends and receives about ``2·(G−1)·N/G``
    elements (exactly :func:`ring_traffic`), ``2·(G−1)·N`` in total: as much as
    the single master, but spread evenly over all ranks and links.

        >>> ring_all_reduce(grad)      # doctest: +SKIP
    """
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    flat = _flat(work, "ring_all_reduce")
    size, rank = comm.get_world_size(group), comm.get_rank(group)
    if size > 1:
        check = _LengthCheck(flat, "ring_all_reduce", group, [(rank - 1) % size], [(rank + 1) % size])
        mine = _reduce_scatter(flat, size, rank, group, check)
        _all_gather(mine, flat, size, rank, group)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


# --------------------------------------------------------------------------
# The worked example, symbolically: replay a recorded ring run over labels.
# --------------------------------------------------------------------------
_LETTERS = "abcdefghijklmnop"
_SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def seed_label(rank: int, segment: int) -> str:
    """The seed's name for a rank's segment: rank 0 (GPU1) holds a₁ … a₄, rank 1 b₁ …, and so on."""
    return _LETTERS[rank] + str(segment + 1).translate(_SUBSCRIPTS)


class RingStep(NamedTuple):
    """One step of a recorded ring run, with symbolic values.

    ``sends`` lists ``(src, dst, segment, value_sent)``; ``state[r][k]`` is rank
    ``r``'s segment ``k`` after the step, as a tuple of terms (``("a₁", "b₁")``
    means a₁+b₁).
    """

    phase: str
    step: int
    sends: list
    state: list

    def describe(self) -> list[str]:
        """The seed's sentences: "GPU1 sends a₁ to GPU2, added to b₁"."""
        lines = []
        for src, dst, k, value in self.sends:
            sent = _term(value)
            if self.phase == "reduce-scatter":
                before = self.state[dst][k][len(value):]
                lines.append(f"GPU{src + 1} sends {sent} to GPU{dst + 1}, added to {_term(before)}")
            else:
                lines.append(f"GPU{src + 1} sends {sent} to GPU{dst + 1}, which keeps it as segment {k + 1}")
        return lines


def _term(terms: tuple) -> str:
    return terms[0] if len(terms) == 1 else "(" + "+".join(terms) + ")"


def replay(traffic: comm.Traffic, world_size: int, labels=seed_label) -> list[RingStep]:
    """Replay a recorded run over symbolic labels: which sum each segment holds after every step.

    Uses what each transfer recorded: its ``segment`` and ``op`` (``"sum"``:
    the receiver adds it, sent terms first; ``"copy"``: the receiver keeps it).
    """
    state = [[(labels(r, k),) for k in range(world_size)] for r in range(world_size)]
    steps = []
    for (phase_name, step), transfers in traffic.steps():
        sends = [(t.src, t.dst, t.get("segment"), state[t.src][t.get("segment")]) for t in transfers]
        for (src, dst, k, value), t in zip(sends, transfers):
            state[dst][k] = value + state[dst][k] if t.get("op") == "sum" else value
        steps.append(RingStep(phase_name, step, sends, [list(row) for row in state]))
    return steps


def ring_walkthrough(world_size: int) -> list[RingStep]:
    """Run :func:`ring_all_reduce` in the simulator (one element per segment) and replay it symbolically.

        >>> ring_walkthrough(4)[0].describe()[0]
        'GPU1 sends a₁ to GPU2, added to b₁'
    """
    def run(rank, size):
        ring_all_reduce(torch.full((size,), float(rank + 1)))

    _, traffic = comm.simulate(run, world_size)
    return replay(traffic, world_size)
