"""What the parent keeps of one launch (or one Cluster): its processes and its ends of their pipes.

:mod:`.start` fills a :class:`Gang`, :mod:`.inbox` and :mod:`.diagnose` read it,
and :func:`.teardown.close` stops its processes and empties it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Gang:
    """The ranks of one launch; every list is indexed by rank."""

    world_size: int
    backend: str        # "gloo" or "nccl"
    start_method: str   # "fork" or "spawn"
    procs: list = field(default_factory=list)        # multiprocessing.Process
    conns: list = field(default_factory=list)        # the parent's end of each rank's pipe
    status: list = field(default_factory=list)       # each rank's "waiting on" note (shared bytes)
    stacks: list = field(default_factory=list)       # the read end of the pipe each rank's faulthandler writes to
