"""Run a function on N ranks, from a notebook cell.

    >>> import coursekit, torch, torch.distributed as dist
    >>> def hello(rank, world_size):
    ...     t = torch.tensor([rank + 1.0])
    ...     dist.all_reduce(t)
    ...     return t.item()
    >>> coursekit.launch(hello, 4)
    [10.0, 10.0, 10.0, 10.0]

Each rank is a separate process with ``torch.distributed`` initialised: gloo on
the CPU, or NCCL with ``cuda:rank`` when there are enough GPUs. Nothing here
knows about any parallelism strategy; it only starts ranks, collects what they
return and print, and cleans up.

Why fork (and when spawn)
-------------------------
``torch.multiprocessing.spawn`` starts a fresh interpreter per rank and finds the
function *by name* in ``__main__``. In Jupyter ``__main__`` is the kernel, not
the notebook, so a function defined in a cell cannot be found. It also re-imports
torch in every rank (about 0.7 s each here).

So on the CPU we **fork**: the child is a copy of the kernel, function, closures
and lambdas included, and reaches its first barrier in a few milliseconds. Fork
has two known traps, both handled:

* a forked child inherits the parent's OpenMP/BLAS thread pool *without its
  threads*; its first multi-threaded matmul can hang forever. Each rank calls
  ``torch.set_num_threads(1)`` before anything else (which also stops ranks
  from oversubscribing the cores).
* CUDA cannot be re-initialised in a forked child. For NCCL we therefore
  **spawn**, sending the function with ``cloudpickle`` (which pickles functions
  from ``__main__`` by value), so cells, closures and lambdas still work.

The start method is always passed explicitly (``multiprocessing.get_context``),
never taken from the platform default, which changes between Python versions.

Why each launch is safe to repeat
---------------------------------
* Rendezvous: each launch gets its own ``FileStore`` in a fresh temporary
  folder, so back-to-back and concurrent launches never collide (no port to
  pick). It is also fork-safe: a ``TCPStore`` server runs a thread in the
  parent, and a child forked while that thread held a lock hung forever in
  its own store client (seen here in about one launch in ten).
* Finished ranks stay alive until *every* rank is done, so a slow peer's pending
  ``recv`` is not turned into "connection reset" by an early exit.
* Timeout: a rank still running at the deadline is asked for its Python stack
  (``faulthandler``) and for what the communication layer says it waits on; the
  :class:`LaunchTimeout` names each such rank. Then every child is killed.
* Every child is terminated, then killed, in a ``finally``; each also asks the
  kernel to kill it if its parent dies (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import faulthandler
import io
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from datetime import timedelta
from multiprocessing.connection import wait as _wait_any
from typing import Any, Callable

import cloudpickle

from .waiting import STATUS_BYTES, attach, read_note, set_waiting, waiting_on

__all__ = ["launch", "Cluster", "RankError", "LaunchTimeout", "ClusterClosed", "resolve_backend"]



class RankError(RuntimeError):
    """A rank raised (or died). ``.rank`` says which; the message holds its traceback."""

    def __init__(self, rank: int, remote_traceback: str, output: str = ""):
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.output = output
        message = f"rank {rank} failed.\n\n--- traceback from rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(message)


class LaunchTimeout(TimeoutError):
    """Some ranks were still running at the deadline.

    ``.ranks`` lists them; ``.waiting`` maps each to what it was doing (the
    communication layer's note, and the innermost Python frames).
    """

    def __init__(self, timeout: float, waiting: dict[int, str]):
        self.timeout = timeout
        self.ranks = sorted(waiting)
        self.waiting = waiting
        lines = [f"ranks {self.ranks} still running after {timeout:g} s "
                 f"(a recv with no matching send, or a collective not every rank called?)"]
        for rank in self.ranks:
            lines.append(f"  rank {rank}: {waiting[rank]}")
        lines.append("All ranks were stopped. Fix the mismatch, or pass a larger timeout= if the work is just slow.")
        super().__init__("\n".join(lines))


class ClusterClosed(RuntimeError):
    """Raised by ``Cluster.run`` after the cluster was torn down."""


def resolve_backend(backend: str, world_size: int) -> str:
    """``"auto"`` -> ``"nccl"`` when at least ``world_size`` GPUs are visible, else ``"gloo"``.

    Raises ``ValueError`` with what to do for impossible requests.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer (got {world_size!r}); "
                         f"try coursekit.launch(fn, 2).")
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r}: use 'auto' (nccl with enough GPUs, else gloo), "
                         f"'gloo' (CPU) or 'nccl' (one GPU per rank).")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} but {gpus} GPU(s) "
                         f"are visible. Use backend='gloo' (or 'auto') to run the ranks on the CPU.")
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    return backend


