"""The launcher: results, errors, timeouts, cleanup, concurrency, Cluster."""

import contextlib
import importlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist

from coursekit import Cluster, ClusterClosed, LaunchTimeout, RankError, launch
from coursekit.launch.diagnose import STACK_DUMP_S
from coursekit.launch.inbox import POLL_S
from coursekit.launch.teardown import TEARDOWN_MAX_S
from launch_support import child_processes

# Time bounds come from the launcher's own constants, never from this machine's speed: they are liveness
# bounds, far above what a healthy run takes. After an error, a timeout or Ctrl-C, the parent notices
# within one poll of its collect loop, then tears down.
STOPPED_WITHIN_S = POLL_S + TEARDOWN_MAX_S


def assert_no_children():
    deadline = time.monotonic() + TEARDOWN_MAX_S  # launch() has reaped its ranks; this is room to spare
    while child_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child_processes() == [], f"left behind: {child_processes()}"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def all_reduce_rank_plus_one(rank, world_size, scale=1.0):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    assert dist.get_rank() == rank and dist.get_world_size() == world_size
    return t.item() * scale


def test_results_in_rank_order_with_args_and_kwargs():
    assert launch(all_reduce_rank_plus_one, 3, scale=2.0) == [12.0, 12.0, 12.0]
    assert launch(lambda rank, world_size, a, b=0: (rank, world_size, a, b), 2, "x", b=5) == [
        (0, 2, "x", 5), (1, 2, "x", 5)]


def test_closure_and_world_size_one():
    offset = 7

    def closure(rank, world_size):
        return rank + offset

    assert launch(closure, 1) == [7]


def test_each_rank_uses_one_intra_op_thread():
    assert launch(lambda rank, world_size: torch.get_num_threads(), 2) == [1, 1]


def test_rank_error_names_rank_and_carries_remote_traceback():
    def fails_on_rank_one(rank, world_size):
        if rank == 1:
            raise ValueError(f"boom from rank one at {time.monotonic()!r}")  # one clock for every process
        t = torch.zeros(1)
        dist.recv(t, src=1)  # would wait forever: the launcher must stop it

    with pytest.raises(RankError) as info:
        launch(fails_on_rank_one, 3, timeout=60)
    raised_at = float(str(info.value).rsplit("boom from rank one at ", 1)[1].split()[0])  # not the source line
    assert time.monotonic() - raised_at < STOPPED_WITHIN_S, "the other ranks were not stopped promptly"
    assert info.value.rank == 1
    assert "boom from rank one" in str(info.value) and "ValueError" in str(info.value)
    assert "fails_on_rank_one" in str(info.value)
    assert_no_children()


def test_rank_dying_without_python_exception_is_reported():
    def dies(rank, world_size):
        if rank == 0:
            os._exit(3)
        time.sleep(30)

    with pytest.raises(RankError) as info:
        launch(dies, 2, timeout=60)
    assert info.value.rank == 0 and "code 3" in str(info.value)
    assert_no_children()


def test_deadlock_times_out_names_ranks_and_leaves_no_orphans():
    def mismatched(rank, world_size):
        t = torch.zeros(4)
        if rank == 1:
            from coursekit.comm.waiting import waiting_on

            with waiting_on("recv from rank 0"):
                dist.recv(t, src=0)  # rank 0 never sends
        return rank

    timeout = 3
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(mismatched, 2, timeout=timeout)
    elapsed = time.monotonic() - start
    assert timeout <= elapsed < timeout + STACK_DUMP_S + STOPPED_WITHIN_S
    assert info.value.ranks == [1]
    assert "recv from rank 0" in str(info.value)
    assert "mismatched" in str(info.value), "the stack of the stuck rank should be shown"
    assert_no_children()
    assert launch(all_reduce_rank_plus_one, 2) == [3.0, 3.0], "the caller must stay usable"


