"""Shared by the launcher's tests: wait for files the ranks write when they reach a stage (no sleeps as sync);
the processes a launch may have left behind."""

import os
import time

import psutil


def wait_for_files(paths, seconds: float) -> bool:
    """True once every file in ``paths`` exists; False after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def child_processes() -> list:
    """This process's descendants, but multiprocessing's resource tracker.

    The first ``spawn`` in a process starts the tracker (``python -c 'from multiprocessing.resource_tracker
    import main; ...'``), and it lives, by design, as long as its parent: it is no rank, and whichever test
    file spawned first on this pytest worker (tests/test_debugging.py, say) must not fail a later one's check
    that no rank outlived its launch.
    """
    def is_tracker(proc) -> bool:
        try:
            return any("multiprocessing.resource_tracker" in part for part in proc.cmdline())
        except psutil.Error:  # gone meanwhile: not left behind
            return True
    return [proc for proc in psutil.Process().children(recursive=True) if not is_tracker(proc)]
