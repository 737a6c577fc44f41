"""Every gloo event-loop thread of a rank runs under SCHED_BATCH (coursekit.comm.gloo_threads).

Planted bugs, each seen failing here: the call after ``init_process_group`` removed
(test 1: "gloo_tcp_loop ... policy 0"), the call at the end of ``Mesh.__init__`` removed
(test 2: the mesh's two new loop threads under policy 0), every thread batched instead of
only gloo's loop threads (test 1: the rank's own thread under policy 3).
"""

import os
import sys

import pytest

import coursekit
from coursekit.comm.gloo_threads import LOOP_THREAD, batch_gloo_loop_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread scheduling is Linux's")


def _threads() -> list[tuple[str, int]]:
    """(name, scheduling policy) of every thread of this process."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            out.append((f.read().strip(), os.sched_getscheduler(int(tid))))
    return sorted(out)


def _policies_after_init(rank, world_size):
    return _threads()


def _policies_after_mesh(rank, world_size):
    coursekit.Mesh({"dp": 2, "tp": 2})
    return _threads()


def _loops(threads):
    return [policy for name, policy in threads if name.startswith(LOOP_THREAD)]


def test_a_launched_rank_batches_gloos_loop_thread_and_nothing_else():
    for threads in coursekit.launch(_policies_after_init, 2):
        assert _loops(threads) == [os.SCHED_BATCH], f"gloo's loop thread should be SCHED_BATCH ({os.SCHED_BATCH}): {threads}"
        others = [(name, policy) for name, policy in threads if not name.startswith(LOOP_THREAD)]
        assert others and all(policy == os.SCHED_OTHER for _, policy in others), \
            f"only gloo's loop threads change policy; the rank's own threads stay SCHED_OTHER: {others}"


def test_a_mesh_batches_the_loop_threads_of_the_groups_it_creates():
    for rank, threads in enumerate(coursekit.launch(_policies_after_mesh, 4)):
        loops = _loops(threads)
        assert len(loops) == 3, f"rank {rank}: the world's loop thread and one per axis group it is in: {threads}"
        assert loops == [os.SCHED_BATCH] * 3, f"rank {rank}: every loop thread SCHED_BATCH: {threads}"


def test_the_call_is_idempotent_and_harmless_without_gloo():
    assert batch_gloo_loop_threads() == 0  # this pytest process has no gloo threads
    assert all(policy == os.SCHED_OTHER for _, policy in _threads())
