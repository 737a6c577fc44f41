"""Live memory, exact: every tensor the ops of a region create, counted from its birth to its free.

:func:`coursekit.parallel.sequence.saved_bytes` counts what a forward *keeps* for backward: the plateau a
rank holds between its forward and its backward. A rank needs more than that at its worst moment: the
transients -- an all-gathered input that lives while a matmul reads it, a reduce-scatter's received
pieces, a score block, and in backward the gradients flowing back, each alive beside what is still
saved. The **peak** of live bytes is what must fit in a device's memory.

:class:`LiveMemory` measures it exactly, with no sampling and no allocator in the way. PyTorch sends every
operator call through its dispatcher; a ``TorchDispatchMode`` (``torch.utils._python_dispatch``, the
extension point PyTorch documents for ``__torch_dispatch__``; its own ``torch.distributed._tools``
memory tracker is built on the same) sees each call and its outputs. For each output whose storage is new
-- not a view of an input, not written in place, not seen before -- it adds the storage's bytes, and
``weakref.finalize`` on the storage subtracts them when the storage is freed (Python frees a storage the
moment its last tensor goes). So ``live`` is, at every moment, the bytes of the storages the region's
ops created that are still alive; parameters and inputs, created before, never count. What a kernel
allocates *inside* itself and frees before returning (a workspace) is not an output and is not seen.

    >>> layer, x, dy = torch.nn.Linear(4, 3), torch.randn(2, 4, requires_grad=True), torch.ones(2, 3)
    >>> with LiveMemory(params=layer.parameters()) as mem:
    ...     y = layer(x)                    # y: 2 × 3 floats, 24 bytes (x and the weight were there before)
    ...     mem.mark("forward")
    ...     y.backward(dy)                  # x.grad = dy @ W: 2 × 4 floats; the weight's and bias's left out
    >>> mem.marks["forward"], mem.peak, mem.at_peak
    (24, 56, {'mm': 32, 'addmm': 24})

:func:`forward_backward_memory` runs one module's forward and backward under it and returns the plateau
(what the forward keeps) and the peak.

**One rank of many, in this process.** A rank's memory depends on the shapes it computes with, not on
the values its peers send. :func:`as_rank` makes this process rank ``r`` of ``G`` with a *fake* process
group (the ``"fake"`` backend that ``torch.testing._internal.distributed.fake_pg`` registers: every
collective returns at once and moves nothing), as torchtitan's memory estimator runs one rank of a large
job; the results are garbage, the live bytes are that rank's exactly, and on one thread: no communication
thread decides when a buffer is freed (on gloo a worker thread can drop the last reference to a tensor
it moved after the program has, by a margin that varies run to run).

Each number is a sum over the timeline :attr:`LiveMemory.events`, computed when the region ends, after
the storages that became a parameter's ``.grad`` are taken out: those are model state (chapter 02's
gradients), not activations, however early they were born.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["LiveMemory", "Event", "ActivationMemory", "forward_backward_memory", "as_rank"]


@dataclass(frozen=True)
class Event:
    """One storage born (``bytes > 0``) or freed (``bytes < 0``): which op created it, and its id."""

    op: str
    storage: int
    bytes: int


class LiveMemory(TorchDispatchMode):
    """Exact live bytes of the tensors the ops inside ``with LiveMemory() as mem:`` create (module docstring).

    ``params``: parameters whose ``.grad`` storages, found when the region ends, are left out of every
    number (model state, not activations). Inside the region :meth:`mark` names a moment (``"forward"``:
    what the forward keeps, the plateau). After it:

    * :attr:`peak` -- the most bytes live at once; :attr:`peak_op` -- the op whose output reached it;
    * :attr:`at_peak` -- what was live at that moment, bytes per creating op (largest first);
    * :attr:`marks` -- the bytes live at each marked moment; :attr:`live` -- the bytes still live at the end;
    * :meth:`born_after` -- the part of the peak born after a marked moment (in backward: the transients).

    One thread's ops only (the dispatch mode is per thread). Measure a rank under :func:`as_rank`, exact
    and the same every run; in a :func:`coursekit.launch` rank it counts too, but gloo's threads may free a
    tensor they moved late; not in :func:`coursekit.comm.simulate`'s threads, where a send's copy is born
    on one thread and freed on another.
    """

    def __init__(self, params=()):
        super().__init__()
        self._params = list(params)
        self.events: list[Event] = []
        self._live: dict[int, int] = {}          # storage data_ptr -> our id, while it lives
        self._finalizers: list[weakref.finalize] = []
        self._marks: list[tuple[str, int]] = []  # (name, number of events at that moment)
        self._next = 0
        self._open = False
        self._left_out: set[int] = set()

    # ------------------------------------------------------------------ while running
    def __enter__(self):
        self._open = True
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._open = False
        for f in self._finalizers:               # later frees are not this region's
            f.detach()
        grads = {p.grad.untyped_storage().data_ptr() for p in self._params if p.grad is not None}
        self._left_out = {i for ptr, i in self._live.items() if ptr in grads}
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._born(t, func, inputs)
        return out

    def _born(self, tensor: torch.Tensor, func, inputs: set[int]) -> None:
        storage = tensor.untyped_storage()
        ptr, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or ptr in inputs or ptr in self._live:   # empty, a view or in place, or counted already
            return
        key, self._next = self._next, self._next + 1
        self._live[ptr] = key
        name = str(func.overloadpacket.__name__)
        self.events.append(Event(name, key, size))
        self._finalizers.append(weakref.finalize(storage, self._freed, ptr, key, name, size))

    def _freed(self, ptr: int, key: int, name: str, size: int) -> None:
        if self._open and self._live.get(ptr) == key:
            del self._live[ptr]
            self.events.append(Event(name, key, -size))

    def mark(self, name: str) -> None:
        """Name this moment; :attr:`marks` gives the bytes live here once the region has ended."""
        self._marks.append((name, len(self.events)))

    # ------------------------------------------------------------------ afterwards
    def _timeline(self) -> list[int]:
        """Bytes live after each event (the parameters' gradients left out)."""
        live, out = 0, []
        for e in self.events:
            live += 0 if e.storage in self._left_out else e.bytes
            out.append(live)
        return out

    @property
    def peak(self) -> int:
        return max(self._timeline(), default=0)

    @property
    def live(self) -> int:
        return (self._timeline() or [0])[-1]

    @property
    def marks(self) -> dict[str, int]:
        timeline = [0] + self._timeline()
        return {name: timeline[n] for name, n in self._marks}

    @property
    def peak_op(self) -> str:
        timeline = self._timeline()
        return self.events[timeline.index(max(timeline))].op if timeline else ""

    def _alive_at_peak(self) -> list[tuple[int, Event]]:
        """(index of its birth, its event) for every storage live at the peak."""
        timeline = self._timeline()
        alive: dict[int, tuple[int, Event]] = {}
        for i, e in enumerate(self.events[:timeline.index(max(timeline)) + 1] if timeline else []):
            if e.storage not in self._left_out:
                alive[e.storage] = (i, e)
                if e.bytes < 0:
                    del alive[e.storage]
        return list(alive.values())

    @property
    def at_peak(self) -> dict[str, int]:
        """Bytes per creating op among the storages live at the peak, largest first."""
        per_op: dict[str, int] = {}
        for _, e in self._alive_at_peak():
            per_op[e.op] = per_op.get(e.op, 0) + e.bytes
        return dict(sorted(per_op.items(), key=lambda kv: -kv[1]))

    def born_after(self, name: str) -> int:
        """Bytes live at the peak that were born after the moment :meth:`mark` named ``name`` (the transients)."""
        start = dict(self._marks)[name]
        return sum(e.bytes for i, e in self._alive_at_peak() if i >= start)


@dataclass(frozen=True)
class ActivationMemory:
    """One forward + backward of a module on one rank, bytes: ``plateau`` what is live at the end of the
    forward, ``peak`` the most live at once, ``transient`` the part of the peak born in the backward (the
    rest is what the forward kept and the backward has not freed yet), ``at_peak`` what was live then (per
    creating op), ``peak_op`` the op whose output reached the peak."""

    plateau: int
    peak: int
    transient: int
    at_peak: dict
    peak_op: str


def forward_backward_memory(module: torch.nn.Module, *inputs, grad_output: torch.Tensor,
                            **kwargs) -> ActivationMemory:
    """Run ``module(*inputs, **kwargs)`` then ``backward(grad_output)`` under :class:`LiveMemory`.

    ``inputs`` (tensors that require grad) and ``grad_output`` (the gradient arriving from the layer above)
    are the caller's, created before: they do not count; the gradients born inside (the inputs' too) do,
    the parameters' excepted. The plateau is what is live at the end of the forward, the output included
    and the input not: in a stack of blocks each block's output is the next one's input, which that one
    keeps for its first LayerNorm, so charging each block with the tensors it creates counts every
    activation once -- and a block's plateau equals what ``saved_bytes`` counts for it (the input it
    saves, the same size as the output it does not).
    """
    with LiveMemory(params=module.parameters()) as mem:
        output = module(*inputs, **kwargs)
        mem.mark("forward")
        output.backward(grad_output)
    return ActivationMemory(mem.marks["forward"], mem.peak, mem.born_after("forward"), mem.at_peak, mem.peak_op)


@contextlib.contextmanager
def as_rank(rank: int, world_size: int):
    """Run the body as rank ``rank`` of ``world_size`` with a fake process group (module docstring).

    Collectives and point-to-point calls complete at once and move nothing: use it to count memory, never
    to compute. Refuses when this process already has a process group (a :func:`coursekit.launch` rank).

        >>> with as_rank(1, 4):
        ...     torch.distributed.get_rank(), torch.distributed.get_world_size()
        (1, 4)
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise RuntimeError("as_rank needs a process without a process group (not inside a coursekit.launch rank).")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