def _set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        except OSError:
            pass


class _PipeWriter(io.TextIOBase):
    """A rank's stdout/stderr: each write goes to the parent, tagged with the stream."""

    def __init__(self, conn, stream: str, lock: threading.Lock):
        self._conn, self._stream, self._lock = conn, stream, lock

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            with self._lock:
                self._conn.send(("out", self._stream, text))
        return len(text)

    def flush(self) -> None:
        pass


def _run_user(fn, rank, world_size, args, kwargs):
    try:
        return ("result", cloudpickle.dumps(fn(rank, world_size, *args, **kwargs)))
    except BaseException:
        return ("error", traceback.format_exc())


def _rank_main(rank, world_size, backend, store_path, conn, status, stack_path, threads, payload, persistent,
               init_timeout):
    """Entry point of every rank (fork and spawn alike)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook's stop button is the parent's to handle
    _set_parent_death_signal()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    lock = threading.Lock()
    sys.stdout = _PipeWriter(conn, "stdout", lock)
    sys.stderr = _PipeWriter(conn, "stderr", lock)
    attach(status)
    stack_file = open(stack_path, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=False)
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        store = dist.FileStore(store_path, world_size)
        device_id = None
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device_id = torch.device("cuda", rank)
        with waiting_on("init_process_group (waiting for the other ranks to start)"):
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=init_timeout), device_id=device_id)
        conn.send(("ready", None, None))
        if not persistent:
            fn, args, kwargs = payload if not isinstance(payload, bytes) else cloudpickle.loads(payload)
            kind, value = _run_user(fn, rank, world_size, args, kwargs)
            with lock:
                conn.send((kind, None, value))
            conn.recv()  # wait until every rank is done before tearing anything down
        else:
            while True:
                message = conn.recv()
                if message is None:
                    break
                fn, args, kwargs = cloudpickle.loads(message)
                set_waiting("")
                kind, value = _run_user(fn, rank, world_size, args, kwargs)
                with lock:
                    conn.send((kind, None, value))
    except BaseException:
        try:
            with lock:
                conn.send(("error", None, traceback.format_exc()))
            conn.recv()
        except BaseException:
            pass
    finally:
        sys.stdout.flush()
        # No destroy_process_group(): every peer is finished or being killed, and
        # os._exit skips inherited finalisers that belong to the parent (fork).
        os._exit(0)


def _default_threads(start_method: str, world_size: int) -> int:
    if start_method == "fork":
        return 1  # see the module docstring: forked BLAS pools hang with >1 thread
    return max(1, (os.cpu_count() or 1) // world_size)


_fork_lock = threading.Lock()


class _Gang:
    """The processes of one launch (or one Cluster) and the parent's side of their pipes."""

    def __init__(self, world_size: int, backend: str, payload, persistent: bool,
                 start_method: str | None, init_timeout: float):
        self.world_size = world_size
        self.backend = resolve_backend(backend, world_size)
        if start_method is None:
            start_method = "fork" if (self.backend == "gloo" and "fork" in mp.get_all_start_methods()) else "spawn"
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method {start_method!r} is not available here; "
                             f"use one of {mp.get_all_start_methods()}.")
        self.start_method = start_method
        context = mp.get_context(start_method)
        if start_method != "fork" and payload is not None and not isinstance(payload, bytes):
            payload = cloudpickle.dumps(payload)
        self.outputs: list[list[tuple[str, str]]] = [[] for _ in range(world_size)]
        self.tmpdir = tempfile.mkdtemp(prefix="coursekit-launch-")
        store_path = os.path.join(self.tmpdir, "rendezvous")
        self.conns, self.procs, self.status, self.stack_paths = [], [], [], []
        threads = _default_threads(start_method, world_size)
        try:
            with _fork_lock, warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork of a threaded process
                for rank in range(world_size):
                    parent_conn, child_conn = context.Pipe(duplex=True)
                    status = context.RawArray("c", STATUS_BYTES)
                    stack_path = os.path.join(self.tmpdir, f"stack-{rank}.txt")
                    proc = context.Process(
                        target=_rank_main, name=f"coursekit-rank-{rank}", daemon=True,
                        args=(rank, world_size, self.backend, store_path, child_conn, status, stack_path,
                              threads, payload, persistent, init_timeout))
                    proc.start()
                    child_conn.close()
                    self.conns.append(parent_conn)
                    self.procs.append(proc)
                    self.status.append(status)
                    self.stack_paths.append(stack_path)
        except BaseException:
            self.close(graceful=False)
            raise

    # ---------------------------------------------------------------- results
    def collect(self, timeout: float, expect: str = "result") -> list:
        """Wait for one message of kind ``expect`` from every rank; raise on error or timeout."""
        deadline = time.monotonic() + timeout
        results: list[Any] = [None] * self.world_size
        pending = set(range(self.world_size))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchTimeout(timeout, self._describe_waiting(sorted(pending)))
            waitables = {self.conns[r]: r for r in pending}
            waitables.update({self.procs[r].sentinel: r for r in pending})
            for ready in _wait_any(list(waitables), timeout=min(remaining, 1.0)):
                rank = waitables[ready]
                if rank not in pending:
                    continue
                if ready is self.conns[rank] or self.conns[rank].poll():
                    message = self._receive(rank)
                    if message is None:
                        continue
                    kind, _, value = message
                    if kind == "error":
                        raise RankError(rank, value, self.output_of(rank))
                    if kind == expect:
                        results[rank] = pickle.loads(value) if kind == "result" else value
                        pending.discard(rank)
                elif not self.procs[rank].is_alive():
                    code = self.procs[rank].exitcode
                    how = f"was killed by signal {signal.Signals(-code).name}" if code and code < 0 \
                        else f"exited with code {code}"
                    raise RankError(rank, f"rank {rank} {how} before returning a result "
                                          f"(a crash in C++, e.g. a gloo buffer-size mismatch, or os._exit).\n",
                                    self.output_of(rank))
        return results

    def _receive(self, rank):
        """Read one message; keep printed output aside. Returns None for output messages."""
        try:
            message = self.conns[rank].recv()
        except (EOFError, OSError):
            self.procs[rank].join(timeout=1.0)
            code = self.procs[rank].exitcode
            raise RankError(rank, f"rank {rank} closed its pipe and exited (exit code {code}) before "
                                  f"returning a result.\n", self.output_of(rank))
        if message[0] == "out":
            self.outputs[rank].append((message[1], message[2]))
            return None
        return message

    def drain(self) -> None:
        """Read whatever output the ranks have sent but we have not read yet."""
        for rank, conn in enumerate(self.conns):
            try:
                while conn.poll():
                    message = conn.recv()
                    if message[0] == "out":
                        self.outputs[rank].append((message[1], message[2]))
            except (EOFError, OSError):
                pass

    def output_of(self, rank: int) -> str:
        return "".join(text for _, text in self.outputs[rank])

    def print_outputs(self) -> None:
        """Replay what the ranks printed, rank by rank, each line prefixed with its rank."""
        self.drain()
        for rank in range(self.world_size):
            for stream_name in ("stdout", "stderr"):
                text = "".join(t for s, t in self.outputs[rank] if s == stream_name)
                if not text:
                    continue
                stream = sys.stdout if stream_name == "stdout" else sys.stderr
                lines = text.splitlines()
                stream.write("".join(f"[rank {rank}] {line}\n" for line in lines))
            self.outputs[rank].clear()
        sys.stdout.flush()

    def _describe_waiting(self, ranks: list[int]) -> dict[int, str]:
        """Read each stuck rank's note, then ask for its stack (SIGUSR1 -> faulthandler).

        The note is read first: the signal may interrupt a blocking call and so
        change what the rank is doing.
        """
        notes = {rank: read_note(self.status[rank]) for rank in ranks}
        for rank in ranks:
            try:
                os.kill(self.procs[rank].pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass
        time.sleep(0.3)
        described = {}
        for rank in ranks:
            note = notes[rank]
            frames = _innermost_frames(self.stack_paths[rank])
            parts = [f"waiting on {note}" if note else "busy (not inside a coursekit communication call)"]
            if frames:
                parts.append("at " + " <- ".join(frames))
            described[rank] = "; ".join(parts)
        return described

    # ---------------------------------------------------------------- teardown
    def send_all(self, message) -> None:
        for conn in self.conns:
            conn.send(message)

    def close(self, graceful: bool) -> None:
        """Stop every rank: politely if ``graceful`` (all finished), else at once. Idempotent."""
        if graceful:
            for conn in self.conns:
                try:
                    conn.send(None)
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + 5.0
            for proc in self.procs:
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()  # SIGKILL: a rank stuck in a C++ recv ignores SIGTERM's Python handler
        for proc in self.procs:
            proc.join(timeout=5.0)
            if hasattr(proc, "close") and not proc.is_alive():
                proc.close()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _innermost_frames(stack_path: str, keep: int = 3) -> list[str]:
    """The innermost ``keep`` frames of a faulthandler dump, as 'function (file:line)'."""
    try:
        with open(stack_path) as handle:
            lines = [line.strip() for line in handle if line.strip().startswith("File ")]
    except OSError:
        return []
    frames = []
    for line in lines:  # faulthandler prints the most recent call first
        # File "/path/to/file.py", line 12 in name
        try:
            path_part, rest = line[6:].split('", line ', 1)
            lineno, name = rest.split(" in ", 1)
        except ValueError:
            continue
        if "coursekit/launch.py" in path_part:
            continue
        frames.append(f"{name} ({os.path.basename(path_part)}:{lineno})")
        if len(frames) == keep:
            break
    return frames


def launch(fn: Callable[..., Any], world_size: int, *args, backend: str = "auto", timeout: float = 120.0,
           start_method: str | None = None, **kwargs) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` ranks; return results in rank order.

    ``fn`` may be defined in a notebook cell, be a closure or a lambda. Inside it,
    ``torch.distributed`` is initialised (``dist.get_rank() == rank``).

    Args:
        fn: the function each rank runs.
        world_size: number of ranks (processes), at least 1.
        backend: ``"auto"`` (NCCL if there are ``world_size`` GPUs, else gloo), ``"gloo"`` or ``"nccl"``.
        timeout: seconds before :class:`LaunchTimeout`; the error names the ranks still running.
        start_method: ``"fork"`` (default with gloo) or ``"spawn"`` (default with NCCL).

    Raises:
        RankError: a rank raised or died; ``.rank`` says which. The others are stopped at once.
        LaunchTimeout: ranks still running after ``timeout`` seconds; all are stopped.

    Example:
        >>> launch(lambda rank, world_size: rank * 10, 3)
        [0, 10, 20]
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}; pass the function itself, not its result.")
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds (got {timeout!r}).")
    gang = _Gang(world_size, backend, (fn, args, kwargs), persistent=False, start_method=start_method,
                 init_timeout=timeout)
    ok = False
    try:
        results = gang.collect(timeout)
        ok = True
        return results
    finally:
        try:
            gang.print_outputs()
        finally:
            gang.close(graceful=ok)


class Cluster:
    """Persistent ranks for interactive use: start once, ``run`` many small functions.

        >>> with Cluster(4) as cluster:
        ...     cluster.run(lambda rank, world_size: rank)
        [0, 1, 2, 3]

    ``run`` has the error semantics of :func:`launch`. After an error or a
    timeout the ranks are torn down (a peer may be stuck mid-collective) and
    later ``run`` calls raise :class:`ClusterClosed`: create a new Cluster.
    """

    def __init__(self, world_size: int, backend: str = "auto", timeout: float = 60.0,
                 start_method: str | None = None):
        self.world_size = world_size
        self._closed_because: str | None = None
        self._gang = _Gang(world_size, backend, None, persistent=True, start_method=start_method,
                           init_timeout=timeout)
        self.backend = self._gang.backend
        try:
            self._gang.collect(timeout, expect="ready")
        except BaseException as error:
            self._teardown(f"it failed to start ({type(error).__name__})")
            raise

    def run(self, fn: Callable[..., Any], *args, timeout: float = 60.0, **kwargs) -> list:
        """Run ``fn(rank, world_size, *args, **kwargs)`` on every rank; results in rank order."""
        if self._closed_because is not None:
            raise ClusterClosed(f"this Cluster was shut down because {self._closed_because}; "
                                f"create a new one: coursekit.Cluster({self.world_size}).")
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {type(fn).__name__}.")
        payload = cloudpickle.dumps((fn, args, kwargs))
        try:
            self._gang.send_all(payload)
            results = self._gang.collect(timeout)
        except BaseException as error:
            self._gang.print_outputs()
            reason = {RankError: f"rank {getattr(error, 'rank', '?')} failed",
                      LaunchTimeout: "a run timed out"}.get(type(error), f"of {type(error).__name__}")
            self._teardown(reason)
            raise
        self._gang.print_outputs()
        return results

    @property
    def closed(self) -> bool:
        return self._closed_because is not None

    def _teardown(self, reason: str, graceful: bool = False) -> None:
        if self._gang is not None:
            self._gang.close(graceful=graceful)
            self._gang = None
        if self._closed_because is None:
            self._closed_because = reason

    def close(self) -> None:
        """Stop the ranks. Safe to call twice."""
        self._teardown("close() was called", graceful=True)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running"
        return f"Cluster(world_size={self.world_size}, backend={self.backend!r}, {state})"
