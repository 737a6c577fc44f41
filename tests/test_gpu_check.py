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
def test_without_gpus_it_skips_cleanly_and_says_what_to_run_instead():
    """Exit 0, "skipped: no GPU": a CI without GPUs can call it. Planted bug, seen failing: exit status 2."""
    done = _run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped: no GPU" in done.stdout and "--backend gloo" in done.stdout


@pytest.mark.slow
def test_every_check_passes_on_cpu_ranks():
    """The collectives at 2-4 ranks, every capstone layout (the chapters' cores) and expert parallelism equal to one
    process."""
    done = _run("--backend", "gloo", "--max-ranks", "4", "--steps", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "G=2 (gloo): ok" in done.stdout and "G=4 (gloo): ok" in done.stdout, done.stdout
    capstone = [line for line in done.stdout.splitlines() if line.startswith("capstone ")]
    assert len(capstone) == 8 and all(": ok, " in line for line in capstone), done.stdout
    experts = [line for line in done.stdout.splitlines() if line.startswith("expert ")]
    assert len(experts) == 2 and all(": ok, " in line for line in experts), done.stdout