def test_a_timeout_shows_the_stuck_ranks_other_threads():
    """A rank whose main thread waits on a thread of its own (as a training step waits on FSDP's comm thread):
    the main thread alone says "busy ... at main_waits"; the report also shows where the other thread is. (A
    fresh clone's CI once stopped a rank "busy at forward (linear.py)" with nothing more to go on.) Planted bug,
    seen failing: faulthandler registered for the current thread only (no "its other threads at")."""
    def main_waits(rank, world_size):
        import threading

        done = threading.Event()

        def helper_that_never_finishes():
            while True:
                time.sleep(0.05)

        threading.Thread(target=helper_that_never_finishes, daemon=True).start()
        done.wait()

    with pytest.raises(LaunchTimeout) as info:
        launch(main_waits, 1, timeout=2)
    message = str(info.value)
    assert "busy (not inside a communication call); at wait (threading.py" in message and "main_waits" in message
    assert "its other threads at helper_that_never_finishes (test_launch.py:" in message, message
    assert_no_children()


def test_printed_output_is_prefixed_and_in_rank_order(capsys):
    def chatty(rank, world_size):
        time.sleep(0.05 * (world_size - rank))  # later ranks finish first
        print(f"hello from {rank}")
        print("second line")
        return None

    launch(chatty, 3, output="ordered")  # the default, "live", prints in arrival order
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[rank {r}] {text}" for r in range(3) for text in (f"hello from {r}", "second line")]


def test_function_defined_in_main_like_a_notebook_cell(tmp_path):
    script = textwrap.dedent("""
        import torch, torch.distributed as dist, coursekit
        def cell_function(rank, world_size):
            t = torch.ones(1) * rank
            dist.all_reduce(t)
            return t.item()
        assert cell_function.__module__ == "__main__"
        print(coursekit.launch(cell_function, 2, timeout=60),
              coursekit.launch(cell_function, 2, start_method="spawn", timeout=60))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=2 * (60 + STOPPED_WITHIN_S))  # two launches, each ended by its timeout
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[1.0, 1.0] [1.0, 1.0]"


def test_two_launches_at_the_same_time_from_two_threads():
    results, errors = {}, []

    def run(name, world_size):
        try:
            results[name] = launch(all_reduce_rank_plus_one, world_size, timeout=60)
        except Exception as error:  # collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(name, ws)) for name, ws in (("a", 2), ("b", 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60 + STOPPED_WITHIN_S)  # the launches' own timeout, then their teardown
    assert not errors, errors
    assert results == {"a": [3.0, 3.0], "b": [6.0, 6.0, 6.0]}
    assert_no_children()


def test_fifty_sequential_launches_leak_no_processes_or_fds():
    launch(all_reduce_rank_plus_one, 2)
    fds = open_fds()
    for _ in range(50):
        assert launch(all_reduce_rank_plus_one, 2) == [3.0, 3.0]
    assert_no_children()
    assert open_fds() == fds


@pytest.mark.usefixtures("ctrl_c_as_in_a_terminal")  # raises even when pytest runs with SIGINT ignored
def test_keyboard_interrupt_stops_every_rank(tmp_path):
    """Ctrl-C once both ranks run (they say so with a file each); tests/test_launch_interrupt.py has one
    test per stage. Planted bug: collect() caught KeyboardInterrupt around its wait and had no checkpoint
    (coursekit.launch.interrupts.check): the interrupt surfaced only at the launch's timeout."""
    ready = [tmp_path / f"rank-{rank}" for rank in (0, 1)]
    sent = []

    def sigint_once_both_run():
        if all(wait_for_file(path) for path in ready):
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    def says_it_runs_then_sleeps(rank, world_size):
        (tmp_path / f"rank-{rank}").touch()
        time.sleep(600)

    threading.Thread(target=sigint_once_both_run, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        launch(says_it_runs_then_sleeps, 2, timeout=120)
    assert sent and time.monotonic() - sent[0] < STOPPED_WITHIN_S
    assert_no_children()


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(world_size=0), "world_size must be a positive integer"),
    (dict(world_size=2.5), "world_size must be a positive integer"),
    (dict(world_size=2, backend="mpi-ish"), "unknown backend"),
    (dict(world_size=2, timeout=0), "timeout must be a positive"),
    (dict(world_size=2, output="stream"), r"output='stream' is not one of \('live', 'ordered'\)"),
])
def test_invalid_arguments_raise_value_error_saying_what_to_do(kwargs, fragment):
    world_size = kwargs.pop("world_size")
    with pytest.raises(ValueError, match=fragment):
        launch(all_reduce_rank_plus_one, world_size, **kwargs)
    assert_no_children()


def test_nccl_without_enough_gpus_says_to_use_gloo():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match="backend='gloo'"):
        launch(all_reduce_rank_plus_one, gpus + 1, backend="nccl")


