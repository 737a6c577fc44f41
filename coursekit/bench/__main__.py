"""``python -m coursekit.bench NAME [options] [--check]``: the course's benchmarks, and whether they meet their targets.

Each benchmark is a module ``coursekit.bench.NAME`` whose ``main(argv)`` prints a
markdown table (medians of repeated runs, ready for docs/benchmarks.md) and returns its
targets as ``(target, measured, met)`` triples. This entry point prints them;
with ``--check`` it exits 1 when any is missed, for people reproducing
the tables in docs/benchmarks.md (README summarises them). Benchmarks are not tests: timings on a shared machine are noisy.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Callable

Target = tuple[str, str, bool]  # (what is promised, what was measured, whether it was met)


def available() -> list[str]:
    """The benchmarks: the modules of this package that define ``main(argv)`` (read, not imported: nothing runs).

    A module without one is a part of another benchmark (``pipeline_sweep``, the m-sweep of ``pipeline``).
    """
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)])
                  if not m.name.startswith("_") and "\ndef main(" in (here / f"{m.name}.py").read_text())


def _load(name: str) -> Callable[[list[str]], list[Target]]:
    return lambda argv: importlib.import_module(f"coursekit.bench.{name}").main(argv)


def report(targets: list[Target]) -> list[Target]:
    """Print one line per target (met or MISSED, and what was measured); return the missed ones."""
    if not targets:
        print("\nno target measured with these options")
        return []
    print("\n| target | measured | |\n|---|---|---|")
    for target, measured, met in targets:
        print(f"| {target} | {measured} | {'met' if met else '**MISSED**'} |")
    return [t for t in targets if not t[2]]


def main(argv: list[str], benches: dict[str, Callable[[list[str]], list[Target]]] | None = None) -> int:
    """Run the benchmark ``argv[0]`` with the rest of ``argv``; ``--check`` anywhere makes a missed target exit 1.

    ``benches`` maps names to ``main`` functions (default: the modules of this
    package, imported only when run); exit status 2 for an unknown name.
    """
    benches = benches if benches is not None else {name: _load(name) for name in available()}
    check = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    if not argv or argv[0] not in benches:
        print(f"usage: python -m coursekit.bench {{{'|'.join(sorted(benches))}}} [options] [--check]\n"
              f"  --check: exit 1 if a target the benchmark prints is missed", file=sys.stderr)
        return 2
    missed = report(list(benches[argv[0]](argv[1:])))
    if check and missed:
        print(f"coursekit.bench {argv[0]} --check: {len(missed)} target{'s' if len(missed) > 1 else ''} missed: "
              + "; ".join(f"{target} (measured {measured})" for target, measured, _ in missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
