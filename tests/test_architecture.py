"""The shape of the house, checked: no import cycles, no private names across modules, the layering, sizes.

Read from the source with :mod:`ast` (nothing is imported), so a new cycle or a reach into another
module's ``_private`` name fails here with the modules named, before it confuses a reader. Every import
counts, also one inside a function: a "lazy" import that closes a cycle is still a cycle in the design.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "coursekit"

# Algorithms (what a strategy, a collective or the launcher is) never import what draws, explains or grades them.
PRESENTATION = ("coursekit.viz", "coursekit.widgets", "coursekit.grading", "coursekit.checks", "coursekit.bench",
                "coursekit.experiments", "coursekit.cli", "coursekit.__main__", "coursekit.run_notebook")
# The point-to-point layer is below every collective; the launcher is below every strategy.
COMM = ("coursekit.comm",)
COLLECTIVES = ("coursekit.collectives",)
LAUNCH = ("coursekit.launch",)
# The top level shows the architecture: packages named for their layer, a few modules where a reader starts.
MAX_TOP_LEVEL_MODULES = 12

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    return {_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if modules()[module].name != "__init__.py":
        base = base[:-1]  # a module's package; a package's own __init__ is its package
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@lru_cache(maxsize=1)
def imports() -> dict[str, list[tuple[str, str, int]]]:
    """module -> [(imported module, name taken from it or "", line)], for every import of coursekit code."""
    found: dict[str, list[tuple[str, str, int]]] = {}
    for module, path in modules().items():
        edges = found.setdefault(module, [])
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "coursekit"]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, node)
                if source.split(".")[0] != "coursekit":
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules():   # from . import comm: the module comm
                        edges.append((submodule, "", node.lineno))
                    else:                         # from .comm import record: a name of the module comm
                        edges.append((source, alias.name, node.lineno))
    return found


def graph() -> dict[str, set[str]]:
    return {m: {target for target, _, _ in edges if target != m and target in modules()}
            for m, edges in imports().items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def reachable(start: str, edges: dict[str, set[str]]) -> dict[str, str]:
    """Every module ``start`` imports, directly or not -> the module that imports it (to name the path)."""
    seen, todo = {start: ""}, [start]
    while todo:
        here = todo.pop()
        for there in sorted(edges.get(here, ())):
            if there not in seen:
                seen[there] = here
                todo.append(there)
    return seen


def path_to(target: str, seen: dict[str, str]) -> str:
    hops = [target]
    while seen[hops[-1]]:
        hops.append(seen[hops[-1]])
    return " -> ".join(reversed(hops))


def private_reaches() -> list[str]:
    """``from x import _y`` and ``x._y`` where x is another coursekit module; one of the launcher's parts
    (``coursekit.launch.gang`` ...) imported from outside the launcher: its face is ``coursekit.launch``."""
    found = []
    for module, edges in imports().items():
        found += [f"{module}:{line} imports the private package {source}" for source, _, line in edges
                  if source.startswith("coursekit.launch.") and not within(module, LAUNCH)]
        found += [f"{module}:{line} imports {name} from {source}" for source, name, line in edges
                  if name.startswith("_") and not name.startswith("__") and source != module]
        tree = ast.parse(modules()[module].read_text())
        bound = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 for alias in node.names if f"{_absolute(module, node)}.{alias.name}" in modules()}
        found += [f"{module}:{node.lineno} uses {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in bound and node.attr.startswith("_") and not node.attr.startswith("__")]
    return found


def test_the_walk_sees_the_package():
    """Guard for the tests below: they would pass on an empty walk."""
    assert {"coursekit.comm", "coursekit.launch", "coursekit.comm.mesh", "coursekit.train"} <= set(modules())
    assert "coursekit.comm.state" in graph()["coursekit.comm"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, ("import cycles (a lazy import inside a function counts too): "
                       + "; ".join(" <-> ".join(c) for c in found)
                       + ". Move what both need into a module below them, or pass it in.")


def test_no_private_names_across_modules():
    found = private_reaches()
    assert not found, ("private names used from another module -- give them a public name (and a docstring) "
                       "in the module that owns them:\n  " + "\n  ".join(found))


@pytest.mark.parametrize("layer, forbidden, why", [
    ("algorithms", PRESENTATION, "algorithms never import plotting, widgets, grading or benchmarks"),
    ("comm", COLLECTIVES + ("coursekit.parallel",), "point-to-point is below every collective and strategy"),
    ("launch", ("coursekit.parallel", "coursekit.train") + COLLECTIVES, "the launcher is below every strategy"),
])
def test_layering(layer, forbidden, why):
    starts = {"algorithms": [m for m in modules() if not within(m, PRESENTATION) and m != "coursekit"],
              "comm": [m for m in modules() if within(m, COMM)],
              "launch": [m for m in modules() if within(m, LAUNCH)]}[layer]
    edges, broken = graph(), []
    for start in starts:
        seen = reachable(start, edges)
        broken += [path_to(target, seen) for target in sorted(seen) if within(target, forbidden)]
    assert starts and not broken, f"{why}; but:\n  " + "\n  ".join(broken[:20])


def test_the_top_level_shows_the_architecture():
    """At most 12 modules loose in coursekit/: the rest live in packages named for their layer. Planted, seen
    failing: a 13th module (coursekit/scratch*.py) -> the list of 13 printed."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(loose)} modules at the top of coursekit/ (at most {MAX_TOP_LEVEL_MODULES}): {loose}; put the new one "
        f"in the package of its layer (comm, collectives, launch, measure, parallel, ...)")


