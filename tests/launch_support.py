"""Shared by the launcher's tests: wait for files the ranks write when they reach a stage (no sleeps as sync)."""

import os
import time


def wait_for_files(paths, seconds: float) -> bool:
    """True once every file in ``paths`` exists; False after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
