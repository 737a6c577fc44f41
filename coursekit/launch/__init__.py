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
return and print, and cleans up. The parts live beside this file, one job per
module. In the order a launch uses them: :mod:`.start` has the one long-lived
:mod:`.starter` thread fork (or spawn) the ranks into a :class:`~.gang.Gang`;
each rank runs :mod:`.rank`, sets its signals in :mod:`.rank_signals` and joins
the process group in :mod:`.group`, talking back through :mod:`.rank_pipe`. The
parent reads their messages in :mod:`.inbox`, shows what they print with
:mod:`.live` or :mod:`.echo` (:mod:`.lines`, :mod:`.tail`), explains a timeout or
a crash with :mod:`.diagnose` and stops every process in :mod:`.teardown`;
:mod:`.interrupts` sees that a Ctrl-C reaches the caller, :mod:`.errors` holds
what a launch raises. Only this file is imported from outside the package.

What the ranks print
--------------------
Each line a rank prints appears in the cell *while the ranks run*, prefixed with
the rank (``[rank 2] loss 0.31``): stdout to stdout, stderr to stderr, in the
order the lines arrive. A line is shown once it is complete, so two ranks' lines
never mix; a progress bar's carriage-return redraws (tqdm) are shown as they
come, so the bar moves. Arrival order changes from run to run; pass
``output="ordered"`` to get everything at the end instead, rank by rank, the
same on every run. Either way an error keeps each rank's last lines
(``RankError.output``, ``LaunchTimeout.output``).

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
* Rendezvous: each launch gets its own ``TCPStore``, served by rank 0 from a
  socket the parent opened on a port the kernel picked, so back-to-back and
  concurrent launches never collide (no port to pick). The server's thread
  lives in rank 0, never in the parent: with a store server thread in the
  parent, a child forked while that thread held a lock hung forever in its
  own store client (seen here in about one launch in ten). Details, and why
  not a ``FileStore`` (it polls every 10 ms): ``coursekit/launch/group.py``.
* Finished ranks stay alive until *every* rank is done, so a slow peer's pending
  ``recv`` is not turned into "connection reset" by an early exit.
* Timeout: a rank still running at the deadline is asked for its Python stack
  (``faulthandler``) and for what the communication layer says it waits on; the
  :class:`LaunchTimeout` names each such rank. Then every child is killed.
* Every child is killed (or, after success, told to exit) in a ``finally``;
  each also asks the kernel to kill it the moment its parent dies (Linux
  ``PR_SET_PDEATHSIG``), so not even a crashed kernel leaves a rank behind.
  One long-lived thread starts every rank, because that signal follows the
  *thread* that forked a rank (see ``coursekit/launch/rank_signals.py``).