def test_files_and_functions_stay_short():
    too_long = []
    for module, path in modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines (at most {MAX_FILE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines "
                                    f"(at most {MAX_FUNCTION_LINES})")
    assert not too_long, "split by concept:\n  " + "\n  ".join(too_long)


# One core per parallelism: the algorithm alone, for a learner to read top to bottom (torch, comm and the mesh).
CORES = ("tensor", "pipeline", "data", "sequence", "expert")
CORE_MAX_LINES = 350
INSTRUMENTS = ("coursekit.measure", "coursekit.comm.traffic",
               "coursekit.answers", "coursekit.grading", "coursekit.viz", "coursekit.widgets", "coursekit.bench",
               "coursekit.measure.verify", "coursekit.costmodel", "coursekit.netsim", "coursekit.experiments")


# Algorithms beside the cores that are measured from outside too (their measured subclass is in the adapter).
UNINSTRUMENTED = [f"coursekit.parallel.{dim}.core" for dim in CORES] + ["coursekit.parallel.data.zero"]


@pytest.mark.parametrize("dim", CORES)
def test_a_core_reads_in_one_sitting(dim):
    name = f"coursekit.parallel.{dim}.core"
    assert name in modules(), f"coursekit/parallel/{dim}/core.py is missing: each parallelism has its core"
    path = modules()[name]
    lines = len(path.read_text().splitlines())
    assert lines <= CORE_MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines (a core reads in one sitting: at most {CORE_MAX_LINES})"


@pytest.mark.parametrize("name", UNINSTRUMENTED)
def test_an_algorithm_is_alone_in_its_file(name):
    """Planted, seen failing: ``from ...trace import Tracer`` and ``import time`` in tensor's core; ZeRO's
    ``from ...measure.memory import PeakMemory`` back in zero.py."""
    path = modules()[name]
    instruments = [f"line {line}: {target}{f'.{what}' if what else ''}" for target, what, line in imports()[name]
                   if within(target, INSTRUMENTS)]
    tree = ast.parse(path.read_text())
    instruments += [f"line {node.lineno}: time" for node in ast.walk(tree)
                    if isinstance(node, (ast.Import, ast.ImportFrom))
                    and any(a.name.split(".")[0] == "time" for a in node.names) | (getattr(node, "module", None) == "time")]
    assert not instruments, (f"{path.relative_to(ROOT)} imports instruments (timing, tracing, counting, memory, grading, "
                             f"plots); wrap the algorithm from outside (its strategy.py or the comm layer) instead:\n  "
                             + "\n  ".join(instruments))


def test_tensor_parallelism_reads_in_under_700_lines():
    """README's reading path: the core, the collectives it calls, the mesh (picotron's tensor_parallel/ with its
    process-group manager is about as long)."""
    path = [PACKAGE / "parallel" / "tensor" / "core.py", PACKAGE / "comm" / "torch_collectives.py",
            PACKAGE / "comm" / "mesh.py"]
    lines = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in path}
    assert sum(lines.values()) < 700, f"the reading path of tensor parallelism grew to {sum(lines.values())} lines: {lines}"
    assert all(name in (ROOT / "README.md").read_text() for name in lines), "README states the reading path"


# The course transformer is written once (issue 57): Block.forward and Transformer.forward in coursekit/models.py.
# A parallelism is a plan that replaces the block's parts (coursekit/parallel/plan.py), never a second forward.


def _calls(function: ast.AST) -> set[str]:
    return {node.func.attr for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}


def _loops_over_blocks(function: ast.AST) -> bool:
    return any(isinstance(node, ast.For) and any(isinstance(a, ast.Attribute) and a.attr == "blocks"
                                                 for a in ast.walk(node.iter))
               for node in ast.walk(function))


def model_forwards() -> dict[str, str]:
    """``{"module:Class.function": "file:line"}`` for every function of the package that runs a block (calls both
    norms, or attention and the MLP) or a transformer (loops over ``.blocks`` and calls the embedding or head)."""
    found = {}
    for module, path in modules().items():
        tree = ast.parse(path.read_text())
        for owner in ast.walk(tree):
            body = getattr(owner, "body", None)
            for function in body if isinstance(body, list) else []:
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                calls = _calls(function)
                block = {"ln1", "ln2"} <= calls or bool({"attn", "attention", "_attention"} & calls
                                                        and {"fc", "out", "mlp", "moe", "feed_forward"} & calls)
                transformer = _loops_over_blocks(function) and bool({"tok_emb", "pos_emb", "head"} & calls)
                if block or transformer:
                    where = f"{owner.name}.{function.name}" if isinstance(owner, ast.ClassDef) else function.name
                    found[f"{module}:{where}"] = f"{path.relative_to(ROOT)}:{function.lineno}"
    return found


def test_the_course_transformer_is_written_once():
    """Planted, seen failing: ``ParallelBlock`` and ``TensorParallelTransformer`` back as classes with their own
    forwards in tensor/strategy.py (both named, with file and line); ``RecomputedBlock.layer`` renamed (the new name
    named); SequenceTensorParallelBlock and SequenceTensorParallelTransformer back as classes with their own
    forwards in sequence/tensor.py (both named)."""
    found = model_forwards()
    assert {"coursekit.models:Block.forward", "coursekit.models:Transformer.forward"} <= set(found), (
        f"the walk no longer recognises the one model's forwards; it found {sorted(found)}")
    second = [f"{where}: {name}" for name, where in sorted(found.items())
              if not name.startswith("coursekit.models:")]
    assert not second, ("a second forward of the course block or transformer; write the parallelism as a plan that "
                        "replaces the parts of coursekit.models.Block (coursekit/parallel/plan.py):\n  "
                        + "\n  ".join(second))
