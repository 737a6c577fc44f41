"""The ``coursekit`` command: ``doctor`` (is this machine ready?) and ``grade`` (score an exercise).

    coursekit doctor
    coursekit grade exercises/01_ring_allreduce.ipynb
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time


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

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(value)
    return value.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coursekit", description="Tools for the coursekit course.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="versions, backends, cores, GPUs, and a 2-rank all-reduce smoke test")
    grade = commands.add_parser("grade", help="execute a copy of an exercise notebook and print its score",
                                add_help=False)
    grade.add_argument("rest", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    if options.command == "doctor":
        return doctor()
    from . import grading

    return grading.main(options.rest)


if __name__ == "__main__":
    sys.exit(main())
