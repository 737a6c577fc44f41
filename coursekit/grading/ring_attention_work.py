"""The work a learner's ring attention does on one rank, watched: score blocks, merges, key/value blocks held.

Exact outputs, exact gradients and the ring's traffic do not make ring attention: a rank that uses the G−1 passes
only to collect every block, then runs one softmax over all G·L keys, gets all three — and is the full attention
the chapter replaces. What makes it ring attention is the work in between: each step scores the rank's L queries
against the one block it holds (an L×L score block, nothing larger), merges that block's result into the running
one (G−1 merges without a mask), and lets the block go: at most two blocks are held at once, the one computed
with and the one arriving (``coursekit.parallel.sequence.core``'s docstring promises as much). :class:`RankWork`
measures the three while the learner's forward runs on a rank:

* score blocks through a :class:`torch.overrides.TorchFunctionMode` (the mode is per thread: one simulated rank's),
  which sees every matmul's output and every softmax's input the learner's code computes, whatever the spelling
  (``@``, ``torch.matmul``, ``einsum``, ``block_attention``, ``scaled_dot_product_attention``);
* the key/value blocks held, through the tensors this rank sends and receives into (``coursekit.comm``'s transport
  seam), each followed by a weak reference to its storage: a block is held while anything keeps its memory alive,
  counted in blocks' worth of bytes (keys and values sent as one tensor or two count the same). Meaningful only in
  a forward without autograd (with it, every block is saved for backward, rightly);
* merges, by wrapping the learner's ``merge`` where the loop finds it (:func:`counting_merges`).

:func:`not_blockwise` turns one run's measures into the sentence a learner reads, or None.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from .. import comm

__all__ = ["RankWork", "counting_merges", "not_blockwise"]

MATMULS = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm", "addmm", "einsum", "tensordot"}
SOFTMAXES = {"softmax", "log_softmax", "logsumexp", "_softmax"}


class RankWork(TorchFunctionMode):
    """One rank's forward, watched: ``with comm.using(work.transport()), work:`` around the learner's call.

    ``block_bytes``: one key/value block's size (keys and values of L tokens). ``largest``: the largest score block
    (rows, keys) seen, by elements; ``blocks_held``: the most blocks' worth of memory alive at once in the tensors
    this rank sent or received into (its own inputs, which the caller holds anyway, left out: :meth:`own`);
    ``merges``: filled in by :func:`counting_merges`.
    """

    def __init__(self, block_bytes: int):
        super().__init__()
        self.block_bytes = block_bytes
        self.largest = (0, 0)
        self.blocks_held = 0.0
        self.merges = 0
        self._alive: dict[int, tuple[StorageWeakRef, int]] = {}  # storage address -> (its weak reference, bytes)
        self._own: set[int] = set()

    def own(self, *tensors) -> None:
        """The rank's own q, k, v: sending them holds nothing more."""
        self._own |= {t.untyped_storage().data_ptr() for t in tensors}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in MATMULS and hasattr(out, "shape") and out.dim() >= 2:
            self._saw(tuple(out.shape[-2:]))
        elif name in SOFTMAXES and args and hasattr(args[0], "shape") and args[0].dim() >= 2:
            self._saw(tuple(args[0].shape[-2:]))
        elif name == "scaled_dot_product_attention" and len(args) >= 2:
            self._saw((args[0].shape[-2], args[1].shape[-2]))
        return out

    def _saw(self, block: tuple[int, int]) -> None:
        if block[0] * block[1] > self.largest[0] * self.largest[1]:
            self.largest = block

    def passed(self, tensor) -> None:
        """A tensor sent or received into: count its memory, with the earlier ones' still alive."""
        storage = tensor.untyped_storage()
        self._alive = {at: held for at, held in self._alive.items() if not held[0].expired()}
        if storage.data_ptr() not in self._own:
            self._alive[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        held = sum(nbytes for _, nbytes in self._alive.values())
        self.blocks_held = max(self.blocks_held, held / self.block_bytes)

    def transport(self, inner=None) -> "_Passing":
        """The transport in use now (or ``inner``), showing this rank's messages to :meth:`passed`."""
        return _Passing(comm.current_transport() if inner is None else inner, self)


class _Passing:
    """A transport that passes everything through and shows each tensor sent or received to a :class:`RankWork`."""

    def __init__(self, inner, work: RankWork):
        self.inner, self.work = inner, work
        self.name = getattr(inner, "name", "watched")

    def __getattr__(self, name):        # rank, world_size, global_rank, group_rank
        return getattr(self.inner, name)

    def send(self, tensor, dst, group):
        self.work.passed(tensor)
        return self.inner.send(tensor, dst, group)

    def isend(self, tensor, dst, group):
        self.work.passed(tensor)
        return self.inner.isend(tensor, dst, group)

    def recv(self, tensor, src, group):
        self.work.passed(tensor)
        return self.inner.recv(tensor, src, group)

    def irecv(self, tensor, src, group):
        self.work.passed(tensor)
        return self.inner.irecv(tensor, src, group)


@contextmanager
def counting_merges(loop, merge, works: dict[int, RankWork]):
    """While the block runs, ``merge`` where ``loop`` finds it (its module's, or the notebook's, globals) counts
    each call into ``works[rank]``; put back afterwards. A loop that reaches merge otherwise is not counted."""
    found = getattr(loop, "__globals__", {})
    names = [name for name, value in list(found.items()) if value is merge]
    lock = threading.Lock()

    def counted(*args, **kwargs):
        work = works.get(comm.get_rank())
        if work is not None:
            with lock:
                work.merges += 1
        return merge(*args, **kwargs)

    for name in names:
        found[name] = counted
    try:
        yield
    finally:
        for name in names:
            found[name] = merge


def not_blockwise(works: list[RankWork], world_size: int, causal: bool, length: int, head_dim: int,
                  held: bool = False) -> str | None:
    """What says that the ranks did not do ring attention's blockwise work, or None.

    ``length``: L, the tokens per rank; a score block may be L × max(L, d) (the output of p·v, L×d, is not a
    score block, but has the same spelling). ``held``: judge the blocks held too (a forward without autograd).
    """
    where = f"G={world_size}{', causal' if causal else ''}"
    step = (f"ring attention scores one L×L block per step ({length}×{length}: your queries against the key/value "
            f"block you hold), merges it into the running result and passes the block on")
    for rank, work in enumerate(works):
        rows, keys = work.largest
        if rows * keys > length * max(length, head_dim):
            merges = f" and called merge {work.merges} times" + ("" if causal else f" (the ring: G−1 = {world_size - 1})")
            return (f"{where}: this computes full attention on every rank: rank {rank} computed a {rows}×{keys} score "
                    f"block{merges}; {step}")
        if held and work.blocks_held > 2 + 1e-9:
            return (f"{where}: this gathers the whole sequence's keys and values on every rank: rank {rank} held "
                    f"{work.blocks_held:.3g} key/value blocks at once besides its own; {step}, and lets it go: it "
                    f"holds two blocks at most (the one it computes with and the one arriving)")
    return None
