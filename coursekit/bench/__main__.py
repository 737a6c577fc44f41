"""``python -m coursekit.bench NAME [options]``: the course's benchmarks.

Each benchmark is a module ``coursekit.bench.NAME`` with ``main(argv) -> int``.
They print a markdown table (medians of repeated runs), ready for README.
Benchmarks are not tests: timings on a shared machine are noisy.
"""

import importlib
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] not in names:
        print(f"usage: python -m coursekit.bench {{{'|'.join(names)}}} [options]", file=sys.stderr)
        return 2
    return importlib.import_module(f"coursekit.bench.{argv[0]}").main(argv[1:])


sys.exit(main(sys.argv[1:]))
