"""coursekit.run_notebook: a lost ZeroMQ wake-up costs one poll slice, never the whole run.

The stall it fixes (nbclient issue #312): nbclient awaits one poll on the shell
socket for a cell's reply; its Output-widget stand-in sends on that socket
meanwhile, and the send can eat the edge that announced the reply. Here a fake
socket plays that: its first poll never wakes although a message is there (the
lost edge), and any later poll sees the message.

Planted bugs (seen failing):
- ``patch_kernel_channels`` made a no-op -> "get_msg never returned: the lost wake-up hangs it";
- the slice loop without its deadline check -> ``get_msg(timeout=0.6)`` never raises Empty (TimeoutError);
- ``coursekit grade`` calling papermill directly -> "grade ran papermill without the patch".
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from queue import Empty

import pytest
from jupyter_client.channels import AsyncZMQSocketChannel

from coursekit import run_notebook

LIVENESS = 40 * run_notebook.POLL_SLICE  # far above one slice: only a hang can reach it
# jupyter_client's own get_msg, even if an earlier test already ran a notebook (which patches it)
ORIGINAL = run_notebook.unpatched_get_msg or AsyncZMQSocketChannel.get_msg


class LostEdgeSocket:
    """First poll: the edge was lost, so it only ends at its timeout (never, if there is none)."""

    def __init__(self, has_message: bool = True):
        self.has_message = has_message
        self.polls: list[int | None] = []

    async def poll(self, timeout_ms=None):
        self.polls.append(timeout_ms)
        if len(self.polls) == 1 or not self.has_message:
            if timeout_ms is None:
                await asyncio.Event().wait()  # nobody will ever set it
            await asyncio.sleep(timeout_ms / 1000)
            return 0
        return 1  # a fresh poll asks the socket first, and the message is there


def _channel(socket) -> AsyncZMQSocketChannel:
    channel = AsyncZMQSocketChannel.__new__(AsyncZMQSocketChannel)
    channel.socket = socket

    async def _recv(**_):
        return {"msg_type": "execute_reply"}

    channel._recv = _recv
    return channel


@pytest.fixture
def unpatched(monkeypatch):
    """jupyter_client's own get_msg for this test (an earlier test may have run a notebook, which patches)."""
    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", ORIGINAL)  # undone after the test
    return ORIGINAL


@pytest.fixture
def patched(unpatched):
    run_notebook.patch_kernel_channels()


def test_the_unpatched_channel_hangs_on_a_lost_wakeup(unpatched):
    """The fake reproduces the stall with jupyter_client's own get_msg (else the next test proves nothing)."""
    channel = _channel(LostEdgeSocket())
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(asyncio.wait_for(channel.get_msg(timeout=None), timeout=3 * run_notebook.POLL_SLICE))


def test_a_lost_wakeup_costs_one_slice(patched):
    socket = LostEdgeSocket()
    channel = _channel(socket)

    async def main():
        try:
            return await asyncio.wait_for(channel.get_msg(timeout=None), timeout=LIVENESS)
        except asyncio.TimeoutError:
            pytest.fail("get_msg never returned: the lost wake-up hangs it")

    assert asyncio.run(main()) == {"msg_type": "execute_reply"}
    assert len(socket.polls) == 2, socket.polls
    assert all(p is not None and p <= run_notebook.POLL_SLICE * 1000 for p in socket.polls), socket.polls


def test_a_timeout_still_raises_empty(patched):
    socket = LostEdgeSocket(has_message=False)
    channel = _channel(socket)
    with pytest.raises(Empty):
        asyncio.run(asyncio.wait_for(channel.get_msg(timeout=0.6), timeout=LIVENESS))
    assert sum(socket.polls) <= 600 and len(socket.polls) >= 3, socket.polls


def test_patch_is_idempotent(patched):
    run_notebook.patch_kernel_channels()
    assert AsyncZMQSocketChannel.get_msg is run_notebook._get_msg_in_slices