def test_non_callable_is_rejected():
    with pytest.raises(ValueError, match="callable"):
        launch(42, 2)


def test_cluster_reuse_across_twenty_runs():
    with Cluster(3) as cluster:
        pids = cluster.run(lambda rank, world_size: os.getpid())
        for i in range(20):
            assert cluster.run(all_reduce_rank_plus_one, scale=float(i)) == [6.0 * i] * 3
        assert cluster.run(lambda rank, world_size: os.getpid()) == pids, "ranks must persist between runs"
    assert_no_children()


def test_cluster_is_torn_down_after_a_crash_and_says_to_create_a_new_one():
    cluster = Cluster(2)
    with pytest.raises(RankError) as info:
        cluster.run(lambda rank, world_size: 1 / (rank - 1))
    assert info.value.rank == 1
    assert cluster.closed
    assert_no_children()
    with pytest.raises(ClusterClosed, match=r"create a new one: coursekit.Cluster\(2\)"):
        cluster.run(lambda rank, world_size: rank)


def test_cluster_timeout_tears_down():
    with Cluster(2) as cluster:
        with pytest.raises(LaunchTimeout):
            cluster.run(lambda rank, world_size: time.sleep(30), timeout=2)
        assert cluster.closed
    assert_no_children()


def test_doctor_passes(capsys):
    from coursekit.cli import doctor

    assert doctor() == 0
    out = capsys.readouterr().out
    assert "torch" in out and "2-rank all-reduce ok" in out


# ------------------------------------------------------------ what the ranks print
class Screen(io.TextIOBase):
    """Stands in for the parent's sys.stdout or sys.stderr; touches ``flags[text]`` once ``text`` is shown.

    Text counts as shown once flushed (a notebook or a pipe may hold unflushed
    text back). A rank can then wait for a flag file: proof that the parent
    showed a line while that rank was still running, with no timing guesses.
    """

    def __init__(self, flags=None):
        self.text, self._unflushed = "", ""
        self.flags = dict(flags or {})

    def writable(self):
        return True

    def write(self, text):
        self._unflushed += text
        return len(text)

    def flush(self):
        self.text, self._unflushed = self.text + self._unflushed, ""
        for needle, path in self.flags.items():
            if needle in self.text:
                path.touch()


def wait_for_file(path, seconds=30.0):  # liveness only: the parent shows a line within POLL_S
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_line_appears_in_the_parent_while_its_rank_still_runs(tmp_path):
    shown = tmp_path / "parent-showed-the-line"
    screen = Screen({"[rank 1] step 1 done\n": shown})

    def waits_for_the_parent(rank, world_size):
        if rank == 1:
            print("step 1 done")
            return wait_for_file(shown)  # False if the line is only printed after the launch
        return True

    with contextlib.redirect_stdout(screen):
        assert launch(waits_for_the_parent, 2, timeout=90) == [True, True], "the line was not shown live"
    assert screen.text == "[rank 1] step 1 done\n"


def test_a_carriage_return_redraw_appears_while_the_rank_still_runs(tmp_path):
    shown = tmp_path / "parent-showed-40"
    screen = Screen({"\r[rank 0]  40%": shown})

    def progress(rank, world_size):
        sys.stderr.write("\r 10%")
        sys.stderr.write("\r 40%")  # no newline: a progress bar between two redraws
        seen = wait_for_file(shown)
        sys.stderr.write("\r100%\n")
        return seen

    with contextlib.redirect_stderr(screen):
        assert launch(progress, 1, timeout=90) == [True], "the redraw was held back"
    assert screen.text == "[rank 0]  10%\r[rank 0]  40%\r[rank 0] 100%\n"


def test_two_ranks_lines_prefixed_partial_line_flushed_redraws_prefixed(tmp_path):
    bar_done = tmp_path / "bar-done"
    out, err = Screen(), Screen({"[rank 0] 2/3\n": bar_done})

    def writes(rank, world_size):
        if rank == 0:
            print("zero says hi")
            for i in range(3):
                sys.stderr.write(f"\r{i}/3")
            sys.stderr.write("\n")
        else:
            wait_for_file(bar_done)  # so that nothing of rank 1 lands while rank 0's bar is unfinished
            print("one says hi")
            print("no newline at the end", end="")

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        launch(writes, 2, timeout=90)
    assert out.text == "[rank 0] zero says hi\n[rank 1] one says hi\n[rank 1] no newline at the end\n"
    assert err.text == "[rank 0] 0/3\r[rank 0] 1/3\r[rank 0] 2/3\n"


