"""How a rank joins the process group of its launch: a ``TCPStore`` served by rank 0, then ``init_process_group``.

The parent opens the store's socket before it starts any rank
(:func:`open_rendezvous`): bound to a port the kernel picks, so launches never
collide and no port has to be chosen, and already listening, so a rank that
connects before rank 0 serves just waits in the socket's queue. Rank 0 serves
the store from that socket (``master_listen_fd``); the other ranks connect to
it. The server's thread runs in rank 0, never in the parent, so no rank is ever
forked while it holds a lock (why that matters: :mod:`coursekit.launch`).

Why not a ``FileStore``: its ``wait`` looks at the file every 10 ms, and gloo's
rendezvous waits for every rank's address, so each launch paid up to 10 ms
after its last rank had started (measured on the course's 2-core machine: 17
such sleeps in one 4-rank launch of a no-op, and 15 ms in the last rank's
``init_process_group``, 4 ms of it working). A ``TCPStore`` answers the moment
the key is set.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

from ..comm.waiting import waiting_on
from ..comm.gloo_threads import batch_gloo_loop_threads

HOST = "127.0.0.1"  # every rank of a launch runs on this machine


def open_rendezvous(world_size: int) -> socket.socket:
    """In the parent, before the first rank starts: the listening socket rank 0 will serve the store from."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.bind((HOST, 0))  # port 0: the kernel picks a free one
        server.listen(world_size + 8)
    except BaseException:
        server.close()
        raise
    return server


GRACE_S = 2.0  # how much later than the launch gloo itself gives up (seconds)


def check_environment(env) -> dict[str, str]:
    """``launch(..., env=...)``: a dict of names to strings (None: nothing to add), checked before any rank starts."""
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"env must map variable names to strings, e.g. env={{'TORCH_DISTRIBUTED_DEBUG': 'DETAIL'}} "
                         f"(got {env!r}).")
    return dict(env)


def set_environment(env: dict[str, str]) -> None:
    """In a rank, before ``init_process_group``: add ``env`` to this rank's environment variables.

    Setting a variable in the notebook is not enough for some of torch's: it reads
    ``TORCH_DISTRIBUTED_DEBUG`` once, when ``torch.distributed`` is imported, and a
    forked rank inherits the value read then (in the kernel, long ago). So after
    setting the variables the rank asks torch to read the debug level again; the
    process group created next is then wrapped for ``DETAIL``'s collective checks.
    """
    if not env:
        return
    os.environ.update(env)
    import torch.distributed as dist

    dist.set_debug_level_from_env()


def all_joined(store, world_size: int, timeout: timedelta) -> None:
    """Wait until every rank has finished ``init_process_group``: a barrier on the store, not on the group.

    gloo connects every pair of ranks while the group is made, and a rank whose own connections are done may
    return before its peers' are. If it then died at once (a learner's length mismatch that gloo aborts), a
    peer still connecting printed "Gloo connectFullMesh failed ... Connection closed by peer" from C++, and
    said nothing useful. After this barrier no rank runs anything before every rank is connected. The store,
    not ``dist.barrier()``: it needs no device (torch's own ``TORCH_DIST_INIT_BARRIER`` does the same).
    """
    if store.add("coursekit/joined", 1) == world_size:
        store.set("coursekit/all-joined", "1")
    store.wait(["coursekit/all-joined"], timeout)


def join_process_group(rank: int, world_size: int, backend: str, rendezvous: socket.socket, timeout: float) -> None:
    """Initialise ``torch.distributed`` in this rank; with NCCL, this rank owns ``cuda:rank``.

    ``rendezvous`` is this rank's copy of the parent's listening socket: rank 0 serves the
    store from it, every other rank closes it and connects to its port.
    """
    import torch
    import torch.distributed as dist

    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's peers are all on this machine
    device_id = None
    if "nccl" in backend:  # "nccl" or "cpu:gloo,cuda:nccl": one GPU per rank
        torch.cuda.set_device(rank)
        device_id = torch.device("cuda", rank)
    # gloo's own timeout a little after the launch's: the launcher's timeout is the one that names the stuck
    # rank and what it waits on, so it must come first. (Equal, they raced: a rank posts its recv before the
    # parent starts counting, and gloo's bare "Timed out waiting 3000ms" won on a busy machine.)
    port, wait = rendezvous.getsockname()[1], timedelta(seconds=timeout + GRACE_S)
    with waiting_on("init_process_group (waiting for the other ranks to start)"):
        if rank == 0:  # the store takes the socket over: detached, or Python would close it under the server
            store = dist.TCPStore(HOST, port, world_size, is_master=True, timeout=wait, wait_for_workers=False,
                                  master_listen_fd=rendezvous.detach())
        else:
            rendezvous.close()
            store = dist.TCPStore(HOST, port, world_size, is_master=False, timeout=wait, wait_for_workers=False)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=wait, device_id=device_id)
        all_joined(store, world_size, wait)
    batch_gloo_loop_threads()  # see coursekit.comm.gloo_threads: gloo about twice as fast on a busy CPU