def test_grade_and_the_notebook_tools_run_papermill_patched(unpatched, monkeypatch, tmp_path):
    """Every place the course runs a notebook goes through run_notebook (here: `coursekit grade`)."""
    import papermill

    from coursekit import cli

    original = unpatched
    seen = []

    def fake_execute(src, out, **options):
        seen.append(AsyncZMQSocketChannel.get_msg)
        Path(out).write_text(Path(src).read_text())

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    (tmp_path / "learner").mkdir()
    notebook = tmp_path / "learner" / "nb.ipynb"
    notebook.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    assert cli._execute_copy(notebook, tmp_path, tmp_path / "report.json", timeout=10) == ""
    assert seen, "grade did not run the notebook"
    assert seen[0] is not original, "grade ran papermill without the patch"
    callers = [Path("coursekit/cli.py"), Path("tools/execute_notebooks.py"), Path("tests/notebook_support.py")]
    root = Path(__file__).resolve().parents[1]
    for caller in callers:
        assert "papermill.execute_notebook(" not in (root / caller).read_text(), f"{caller} calls papermill directly"


def test_kernels_talk_over_ipc_so_no_tcp_port_can_be_taken_from_them(tmp_path):
    """Over TCP the kernel's ports are picked free, released, then bound: another process can take one in
    between ("Address already in use", the kernel dies before kernel_info: seen once in a full make test).
    The kernels started here use IPC transport. Planted bug, seen failing: the default (tcp) kernel manager."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from ipykernel.kernelapp import IPKernelApp\n"
                                          "print(IPKernelApp.instance().transport)")]
    nbformat.write(nb, tmp_path / "in.ipynb")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()  # the kernel in another directory, as `coursekit grade` runs it: the socket paths are absolute
    out = run_notebook.execute_notebook(tmp_path / "in.ipynb", tmp_path / "out.ipynb", kernel_name="python3",
                                        progress_bar=False, cwd=str(elsewhere))
    assert out.cells[0].outputs[0]["text"].strip() == "ipc"


def test_nbval_kernels_talk_over_ipc_too(tmp_path):
    """The root conftest.py makes nbval's kernels IPC, started in the notebook's directory as nbval does.
    Planted bugs, seen failing: the conftest removed (tcp); its socket paths left relative ("kernel-ipc": the
    kernel, in another directory, binds elsewhere and never answers)."""
    import nbval.kernel

    km, kc = nbval.kernel.start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        assert km.transport == "ipc"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_nbval_kernels_run_under_another_cpu_dispatch_than_make_notebooks():
    """nbval compares the committed outputs under AVX2 kernels (the root conftest.py's OTHER_DISPATCH), so an output
    that depends on the CPU's kernels fails here, on the machine that made it, not in a newcomer's clone on another
    CPU (chapter 02's fp16 underflow table read 0.015% committed, 0.010% under AVX2). Planted bug, seen failing:
    the conftest's start_kernel override removed (the kernel reads this machine's own, AVX512)."""
    import platform
    import queue

    import nbval.kernel
    import torch

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the dispatch names are x86's")
    if "ATEN_CPU_CAPABILITY" not in os.environ and torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU's PyTorch dispatch is {torch.backends.cpu.get_cpu_capability()}: no AVX2 to choose")
    km, kc = nbval.kernel.start_new_kernel(kernel_name="python3")
    try:
        kc.execute("import torch; print(torch.backends.cpu.get_cpu_capability())")
        printed = []
        while True:
            try:
                message = kc.get_iopub_msg(timeout=60)
            except queue.Empty:
                pytest.fail(f"the kernel printed nothing in 60 s (so far: {printed})")
            if message["msg_type"] == "stream":
                printed.append(message["content"]["text"])
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle" and printed:
                break
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    wanted = os.environ.get("ATEN_CPU_CAPABILITY", "avx2").upper()  # one set outside is kept (the conftest's docstring)
    assert "".join(printed).strip() == wanted, f"nbval's kernel runs PyTorch's {''.join(printed).strip()} kernels"