def test_tqdm_on_rank_zero_redraws_with_the_prefix_after_every_carriage_return():
    err = Screen()

    def with_a_bar(rank, world_size):
        from tqdm import tqdm

        for _ in tqdm(range(5), file=sys.stderr, mininterval=0, ascii=True):
            time.sleep(0.01)

    with contextlib.redirect_stderr(err):
        launch(with_a_bar, 1)
    segments = err.text.split("\r")
    assert err.text.endswith("\n") and len(segments) > 5, repr(err.text)
    assert all(s.startswith("[rank 0] ") for s in segments if s), repr(err.text)
    assert "5/5" in segments[-1]


def test_another_ranks_line_ends_an_unfinished_redraw_first():
    from coursekit.launch.live import LiveEcho

    out, err = Screen(), Screen()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        echo = LiveEcho(2)
        echo.add(0, "stderr", "\r 40%")
        echo.add(1, "stdout", "hello\n")  # must not land inside rank 0's bar (on a terminal they share a line)
        echo.add(0, "stderr", "\r 50%")
        echo.add(0, "stderr", "\n")
        echo.finish()
    assert err.text == "[rank 0]  40%\n[rank 0]  50%\n"
    assert out.text == "[rank 1] hello\n"


def test_ordered_output_is_in_rank_order_for_launch_and_cluster(capsys):
    def reverse_order(rank, world_size):
        for turn in reversed(range(world_size)):  # rank 2 prints first, then 1, then 0
            if turn == rank:
                print(f"from {rank}")
                sys.stderr.write(f"err {rank}\n")
            dist.barrier()

    expected_out = "".join(f"[rank {r}] from {r}\n" for r in range(3))
    expected_err = "".join(f"[rank {r}] err {r}\n" for r in range(3))
    launch(reverse_order, 3, output="ordered")
    assert capsys.readouterr() == (expected_out, expected_err)
    with Cluster(3, output="ordered") as cluster:
        cluster.run(reverse_order)
        assert capsys.readouterr() == (expected_out, expected_err)
        cluster.run(lambda rank, world_size: print("live too"), output="live")
        assert sorted(capsys.readouterr().out.splitlines()) == [f"[rank {r}] live too" for r in range(3)]
    assert_no_children()


def test_rank_error_carries_and_shows_the_last_lines_the_rank_printed(capsys):
    def prints_then_fails(rank, world_size):
        for i in range(30):
            print(f"line {i} of rank {rank}")
        print("about to fail", end="")
        dist.barrier()  # rank 0's lines are in its pipe before rank 1 fails
        if rank == 1:
            raise ValueError("after printing")
        dist.recv(torch.zeros(1), src=1)  # stopped by the launcher

    with pytest.raises(RankError) as info:
        launch(prints_then_fails, 2, timeout=60)
    assert info.value.rank == 1
    kept = info.value.output.splitlines()
    assert kept == [f"line {i} of rank 1" for i in range(10, 30)] + ["about to fail"]  # the last 20, and the rest
    out = capsys.readouterr().out
    assert "[rank 1] line 29 of rank 1\n" in out and "[rank 1] about to fail\n" in out
    assert "[rank 0] line 29 of rank 0\n" in out and "[rank 0] about to fail\n" in out, "drained and shown too"
    assert_no_children()


def test_timeout_shows_every_ranks_last_lines(capsys):
    def prints_then_hangs(rank, world_size):
        print(f"rank {rank} started")
        print(f"rank {rank} partial", end="")
        if rank == 1:
            dist.recv(torch.zeros(1), src=0)  # rank 0 never sends
        return rank

    with pytest.raises(LaunchTimeout) as info:
        launch(prints_then_hangs, 2, timeout=3)
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank} started\n" in out and f"[rank {rank}] rank {rank} partial\n" in out
    assert info.value.output == {r: f"rank {r} started\nrank {r} partial\n" for r in (0, 1)}
    assert_no_children()


