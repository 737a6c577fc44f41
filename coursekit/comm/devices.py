"""Where a rank's tensors live, and which backend carries them: one device-aware default for the course.

gloo moves CPU tensors; NCCL moves CUDA tensors, and only those. A job that picked NCCL alone because it found
GPUs would fail on the first CPU tensor a chapter sends (chapter 00's examples are CPU tensors). So the course's
default on a machine with one GPU per rank is one process group with *both*: the backend string
``"cpu:gloo,cuda:nccl"`` (``torch.distributed.init_process_group``'s "<device_type>:<backend>,..." form),
which sends each collective to the backend of its tensors' device. Without enough GPUs it is plain ``"gloo"``.

:func:`device` is where this rank should put its tensors: its own GPU when the process group has NCCL
(``cuda:LOCAL_RANK``, the GPU torchrun's local rank names, or the global rank's, modulo the GPUs), else the
CPU. The training loop puts the model and every batch there; a chapter that makes tensors of its own calls it.

    >>> default_backend(world_size=4, gpus=0), default_backend(world_size=4, gpus=8)
    ('gloo', 'cpu:gloo,cuda:nccl')
    >>> device_for("cpu:gloo,cuda:nccl", local_rank=3, gpus=8), device_for("gloo", local_rank=3, gpus=8)
    (device(type='cuda', index=3), device(type='cpu'))

(The module is ``devices`` and the function ``device``: a module named like the function it holds would be
shadowed by it in the package's namespace.)
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = ["MIXED", "gpu_count", "default_backend", "uses_nccl", "device_for", "device"]

MIXED = "cpu:gloo,cuda:nccl"  # CPU tensors over gloo, CUDA tensors over NCCL, in one process group


def gpu_count() -> int:
    """The GPUs this process can see (0 on a CPU build of PyTorch)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_backend(world_size: int, gpus: int | None = None) -> str:
    """:data:`MIXED` when there is a GPU for each of ``world_size`` ranks on this machine, else ``"gloo"``."""
    gpus = gpu_count() if gpus is None else gpus
    return MIXED if gpus >= world_size else "gloo"


def uses_nccl(backend: str) -> bool:
    """Whether a backend string (``"nccl"``, :data:`MIXED`, ``"gloo"`` ...) carries CUDA tensors over NCCL."""
    return "nccl" in str(backend)


def device_for(backend: str, local_rank: int, gpus: int) -> torch.device:
    """The device of the rank ``local_rank`` on its machine: its GPU when ``backend`` has NCCL and there are GPUs."""
    if uses_nccl(backend) and gpus > 0:
        return torch.device("cuda", local_rank % gpus)
    return torch.device("cpu")


def device() -> torch.device:
    """This rank's device: ``cuda:<local rank>`` under a process group with NCCL, else the CPU (also outside ranks)."""
    if not dist.is_initialized():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return device_for(dist.get_backend(), local_rank, gpu_count())
