"""pytest's root configuration, for what is collected outside ``tests/``: nbval's kernels (``make test`` checks the
committed outputs of ``notebooks/*.ipynb``) talk over IPC, as :mod:`coursekit.run_notebook`'s do -- over TCP a
kernel's ports are picked free and bound later, and another process can take one in between (its docstring)."""

import os
import tempfile

import nbval.kernel
from jupyter_client.manager import KernelManager


class IPCKernelManager(KernelManager):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("transport", "ipc")
        # the sockets' path prefix, absolute: the kernel may run in another directory (papermill's cwd=)
        kwargs.setdefault("ip", os.path.join(tempfile.mkdtemp(prefix="coursekit-kernel-"), "ipc"))
        super().__init__(*args, **kwargs)


nbval.kernel.KernelManager = IPCKernelManager  # nbval's start_new_kernel builds its manager from this name