def test_the_launch_times_out_before_gloo_does(monkeypatch):
    """A rank stuck in a recv: the launch's own timeout (it names the stuck rank) comes before gloo's. The
    parent starts counting only once the ranks run, so gloo must give up later than the launch. Planted (the
    process group's timeout equal to the launch's, as it was): the parent, 1 s late to collect, got gloo's
    "RankError: ... Timed out waiting 2000ms for recv" instead (seen once in a fresh clone's make test)."""
    launch_module = importlib.import_module("coursekit.launch")  # the module (coursekit.launch is the function)

    def late_collect(*args, **kwargs):
        time.sleep(1.0)  # a parent slowed down between starting the ranks and collecting from them
        return collect(*args, **kwargs)

    def rank_1_waits_forever(rank, world_size):
        if rank == 1:
            dist.recv(torch.zeros(1), src=0)  # rank 0 never sends
        return rank

    collect = launch_module.collect
    monkeypatch.setattr(launch_module, "collect", late_collect)
    with pytest.raises(LaunchTimeout, match="rank 1"):
        launch(rank_1_waits_forever, 2, timeout=2)
    assert_no_children()


def test_invalid_output_for_cluster_raises_before_starting_ranks():
    with pytest.raises(ValueError, match="'live'.*'ordered'"):
        Cluster(2, output="replay")
    assert_no_children()
    with Cluster(2) as cluster:
        with pytest.raises(ValueError, match="'live'.*'ordered'"):
            cluster.run(lambda rank, world_size: rank, output="loud")
        assert cluster.run(lambda rank, world_size: rank) == [0, 1], "a bad output= must not break the cluster"


def _spin(seconds: float) -> None:
    """Busy for ``seconds`` (a rank that computes, not one that sleeps: sleeping looks like waiting)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_when_every_rank_raises_the_lowest_rank_is_reported_whoever_raised_first():
    # Every rank runs the same code, so a mistake often raises on all of them; which raises first is
    # scheduling. Here the highest rank raises first and rank 0 last: the report must still be rank 0's
    # (a grader's feedback quotes it, and must be the same for the same attempt every time).
    def all_raise(rank, world_size):
        _spin(0.4 * (world_size - 1 - rank))
        raise ValueError(f"the mistake, as rank {rank} saw it")

    with pytest.raises(RankError) as info:
        launch(all_raise, 3, timeout=60)
    assert info.value.rank == 0, f"rank {info.value.rank} reported: the first to raise, not the lowest"
    assert "as rank 0 saw it" in str(info.value)
    assert_no_children()


def test_a_rank_that_died_is_blamed_before_the_peer_whose_recv_its_death_broke():
    def one_dies(rank, world_size):
        if rank == 1:
            _spin(0.3)
            os._exit(3)
        t = torch.zeros(1)
        dist.recv(t, src=1)  # gloo raises here once rank 1 is gone: an echo of its death, not the bug

    with pytest.raises(RankError) as info:
        launch(one_dies, 2, timeout=60)
    assert info.value.rank == 1 and "code 3" in str(info.value)
    assert_no_children()


def test_no_rank_leaves_the_join_before_every_rank_has_joined():
    """coursekit.launch.group.all_joined on a real TCPStore, three "ranks" as threads: two that have joined wait
    for the third, then all three go on. Without it a rank could die (a gloo abort in a learner's first send)
    while a peer was still connecting, and the peer printed "Gloo connectFullMesh failed ... Connection closed
    by peer" from C++: 3 times in 30 launches of 8 ranks beside two CPU hogs, 0 times with it. Planted bug, seen
    failing: the first rank to join releases everyone ("2 ranks went on with 1 still to join")."""
    import threading
    from datetime import timedelta

    from coursekit.launch.group import all_joined

    server = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    done = []

    def join():  # each rank has a client of its own, as real ranks do (one client blocks while it waits)
        client = dist.TCPStore("127.0.0.1", server.port, 3, is_master=False, timeout=timedelta(seconds=30))
        all_joined(client, 3, timedelta(seconds=30))
        done.append(1)

    first = [threading.Thread(target=join, daemon=True) for _ in range(2)]
    for t in first:
        t.start()
    for t in first:
        t.join(0.5)
    assert not done, f"{len(done)} ranks went on with 1 still to join"
    last = threading.Thread(target=join, daemon=True)
    last.start()
    for t in first + [last]:
        t.join(30)
    assert len(done) == 3