* Ctrl-C (the notebook's stop button) always reaches the caller as
  ``KeyboardInterrupt``, with every rank stopped, whichever stage it lands in:
  CPython drops what a signal handler raises inside at-fork callbacks and
  finalizers, so the launcher counts each interrupt and raises it again if it
  was swallowed; and starting or killing a rank is never cut in half
  (``coursekit/launch/interrupts.py``). A caller that *ignores* SIGINT
  (a script started in the background by a non-interactive shell, ``nohup``)
  is left as it is: Ctrl-C does nothing there, as for any program, and the
  launch ends at its result, an error or its timeout, its ranks stopped either
  way. A notebook's kernel never ignores it, so its stop button always works.
"""

from __future__ import annotations

from typing import Any, Callable

import cloudpickle

from .echo import Echo, OrderedEcho, check_output_mode
from .errors import ClusterClosed, LaunchTimeout, RankError
from .gang import Gang
from .group import check_environment
from .inbox import collect, drain
from .interrupts import watched
from .live import LiveEcho
from .start import start_gang
from .teardown import close, stop
from ..comm.devices import MIXED, default_backend, gpu_count, uses_nccl

__all__ = ["launch", "Cluster", "RankError", "LaunchTimeout", "ClusterClosed", "resolve_backend"]


def resolve_backend(backend: str, world_size: int) -> str:
    """``"auto"`` -> ``"cpu:gloo,cuda:nccl"`` when at least ``world_size`` GPUs are visible, else ``"gloo"``.

    With GPUs, one process group carries CUDA tensors over NCCL and CPU tensors over gloo
    (:mod:`coursekit.comm.devices`), so code written for the CPU keeps working. ``"nccl"`` asks for NCCL alone (CPU
    tensors then fail). Raises ``ValueError`` with what to do for impossible requests.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer (got {world_size!r}); "
                         f"try coursekit.launch(fn, 2).")
    if backend not in ("auto", "gloo", "nccl", MIXED):
        raise ValueError(f"unknown backend {backend!r}: use 'auto' ({MIXED!r} with enough GPUs, else gloo), "
                         f"'gloo' (CPU), 'nccl' (one GPU per rank, CUDA tensors only) or {MIXED!r}.")
    gpus = gpu_count()
    if uses_nccl(backend) and gpus < world_size:
        raise ValueError(f"backend={backend!r} needs one GPU per rank: world_size={world_size} but {gpus} GPU(s) "
                         f"are visible. Use backend='gloo' (or 'auto') to run the ranks on the CPU.")
    if backend == "auto":
        return default_backend(world_size, gpus)
    return backend


def _new_echo(output: str, world_size: int) -> Echo:
    """Where the ranks' prints go: ``"live"`` or ``"ordered"`` (anything else: ValueError saying so)."""
    check_output_mode(output)
    return LiveEcho(world_size) if output == "live" else OrderedEcho(world_size)


def _show_the_rest(gang: Gang, echo: Echo) -> None:
    """At the end of a launch or run: read the output still in the pipes, then print what is left."""
    drain(gang, echo)
    echo.finish()


def _stop_then_show(gang: Gang, echo: Echo, ok: bool) -> None:
    """After a failure the ranks die first: their pipes keep what they printed, and a read cannot hang."""
    try:
        stop(gang, graceful=ok)
    finally:
        _show_the_rest(gang, echo)


