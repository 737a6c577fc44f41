"""What each rank runs, from its first instruction to ``os._exit``: fork and spawn alike.

:class:`RankSpec` is everything a rank needs to know, in one picklable object;
:func:`rank_main` joins the process group, then either runs the one function of
a :func:`~coursekit.launch` or serves a :class:`~coursekit.Cluster` until told to stop.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Any

import cloudpickle

from ..comm.waiting import set_waiting
from .group import join_process_group, set_environment
from .rank_pipe import Channel, connect_to_parent
from .rank_signals import die_with_parent, ignore_ctrl_c


@dataclass(frozen=True)
class RankSpec:
    """One rank's orders. ``payload`` is ``(fn, args, kwargs)`` (cloudpickled for spawn), or None for a Cluster."""

    rank: int
    world_size: int
    backend: str         # "gloo" or "nccl", already resolved
    rendezvous: Any      # the listening socket rank 0 serves the launch's store from (see .group)
    conn: Any            # this rank's end of its pipe to the parent
    status: Any          # shared bytes for the "waiting on" note (coursekit.comm.waiting)
    stack: Any           # the pipe faulthandler writes this rank's stack to when the parent asks
    threads: int         # for torch.set_num_threads: 1 after fork (see coursekit.launch)
    payload: Any
    init_timeout: float  # seconds init_process_group waits for the other ranks
    parent_pid: int      # the launching process: if it is gone already, the rank exits at once
    env: dict            # extra environment variables, set before the process group exists (launch's env=)


def rank_main(spec: RankSpec) -> None:
    """Entry point of every rank. Never returns: ends with ``os._exit``."""
    ignore_ctrl_c()  # first: the notebook's stop button is the parent's to handle (see .rank_signals)
    die_with_parent(spec.parent_pid)
    channel = connect_to_parent(spec.conn, spec.status, spec.stack)
    import torch

    torch.set_num_threads(spec.threads)  # before any matmul can touch a forked thread pool
    try:
        set_environment(spec.env)
        join_process_group(spec.rank, spec.world_size, spec.backend, spec.rendezvous, spec.init_timeout)
        if spec.payload is None:
            channel.send("ready", None, None)  # a Cluster waits for this; a launch waits for the result
            _serve(spec, channel)
        else:
            channel.send(*_run_user(spec, spec.payload))
            channel.recv()  # stay alive until every rank is done, so no peer's recv sees a reset
    except BaseException:
        try:
            channel.send("error", None, traceback.format_exc())
            channel.recv()
        except BaseException:
            pass
    finally:
        # No destroy_process_group(): every peer is finished or being killed, and
        # os._exit skips inherited finalisers that belong to the parent (fork).
        os._exit(0)


def _serve(spec: RankSpec, channel: Channel) -> None:
    """A Cluster rank: run each function the parent sends, until it sends None."""
    while (message := channel.recv()) is not None:
        set_waiting("")
        channel.send(*_run_user(spec, message))


def _run_user(spec: RankSpec, payload: Any) -> tuple[str, None, Any]:
    """Run the learner's function; return the message for the parent: the pickled result, or the traceback."""
    try:
        fn, args, kwargs = cloudpickle.loads(payload) if isinstance(payload, bytes) else payload
        return "result", None, cloudpickle.dumps(fn(spec.rank, spec.world_size, *args, **kwargs))
    except BaseException:
        return "error", None, traceback.format_exc()
