"""No rank outlives its parent: a launching process that is SIGKILLed takes its ranks with it.

The parent is a subprocess that starts ranks (a launch, a Cluster; forked or
spawned) which write their pid to a file and then block. Once every file is
there the test SIGKILLs the parent, so no teardown of ours can run: only the
kernel's parent-death signal can end the ranks. The promise is
``DIES_WITH_PARENT_WITHIN_S`` (coursekit/launch/rank_signals.py); the test
allows ten times that.
"""

import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from coursekit import Cluster
from coursekit.launch.rank_signals import DIES_WITH_PARENT_WITHIN_S
from launch_support import wait_for_files

ORPHAN_BOUND_S = 10 * DIES_WITH_PARENT_WITHIN_S
STARTUP_S = 120.0  # liveness only: the ranks writing their files (spawn re-imports torch in each, ~1-2 s here)

PARENT = """
import os, sys, time, coursekit

ready_dir, how, start_method = sys.argv[1:4]


def write_pid_then_block(rank, world_size):
    path = os.path.join(ready_dir, f"rank-{rank}")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(path + ".tmp", path)  # whole, or not there
    time.sleep(3600)  # busy, as far as the parent knows: only a signal ends it


if how == "launch":
    coursekit.launch(write_pid_then_block, 2, start_method=start_method, timeout=3600)
else:
    coursekit.Cluster(2, start_method=start_method, timeout=3600).run(write_pid_then_block, timeout=3600)
"""




def running(procs):
    """Those still running (a zombie has ended: it only waits for whoever adopted it to reap it)."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


def kill_parent_and_watch(parent, paths):
    """SIGKILL ``parent`` once every rank wrote its pid; describe the ranks still running ORPHAN_BOUND_S later."""
    try:
        if not wait_for_files(paths, STARTUP_S):
            parent.kill()
            pytest.fail(f"the ranks never wrote their pids; the parent said:\n{parent.communicate()[1][-3000:]}")
        ranks = [psutil.Process(int(open(p).read())) for p in paths]
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + ORPHAN_BOUND_S
        while running(ranks) and time.monotonic() < deadline:
            time.sleep(0.01)
        survivors = [f"pid {proc.pid} ({proc.status()})" for proc in running(ranks)]
        for proc in running(ranks):  # a failing test cleans up after itself
            proc.kill()
        return survivors
    finally:
        parent.kill()


@pytest.mark.parametrize("how, start_method", [("launch", "fork"), ("cluster", "fork"), ("launch", "spawn")])
def test_no_rank_outlives_a_killed_parent(tmp_path, how, start_method):
    """Planted bug: no prctl(PR_SET_PDEATHSIG) in rank_signals.die_with_parent: every rank, forked or
    spawned, ran on ("ranks outlived their parent by more than 10 s")."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), how, start_method],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    survivors = kill_parent_and_watch(parent, [tmp_path / f"rank-{r}" for r in range(2)])
    assert not survivors, f"ranks outlived their parent by more than {ORPHAN_BOUND_S:g} s: {survivors}"


RACE = """
import os, sys, time, coursekit
from coursekit.launch import rank as rank_module

pid_file = sys.argv[1]
real_die_with_parent = rank_module.die_with_parent


def once_the_parent_is_gone(parent_pid):  # in the forked rank, before it asks the kernel
    with open(pid_file + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    while os.getppid() == parent_pid:  # the test kills the parent now; the kernel hands this rank to another
        time.sleep(0.01)
    real_die_with_parent(parent_pid)


rank_module.die_with_parent = once_the_parent_is_gone
coursekit.launch(lambda rank, world_size: time.sleep(3600), 1, timeout=3600)
"""


def test_a_rank_whose_parent_died_before_prctl_exits(tmp_path):
    """The race: the parent dies between fork() and the rank's prctl, so no death signal ever comes.
    Planted bug: no os.getppid() check after prctl in rank_signals.die_with_parent: the rank ran on
    ("a rank adopted before its prctl ran on for more than 10 s")."""
    parent = subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / "rank-0")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    survivors = kill_parent_and_watch(parent, [tmp_path / "rank-0"])
    assert not survivors, f"a rank adopted before its prctl ran on for more than {ORPHAN_BOUND_S:g} s: {survivors}"


def test_a_cluster_started_in_a_thread_that_ends_keeps_its_ranks():
    """PR_SET_PDEATHSIG fires when the *thread* that forked a rank exits, though the process lives on.
    Planted bug (the code before this test): ranks forked by the caller's thread, so killed as it ended:
    the next run raised BrokenPipeError (with starter.in_starter running the job in the caller's thread:
    "RankError: rank 0 ... exited (exit code -9)")."""
    box = {}

    def start_a_cluster():
        box["tid"] = threading.get_native_id()
        box["cluster"] = Cluster(2)

    thread = threading.Thread(target=start_a_cluster)
    thread.start()
    thread.join()
    deadline = time.monotonic() + STARTUP_S
    while os.path.exists(f"/proc/self/task/{box['tid']}") and time.monotonic() < deadline:
        time.sleep(0.01)  # join() returns before the kernel is done with the thread; the signal comes then
    with box["cluster"] as cluster:
        assert cluster.run(lambda rank, world_size: rank, timeout=STARTUP_S) == [0, 1]
