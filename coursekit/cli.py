"""The ``coursekit`` command: ``doctor`` (is this machine ready?), ``grade`` (score an exercise notebook) and
``train`` (the capstone trainer, any layout: :mod:`coursekit.capstone`).

    coursekit doctor
    coursekit grade exercises/01_ring_allreduce.ipynb
    coursekit train --dp 2 --tp 2 --steps 20
    coursekit train --dp 4 --ep 2 --experts 4 --steps 20     # a mixture of experts, its experts over 2 ranks

``grade`` runs a copy of the notebook with papermill; the notebook's own grading
cells (:func:`coursekit.grading.grade`) leave their results in a file this
command then reads, so the score is the one the learner saw.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path


def doctor() -> int:
    """Print what the course needs to know about this machine; run a 2-rank all-reduce.

    Returns 0 when the smoke test passes, 1 otherwise.
    """
    import torch
    import torch.distributed as dist

    import coursekit

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backends = [name for name, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                      ("mpi", dist.is_mpi_available())) if ok]
    rows = [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("coursekit", coursekit.__version__),
        ("torch.distributed", "available" if dist.is_available() else "NOT available"),
        ("backends", ", ".join(backends) or "none"),
        ("cpu cores", str(os.cpu_count())),
        ("gpus", ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) if gpus else "none (ranks run on the CPU with gloo)"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")

    start = time.perf_counter()
    try:
        results = coursekit.launch(_smoke_all_reduce, 2, timeout=60.0)
    except Exception as error:  # report, do not crash: this is a diagnostic
        print(f"{'smoke test':<{width}}  FAILED: 2-rank all-reduce: {error}")
        return 1
    seconds = time.perf_counter() - start
    ok = results == [3.0, 3.0]
    verdict = "ok" if ok else f"FAILED: expected [3.0, 3.0], got {results}"
    print(f"{'smoke test':<{width}}  2-rank all-reduce {verdict} ({seconds:.2f} s, backend {coursekit.resolve_backend('auto', 2)})")
    return 0 if ok else 1


def _smoke_all_reduce(rank: int, world_size: int) -> float:
    import torch
    import torch.distributed as dist

    from .comm.devices import device

    value = torch.tensor([rank + 1.0], device=device())
    dist.all_reduce(value)
    return value.item()


def grade_notebook(argv: list[str] | None = None) -> int:
    """``coursekit grade NOTEBOOK``: execute a copy, print the score table; 0 only on full marks, 2 on bad usage."""
    from . import grading

    parser = argparse.ArgumentParser(prog="coursekit grade", description=(
        "Execute a copy of an exercise notebook (your file is never changed) and print its score table. Exit "
        "status: 0 on full marks, 1 otherwise, 2 on bad usage. Options go before or after the notebook."))
    parser.add_argument("notebook", type=Path, help="an exercise notebook, e.g. exercises/01_ring_allreduce.ipynb")
    parser.add_argument("--exercise", help="exercise name (default: the notebook's file name)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per notebook cell (default 600)")
    options = parser.parse_args(argv)
    path: Path = options.notebook
    if not path.is_file():
        print(f"coursekit grade: no such notebook: {path}", file=sys.stderr)
        return 2
    exercise = options.exercise or path.stem
    try:
        grading.checks_for(exercise)
    except ValueError as error:
        print(f"coursekit grade: {error} (pass --exercise NAME)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="coursekit-grade-") as tmp:
        report_path = Path(tmp) / "report.json"
        note = _execute_copy(path, Path(tmp), report_path, options.timeout, exercise)
        report = grading.saved_report(exercise, report_path, note)
    print(report.table())
    return 0 if report.full_marks else 1


def _execute_copy(path: Path, tmp: Path, report_path: Path, timeout: float, exercise: str = "") -> str:
    """Run a copy of ``path`` in ``tmp``, its grading cells writing to ``report_path``; a note if it stopped early.

    For an exercise of :data:`coursekit.answers.WHOLE_NOTEBOOK` the copy starts with one more cell, which holds
    the library's answers back for the whole kernel: a cell that calls one stops the notebook, saying so."""
    from .answers import WHOLE_NOTEBOOK
    from .grading import REPORT_ENV

    copy = tmp / path.name
    shutil.copyfile(path, copy)  # the learner's file is only ever read
    if exercise in WHOLE_NOTEBOOK:
        import nbformat

        notebook = nbformat.read(copy, as_version=4)
        notebook.cells.insert(0, nbformat.v4.new_code_cell(
            f"import coursekit.answers\ncoursekit.answers.hold_for_this_process({exercise!r})"))
        nbformat.write(notebook, copy)
    previous = os.environ.get(REPORT_ENV)
    os.environ[REPORT_ENV] = str(report_path)
    os.environ.setdefault("MPLBACKEND", "agg")
    try:
        from .run_notebook import execute_notebook

        # The kernel's own log is not for a learner grading an exercise -- its start-up warning about
        # unencrypted TCP on localhost, its "KeyboardInterrupt caught in kernel" when an interrupt lands between
        # cells -- only its crashes: what the learner's cells print and raise reaches the table anyway.
        execute_notebook(str(copy), str(tmp / ("executed-" + path.name)), kernel_name="python3",
                         cwd=str(tmp), execution_timeout=int(timeout), progress_bar=False, log_output=False,
                         extra_arguments=["--IPKernelApp.log_level=CRITICAL"])
    except Exception as error:  # the learner's notebook may fail anywhere: grade what ran
        return stopped_note(error)
    finally:
        if previous is None:
            os.environ.pop(REPORT_ENV, None)
        else:
            os.environ[REPORT_ENV] = previous
    return ""


def stopped_note(error: BaseException) -> str:
    """The line the score table shows when the notebook stopped before its end: the error's last line."""
    lines = str(error).strip().splitlines()
    return "the notebook stopped with an error before the end: " + (lines[-1] if lines else type(error).__name__)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # grade and train parse their own options, in any order and with their own -h: argparse's REMAINDER would
    # take only what follows the first positional, so `grade --timeout 120 nb` and `grade -h` never reached them.
    if argv[:1] == ["train"]:
        from .capstone.__main__ import main as train_main

        return train_main(argv[1:])
    if argv[:1] == ["grade"]:
        return grade_notebook(argv[1:])
    parser = argparse.ArgumentParser(prog="coursekit", description="Tools for the coursekit course. "
                                     "`coursekit COMMAND -h` says more about one command.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="versions, backends, cores, GPUs, and a 2-rank all-reduce smoke test")
    commands.add_parser("grade", help="execute a copy of an exercise notebook and print its score "
                                      "(coursekit grade NOTEBOOK [--timeout S] [--exercise NAME])", add_help=False)
    commands.add_parser("train", help="train the course transformer on any layout (--dp --tp --pp --sp; --ep "
                                      "with --experts)", add_help=False)
    parser.parse_args(argv)  # doctor, the one command left (grade and train returned above), or help and exit
    return doctor()


if __name__ == "__main__":
    sys.exit(main())
