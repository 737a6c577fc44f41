"""What a launch raises when it cannot return results: a rank failed, time ran out, or the Cluster is gone.

They are defined here so that every part of the launcher can raise them, and
re-exported by :mod:`coursekit.launch`, which is where learners meet them.
"""

from __future__ import annotations


class RankError(RuntimeError):
    """A rank raised (or died). ``.rank`` says which; the message holds its traceback.

    ``.output`` holds the last lines that rank printed (stdout and stderr, in
    the order they arrived), since they often say what led to the error.
    """

    __module__ = "coursekit.launch"  # tracebacks name it where learners import it from

    def __init__(self, rank: int, remote_traceback: str, output: str = ""):
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.output = output
        message = f"rank {rank} failed.\n\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(message)


class LaunchTimeout(TimeoutError):
    """Some ranks were still running at the deadline.

    ``.ranks`` lists them; ``.waiting`` maps each to what it was doing (the
    communication layer's note, and the innermost Python frames); ``.finished``
    lists the ranks that had returned (a peer a stuck rank waits on may be one);
    ``.output`` maps every rank to the last lines it printed.
    """

    __module__ = "coursekit.launch"

    def __init__(self, timeout: float, waiting: dict[int, str], output: dict[int, str] | None = None,
                 finished: list[int] | None = None):
        self.timeout = timeout
        self.ranks = sorted(waiting)
        self.waiting = waiting
        self.finished = sorted(finished or [])
        self.output = output or {}
        lines = [f"ranks {self.ranks} still running after {timeout:g} s "
                 f"(a recv with no matching send, or a collective not every rank called?)"]
        for rank in self.ranks:
            lines.append(f"  rank {rank}: {waiting[rank]}")
        if self.finished:
            lines.append(f"  ranks {self.finished} had returned their results")
        lines.append("All ranks were stopped. Fix the mismatch, or pass a larger timeout= if the work is just slow.")
        super().__init__("\n".join(lines))


class ClusterClosed(RuntimeError):
    """Raised by ``Cluster.run`` after the cluster was torn down."""

    __module__ = "coursekit.launch"
