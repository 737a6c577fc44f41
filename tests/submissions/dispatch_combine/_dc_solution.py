"""The solution of exercise 07, taken from the notebook's one source (dispatch, combine), for attempts to reuse."""

import linecache
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def functions(exercise: bool = False) -> dict:
    """``{"dispatch": ..., "combine": ...}`` as the solution (or, ``exercise``, the stub) defines them."""
    sys.path.insert(0, str(ROOT / "tools"))
    from build_notebook import select

    source = select((ROOT / "tools" / "notebook_src" / "07_dispatch_combine.py").read_text(), exercise)
    cells = re.split(r"^# %%.*$", source, flags=re.M)
    code = ("import torch\nfrom coursekit import comm\nfrom coursekit.parallel.sequence.comm import all_to_all\n"
            + "\n".join(c for c in cells if any(d in c for d in ("def dispatch", "def combine"))))
    # its source kept where inspect finds it, as IPython keeps a cell's: the grader reads a stub from it
    name = f"<07_dispatch_combine {'exercise' if exercise else 'solution'}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    namespace: dict = {}
    exec(compile(code, name, "exec"), namespace)
    return {name: namespace[name] for name in ("dispatch", "combine")}


_solution = functions()
dispatch, combine = _solution["dispatch"], _solution["combine"]
