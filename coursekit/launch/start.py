"""Starting the ranks of one launch: pick fork or spawn, give each rank its pipes and a note buffer, start them.

The result is a :class:`~.gang.Gang`. The ranks are started by the starter
thread (:mod:`.starter`), and a Ctrl-C meanwhile waits until every rank started
is in the gang. If starting fails half way, or is interrupted, the ranks
already started are stopped before the error goes on.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import warnings
from typing import Any

import cloudpickle

from ..comm.waiting import STATUS_BYTES
from .gang import Gang
from .group import open_rendezvous
from .rank import RankSpec, rank_main
from .rank_signals import block_ctrl_c
from .starter import in_starter
from .teardown import close


def choose_start_method(backend: str, start_method: str | None) -> str:
    """Fork for gloo (fast, and cells' functions just work), spawn for NCCL (CUDA cannot be forked)."""
    available = mp.get_all_start_methods()
    if start_method is None:
        start_method = "fork" if (backend == "gloo" and "fork" in available) else "spawn"
    if start_method not in available:
        raise ValueError(f"start_method {start_method!r} is not available here; use one of {available}.")
    return start_method


def _default_threads(start_method: str, world_size: int) -> int:
    if start_method == "fork":
        return 1  # see coursekit.launch: forked BLAS pools hang with more than one thread
    return max(1, (os.cpu_count() or 1) // world_size)


def start_gang(world_size: int, backend: str, start_method: str | None, payload: Any,
               init_timeout: float, env: dict[str, str] | None = None) -> Gang:
    """Start ``world_size`` ranks running ``payload`` (None: serve a Cluster); if that fails, stop them all.

    ``env``: environment variables each rank sets before it joins the process group.
    """
    gang = Gang(world_size, backend, choose_start_method(backend, start_method))
    try:
        in_starter(_start_ranks, gang, payload, init_timeout, env or {})
    except BaseException:
        close(gang, graceful=False)
        raise
    return gang


def _start_ranks(gang: Gang, payload: Any, init_timeout: float, env: dict[str, str]) -> None:
    """Runs in the starter thread, the only one that forks: two launches never change the warning filters at once."""
    context = mp.get_context(gang.start_method)  # explicit: the platform default changes between versions
    if gang.start_method != "fork" and payload is not None and not isinstance(payload, bytes):
        payload = cloudpickle.dumps(payload)  # spawn pickles by reference; cloudpickle sends cells by value
    threads = _default_threads(gang.start_method, gang.world_size)
    rendezvous = open_rendezvous(gang.world_size)  # rank 0 serves the store from it (see .group)
    # Made before the first fork: after it, every page the parent writes is copied (copy-on-write), and the
    # shared-memory allocator's Python between two forks cost the parent about 45 page faults a rank.
    notes = [context.RawArray("c", STATUS_BYTES) for _ in range(gang.world_size)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork of a threaded process
            for rank in range(gang.world_size):
                parent_conn, child_conn = context.Pipe(duplex=True)
                stack_reader, stack_writer = context.Pipe(duplex=False)  # raw bytes from faulthandler, not messages
                status = notes[rank]
                spec = RankSpec(rank, gang.world_size, gang.backend, rendezvous, child_conn, status, stack_writer,
                                threads, payload, init_timeout, os.getpid(), env)
                proc = context.Process(target=rank_main, args=(spec,), name=f"coursekit-rank-{rank}", daemon=True)
                block_ctrl_c(gang.start_method)  # every rank starts with SIGINT blocked (see .rank_signals)
                proc.start()
                child_conn.close()
                stack_writer.close()
                gang.conns.append(parent_conn)
                gang.procs.append(proc)
                gang.status.append(status)
                gang.stacks.append(stack_reader)
    finally:
        rendezvous.close()  # every rank has its copy now; a later launch's ranks must not inherit it
