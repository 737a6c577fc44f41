"""How a rank joins the process group of its launch: one ``FileStore`` per launch, then ``init_process_group``.

The store file lives in the launch's own temporary folder, so launches never
collide and no port has to be picked (why not ``TCPStore``: see :mod:`coursekit.launch`).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

from ..waiting import waiting_on
from .gloo_threads import batch_gloo_loop_threads


def join_process_group(rank: int, world_size: int, backend: str, store_path: str, timeout: float) -> None:
    """Initialise ``torch.distributed`` in this rank; with NCCL, this rank owns ``cuda:rank``."""
    import torch
    import torch.distributed as dist

    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's peers are all on this machine
    store = dist.FileStore(store_path, world_size)
    device_id = None
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device_id = torch.device("cuda", rank)
    with waiting_on("init_process_group (waiting for the other ranks to start)"):
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout), device_id=device_id)
    batch_gloo_loop_threads()  # see .gloo_threads: gloo about twice as fast on a busy CPU