def launch(fn: Callable[..., Any], world_size: int, *args, backend: str = "auto", timeout: float = 120.0,
           start_method: str | None = None, output: str = "live", env: dict[str, str] | None = None,
           **kwargs) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` ranks; return results in rank order.

    ``fn`` may be defined in a notebook cell, be a closure or a lambda. Inside it,
    ``torch.distributed`` is initialised (``dist.get_rank() == rank``).

    Args:
        fn: the function each rank runs.
        world_size: number of ranks (processes), at least 1.
        backend: ``"auto"`` (``"cpu:gloo,cuda:nccl"`` if there are ``world_size`` GPUs, else gloo), ``"gloo"``,
            ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``.
        timeout: seconds before :class:`LaunchTimeout`; the error names the ranks still running.
        start_method: ``"fork"`` (default with gloo) or ``"spawn"`` (default with NCCL).
        output: ``"live"`` (default): each line the ranks print appears as it arrives, ``[rank N]`` first;
            ``"ordered"``: all of it at the end, rank by rank, the same on every run.
        env: environment variables every rank sets before ``init_process_group``, e.g.
            ``{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}`` (torch's collective checks, chapter 09); the
            notebook's own environment is left as it is.

    Raises:
        RankError: a rank raised or died; ``.rank`` says which. When several fail (every rank runs the same
            code, so a mistake often raises on all), it is the lowest rank that died without a word, else
            the lowest that raised -- not whichever the scheduler let fail first; the others are stopped.
        LaunchTimeout: ranks still running after ``timeout`` seconds; all are stopped.

    Example:
        >>> launch(lambda rank, world_size: rank * 10, 3)
        [0, 10, 20]
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}; pass the function itself, not its result.")
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds (got {timeout!r}).")
    backend = resolve_backend(backend, world_size)  # also checks world_size
    echo = _new_echo(output, world_size)  # also checks output=, before any process starts
    env = check_environment(env)
    with watched():  # a Ctrl-C anywhere in here reaches the caller (see coursekit/launch/interrupts.py)
        gang = start_gang(world_size, backend, start_method, (fn, args, kwargs), init_timeout=timeout, env=env)
        ok = False
        try:
            results = collect(gang, echo, timeout)
            ok = True
            return results
        finally:
            try:
                _stop_then_show(gang, echo, ok)
            finally:
                close(gang, graceful=False)  # stopped already: this frees the pipes


class Cluster:
    """Persistent ranks for interactive use: start once, ``run`` many small functions.

        >>> with Cluster(4) as cluster:
        ...     cluster.run(lambda rank, world_size: rank)
        [0, 1, 2, 3]

    ``run`` has the error semantics of :func:`launch`. After an error or a
    timeout the ranks are torn down (a peer may be stuck mid-collective) and
    later ``run`` calls raise :class:`ClusterClosed`: create a new Cluster.
    ``output`` is the default for every ``run``, ``env`` is set in every rank before it joins the
    process group (see :func:`launch`).
    """

    def __init__(self, world_size: int, backend: str = "auto", timeout: float = 60.0,
                 start_method: str | None = None, output: str = "live", env: dict[str, str] | None = None):
        self.world_size = world_size
        self.output = output
        self._closed_because: str | None = None
        self._gang: Gang | None = None  # set first, so close() and __del__ work even if starting fails
        backend = resolve_backend(backend, world_size)  # also checks world_size
        echo = _new_echo(output, world_size)  # also checks output=, before any process starts
        env = check_environment(env)
        with watched():
            self._gang = start_gang(world_size, backend, start_method, None, init_timeout=timeout,
                                    env=env)  # payload None: serve
            self.backend = self._gang.backend
            try:
                collect(self._gang, echo, timeout, expect="ready")
            except BaseException as error:
                self._fail(echo, f"it failed to start ({type(error).__name__})")
                raise
            _show_the_rest(self._gang, echo)

    def run(self, fn: Callable[..., Any], *args, timeout: float = 60.0, output: str | None = None,
            **kwargs) -> list:
        """Run ``fn(rank, world_size, *args, **kwargs)`` on every rank; results in rank order.

        ``output`` (``"live"`` or ``"ordered"``) overrides the Cluster's for this run.
        """
        if self._closed_because is not None:
            raise ClusterClosed(f"this Cluster was shut down because {self._closed_because}; "
                                f"create a new one: coursekit.Cluster({self.world_size}).")
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {type(fn).__name__}.")
        echo = _new_echo(self.output if output is None else output, self.world_size)
        payload = cloudpickle.dumps((fn, args, kwargs))
        with watched():
            try:
                for conn in self._gang.conns:  # each rank is waiting in _serve (coursekit/launch/rank.py)
                    conn.send(payload)
                results = collect(self._gang, echo, timeout)
            except BaseException as error:
                reason = {RankError: f"rank {getattr(error, 'rank', '?')} failed",
                          LaunchTimeout: "a run timed out"}.get(type(error), f"of {type(error).__name__}")
                self._fail(echo, reason)
                raise
            _show_the_rest(self._gang, echo)
            return results

    @property
    def closed(self) -> bool:
        return self._closed_because is not None

    def _fail(self, echo: Echo, reason: str) -> None:
        """After an error: kill the ranks, show what they printed, free the rest; later runs say ``reason``."""
        try:
            _stop_then_show(self._gang, echo, ok=False)
        finally:
            self._teardown(reason)

    def _teardown(self, reason: str, graceful: bool = False) -> None:
        if self._gang is not None:
            close(self._gang, graceful=graceful)
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
