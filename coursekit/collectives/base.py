"""What every collective built from point-to-point shares: a flat view, reusable buffers, the length check.

Gloo aborts the whole process when a message does not fit its receive buffer,
so before any payload moves the collectives tell their peers their
``(length, dtype)`` (:class:`LengthCheck`) and raise a clear error on a
mismatch. The naive and master all-reduces (:mod:`coursekit.collectives`) and
the ring (:mod:`coursekit.collectives.ring`) all use these helpers.
"""

from __future__ import annotations

import threading

import torch

from .. import comm

__all__ = ["flat_view", "start_all_reduce", "finish_all_reduce", "scratch_buffer", "LengthCheck"]

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_CODES = {dtype: code for code, dtype in enumerate(_DTYPES)}



def flat_view(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {type(tensor).__name__}.")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} works in place on the tensor's memory, which must be contiguous; "
                         f"this one is a strided view (shape {tuple(tensor.shape)}, stride {tensor.stride()}). "
                         f"Pass tensor.contiguous() and copy the result back.")
    return tensor.view(-1)


def start_all_reduce(tensor: torch.Tensor, name: str, group) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """What every all-reduce does first: a contiguous working copy (the tensor itself when it already is),
    its flat view, the group's size and this rank within it."""
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    return work, flat_view(work, name), comm.get_world_size(group), comm.get_rank(group)


def finish_all_reduce(tensor: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """What every all-reduce does last: in place, like ``dist.all_reduce``, and return the tensor."""
    if work is not tensor:
        tensor.copy_(work)
    return tensor


_scratch = threading.local()  # per thread: the simulator runs each rank as a thread


def scratch_buffer(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A receive buffer of ``numel`` elements, reused across calls (fresh large allocations page-fault)."""
    key = (like.dtype, like.device)
    cache = getattr(_scratch, "buffers", None)
    if cache is None:
        cache = _scratch.buffers = {}
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel]


def _signature_tensor(numel: int, code: int, device: torch.device) -> torch.Tensor:
    """``tensor([numel, code])``, made once per signature and reused (only ever read: it is what we send).

    On the payload's device: NCCL moves only GPU tensors.
    """
    cache = getattr(_scratch, "signatures", None)
    if cache is None or len(cache) > 256:  # a run uses a handful of lengths; never let it grow unbounded
        cache = _scratch.signatures = {}
    tensor = cache.get((numel, code, device))
    if tensor is None:
        tensor = cache[(numel, code, device)] = torch.tensor([numel, code], dtype=torch.int64, device=device)
    return tensor


def _describe(signature: list[int]) -> str:
    numel, code = signature
    return f"{numel} elements of {_DTYPES[code] if 0 <= code < len(_DTYPES) else 'another dtype'}"


class LengthCheck:
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
        self.signature = [flat.numel(), _CODES.get(flat.dtype, -1)]
        self.mine = _signature_tensor(*self.signature, flat.device)
        self.name, self.group, self.recv_from = name, group, recv_from
        self.theirs = [torch.empty(2, dtype=torch.int64, device=flat.device) for _ in recv_from]
        with comm.control(), comm.phase("check lengths"):
            self.receives = [comm.irecv(buf, group=group, group_src=peer) for buf, peer in zip(self.theirs, recv_from)]
            self.sends = [comm.isend(self.mine, group=group, group_dst=peer) for peer in send_to]

    def finish(self) -> None:
        """Wait for our own control sends (they completed long ago; this just keeps it tidy)."""
        for work in self.sends:
            work.wait()

    def verify(self) -> None:
        """Wait for the peers' ``(numel, dtype)`` and raise if any differs from ours."""
        for work in self.receives:
            work.wait()
        for peer, other in zip(self.recv_from, self.theirs):
            if other.tolist() != self.signature:
                raise ValueError(f"{self.name}: rank {comm.get_rank(self.group)} has {_describe(self.mine.tolist())} "
                                 f"but rank {peer} has {_describe(other.tolist())}. Every rank must pass a tensor "
                                 f"of the same length and dtype (did one rank build its gradients differently?).")
