"""Exercise 09 as its notebook defines it, taken from the one source: the broken programs, the solution's
diagnosis and fixes, and the exercise's stubs, for the attempts to reuse.

The functions are defined in one namespace with the notebook's imports (``torch``, ``comm``, ``ring_all_reduce``,
``loss_fn``), as in the notebook's kernel. An attempt takes the solution's parts it gets right; its own part is
``edited(name, (old, new), ...)``, the notebook's function with a learner's edits (each ``old`` must occur in it
exactly once, so that an edit of the notebook cannot quietly turn an attempt into the solution), or written out
in the attempt's file where the edits would be most of it.
"""

import ast
import linecache
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "tools" / "notebook_src" / "09_find_the_bug.py"
IMPORTS = ("import torch\nfrom coursekit import comm\nfrom coursekit.collectives import ring_all_reduce\n"
           "from coursekit.models import loss_fn\n")
NAMES = ("broken_train_step", "broken_ring_sum", "broken_make_replica", "train_step", "ring_sum", "make_replica")


def notebook(exercise: bool = False) -> dict:
    """The notebook's definitions (and ``diagnosis``) on its solution side (or, ``exercise``, its stub side)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from build_notebook import select

    source = select(SOURCE.read_text(), exercise)
    kept = [ast.get_source_segment(source, node) for node in ast.parse(source).body  # the definitions only
            if (isinstance(node, ast.FunctionDef) and node.name in NAMES)
            or (isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["diagnosis"])]
    code = IMPORTS + "\n\n".join(kept) + "\n"
    SEGMENTS.update((node.split("(", 1)[0][len("def "):], node) for node in kept if node.startswith("def "))
    return define(code, f"<09_find_the_bug {'exercise' if exercise else 'solution'}>")


SEGMENTS: dict[str, str] = {}  # function name -> its source in the solution notebook


def define(code: str, filename: str, **names) -> dict:
    """Run ``code`` in a namespace of its own, its source registered as a notebook cell's is (so that
    ``inspect.getsource`` finds it: the grader recognises an untouched stub by its source)."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace: dict = dict(names)
    exec(compile(code, filename, "exec"), namespace)
    return namespace


stub = notebook(exercise=True)
solution = notebook()   # last: SEGMENTS holds the solution's sources
DIAGNOSIS = dict(solution["diagnosis"])


def edited(name: str, *edits: tuple[str, str], **names):
    """The solution notebook's function ``name`` (``broken_ring_sum``, ``make_replica``, ...) with ``edits``
    made, defined under the name the grader takes (``ring_sum``); ``names``: more globals it needs."""
    source = SEGMENTS[name]
    for old, new in edits:
        assert source.count(old) == 1, f"{name}: {old!r} occurs {source.count(old)} times"
        source = source.replace(old, new)
    plain = name.removeprefix("broken_")
    return define(IMPORTS + source.replace(f"def {name}(", f"def {plain}(", 1), f"<attempt: {name} edited {abs(hash(edits))}>",
                  **names)[plain]

