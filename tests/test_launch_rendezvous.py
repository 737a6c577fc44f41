"""Where a launch's ranks meet: a TCPStore that rank 0 serves, never the parent (coursekit.launch.group).

Planted bug, seen failing here: the store's server created in the parent, on the socket it opened, with
every rank a client (as a launcher agent would): "the parent gained threads while a Cluster ran: 1".
"""

import os
import sys

import pytest

from coursekit import Cluster, launch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def test_no_store_thread_runs_in_the_parent():
    """A rank forked while a store server's thread in the parent held a lock hung in its own store client."""
    launch(lambda rank, world_size: rank, 2)  # the starter thread exists from now on
    before = _threads()
    with Cluster(2) as cluster:
        assert cluster.run(lambda rank, world_size: rank) == [0, 1]
        gained = _threads() - before
    assert not gained, f"the parent gained threads while a Cluster ran: {len(gained)}"
