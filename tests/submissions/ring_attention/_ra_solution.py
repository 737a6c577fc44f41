"""The solution of exercise 06, taken from the notebook's one source (both functions), for attempts to reuse."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def functions(exercise: bool = False) -> dict:
    """``{"merge": ..., "ring_attention_forward": ...}`` as the solution (or, ``exercise``, the stub) defines them."""
    sys.path.insert(0, str(ROOT / "tools"))
    from build_notebook import select

    source = select((ROOT / "tools" / "notebook_src" / "06_ring_attention.py").read_text(), exercise)
    cells = re.split(r"^# %%.*$", source, flags=re.M)
    namespace: dict = {}
    exec("import torch\nfrom coursekit import comm\nfrom coursekit.parallel.ring_attention import block_attention\n"
         + "\n".join(c for c in cells if "def merge" in c or "def ring_attention_forward" in c), namespace)
    return {name: namespace[name] for name in ("merge", "ring_attention_forward")}


merge = functions()["merge"]
ring_attention_forward = functions()["ring_attention_forward"]
