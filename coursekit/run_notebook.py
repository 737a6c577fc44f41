"""Run a notebook with papermill without the widget stall: ``execute_notebook(path, out, **options)``.

Why this exists. papermill drives the kernel through nbclient, which waits for a
cell's ``execute_reply`` by awaiting ``shell_channel.get_msg(timeout=None)``, one
asyncio poll on the shell socket. When a cell shows an ``ipywidgets.Output``
(our chapters' sliders redraw into one), nbclient's own stand-in for that widget
*sends* a comm message on the same shell socket while that poll is pending. A
ZeroMQ socket signals readiness edge-triggered, and the send can consume the
edge that announced the reply: the reply sits in the socket, the poll is never
woken, kernel and client both sit idle, and the notebook never finishes. On a
quiet machine the reply usually wins the race; with the cores busy (a test
suite, a second notebook) it loses, about one run in five here (nbclient issue
#312, open upstream). A learner's ``coursekit grade`` can hit it as well.

The fix: wait for a shell or iopub message in short slices. Each new poll first
asks the socket whether a message is already there, so a lost wake-up costs one
slice instead of forever. Timeouts keep their meaning: ``get_msg(timeout=t)``
still raises ``queue.Empty`` after ``t`` seconds. The patch is applied once, to
jupyter_client's asyncio channel class, and only when a notebook is run here.

A second race, fixed here too: over TCP, jupyter_client picks the kernel's five ports by binding port 0 and
closing it, and the kernel binds them a moment later. Meanwhile any other process on the machine (a gloo rank
connecting, a torchrun store) may be handed the same ephemeral port, and the kernel dies with "Address already
in use" before it replies to ``kernel_info`` (seen once in a full ``make test``). So the kernels started here talk
over **IPC** (Unix sockets in Jupyter's runtime directory): no port to lose (:func:`ipc_kernel_manager`).

    >>> from coursekit.run_notebook import execute_notebook
    >>> execute_notebook("notebooks/00_welcome.ipynb", "/tmp/out.ipynb", kernel_name="python3")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import tempfile
import time
from queue import Empty
from typing import Any

POLL_SLICE = 0.25  # seconds: the longest a lost wake-up can delay a message
unpatched_get_msg = None  # jupyter_client's own, kept once patched (the tests compare against it)


async def _get_msg_in_slices(self, timeout: float | None = None) -> dict[str, Any]:
    """``AsyncZMQSocketChannel.get_msg`` that re-polls every ``POLL_SLICE`` seconds."""
    assert self.socket is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = POLL_SLICE if deadline is None else max(0.0, min(POLL_SLICE, deadline - time.monotonic()))
        if await self.socket.poll(int(wait * 1000)):
            return await self._recv()
        if deadline is not None and time.monotonic() >= deadline:
            raise Empty


def patch_kernel_channels() -> None:
    """Make jupyter_client's asyncio channels poll in slices (idempotent)."""
    global unpatched_get_msg
    from jupyter_client.channels import AsyncZMQSocketChannel

    if AsyncZMQSocketChannel.get_msg is not _get_msg_in_slices:
        unpatched_get_msg = AsyncZMQSocketChannel.get_msg
        AsyncZMQSocketChannel.get_msg = _get_msg_in_slices


def ipc_kernel_manager():
    """jupyter_client's kernel manager whose kernels use IPC transport (no TCP port to race for)."""
    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("transport", "ipc")
            # the sockets' path prefix, absolute: the kernel may run in another directory (papermill's cwd=)
            kwargs.setdefault("ip", os.path.join(tempfile.mkdtemp(prefix="coursekit-kernel-"), "ipc"))
            super().__init__(*args, **kwargs)

    return IPCKernelManager


def execute_notebook(input_path, output_path, **options):
    """``papermill.execute_notebook`` with the channel patch applied and IPC kernels; same arguments, same result."""
    import papermill

    patch_kernel_channels()
    options.setdefault("kernel_manager_class", ipc_kernel_manager())
    return papermill.execute_notebook(str(input_path), str(output_path), **options)
