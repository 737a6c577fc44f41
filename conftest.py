"""pytest's root configuration, for what is collected outside ``tests/``: nbval's kernels (``make test`` checks the
committed outputs of ``notebooks/*.ipynb``).

* They talk over IPC, as :mod:`coursekit.run_notebook`'s do -- over TCP a kernel's ports are picked free and bound
  later, and another process can take one in between (its docstring).
* They run under another CPU kernel dispatch than ``make notebooks`` used (:data:`OTHER_DISPATCH`). PyTorch picks
  its CPU kernels from the processor's instructions, and fp16/bf16 arithmetic, or a sum whose order a kernel
  chooses, can differ in the last bits from one machine to the next. A compared output that depends on them
  passes on the machine that committed it and fails on a newcomer's (chapter 02's fp16 underflow table did).
  Comparing under AVX2 makes every ``make test`` on an AVX-512 machine, as the course's are, the test of a second
  machine. ``ATEN_CPU_CAPABILITY=default make test`` compares under that dispatch instead.
"""

import os
import platform
import tempfile

import nbval.kernel
from jupyter_client.manager import KernelManager

# AVX2 for PyTorch's own kernels and for oneDNN's (its matmuls and convolutions): ../shared/pitfalls.md's "another CPU"
OTHER_DISPATCH = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


class IPCKernelManager(KernelManager):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("transport", "ipc")
        # the sockets' path prefix, absolute: the kernel may run in another directory (papermill's cwd=)
        kwargs.setdefault("ip", os.path.join(tempfile.mkdtemp(prefix="coursekit-kernel-"), "ipc"))
        super().__init__(*args, **kwargs)

    def start_kernel(self, **kwargs):
        if platform.machine().lower() in ("x86_64", "amd64"):  # the names mean nothing to an ARM build
            kwargs["env"] = {**OTHER_DISPATCH, **kwargs.get("env", os.environ)}  # a dispatch set outside wins
        return super().start_kernel(**kwargs)


nbval.kernel.KernelManager = IPCKernelManager  # nbval's start_new_kernel builds its manager from this name
