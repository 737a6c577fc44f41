"""tools/gpu_check.py (``make gpu-check``): refuses clearly without GPUs, and its checks pass on CPU ranks.

No GPU has been lent to this project, so the NCCL run itself is not tested here; the same script with
``--backend gloo`` is, so that what someone runs on a GPU machine is known to work apart from the backend.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 2, reason="this machine has GPUs")
def test_without_gpus_it_says_so_and_what_to_run_instead():
    done = _run()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs at least 2 GPUs for NCCL" in done.stderr and "--backend gloo" in done.stderr


@pytest.mark.slow
def test_every_check_passes_on_cpu_ranks():
    done = _run("--backend", "gloo", "--max-ranks", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "G=2 (gloo): ok" in done.stdout and "G=3 (gloo): ok" in done.stdout, done.stdout
