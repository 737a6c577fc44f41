"""The typical mistakes of exercise 05, named from what was run, not only from how far the numbers are off.

:mod:`.tensor_parallel` asks here once a layer's numbers are wrong (or its collectives ran over the
wrong ranks). Each mistake is told apart by what :mod:`.tensor_parallel_cases` recorded on the rank:

* **a layer that ignores ``group=``**: a collective ran over other ranks than the layer's group
  (every :class:`~.tensor_tools.Call` carries its group's global ranks), or the weight has the shape of
  a split over the whole world instead of over the group;
* **f and g swapped**: the all-reduce sits in the wrong pass — a column-parallel layer that all-reduces in
  forward and not in backward, a row-parallel one that all-reduces in backward and not in forward, or in
  the MLP the forward's all-reduce issued by ``fc`` (the grader runs each layer's forward in its own phase);
* **g left out**: no all-reduce in forward, and the row-parallel output equals this rank's partial sum;
* **the bias on every rank**: the row-parallel output is off by exactly (t − 1) × the bias;
* **f without its backward**: no all-reduce in backward, and the input's gradient is this shard's part.

f and g alone (:func:`f_mistake`, :func:`g_mistake`) are told apart by what came out: f's output equal to the
group's sum (it all-reduced in forward), f's input gradient equal to this rank's own (it did not sum it), g's output
equal to this rank's own input (no sum), g's input gradient t times the output's (it all-reduced a gradient every
rank already holds whole).
"""

from __future__ import annotations

__all__ = ["TOL", "count", "as_set", "wrong_group", "world_shard", "f_mistake", "g_mistake", "column_mistake",
           "row_mistake", "mlp_mistake", "F_NO_BACKWARD", "BIAS_EVERY_RANK", "SWAPPED"]

TOL = 1e-4

SWAPPED = "f and g are swapped"
F_NO_BACKWARD = ("the input gradient on each rank is only its own shard's part (grad_Y_r · W_r): f, before the "
                 "column-parallel layer, must all-reduce the input's gradient in backward (identity forward, "
                 "all-reduce backward) — every rank read the whole input, so every rank's part must be summed")
BIAS_EVERY_RANK = ("the output is off by (t − 1) × the bias, t the ranks of the layer's group: every rank added the bias (before the sum, or without "
                   "one), so the sum holds it t times. Add it after g's all-reduce, on every rank: the output then "
                   "holds it once, and every rank's copy of the bias gets its gradient")
COLUMN_SWAPPED = (f"{SWAPPED}: before a column-parallel layer comes f — identity in forward, all-reduce of the "
                  "input's gradient in backward. Yours all-reduces in forward (the input, which every rank already "
                  "holds whole: it comes out t times, once per rank of the group) and not in backward")
ROW_SWAPPED = (f"{SWAPPED}: after a row-parallel layer comes g — all-reduce of the partial outputs in forward, "
               "identity in backward. Yours is identity in forward (each rank returns only its own partial sum) and "
               "all-reduces in backward")
ROW_NO_REDUCE = ("the output on each rank is only this rank's partial sum (x_r · W_rᵀ + b): g, after the "
                 "row-parallel layer's product, must all-reduce the partial outputs in forward (identity in "
                 "backward), so that every rank holds the whole output; add the bias once, after the sum")
MLP_SWAPPED = (f"{SWAPPED}: the forward's all-reduce ran in fc, the column-parallel layer, where f is identity, and "
               "none in out, the row-parallel layer, where g must sum the partial outputs (f's all-reduce belongs "
               "in backward, on the input's gradient)")
MLP_NO_REDUCE = ("no all-reduce in forward: out, the row-parallel layer, returned each rank's partial sum; g's "
                 "all-reduce must sum the partial outputs in forward")


def count(calls, op: str, phase: str, layer: str | None = None) -> int:
    """How many ``op`` calls were made in ``phase`` (and in ``layer``, if given)."""
    return sum(1 for c in calls if c.op == op and c.phase == phase and layer in (None, c.layer))


def as_set(ranks) -> str:
    """``{0, 1}``: ranks as a learner reads a group."""
    return "{" + ", ".join(map(str, ranks)) + "}"


def _span(ranks, world) -> str:
    return f"the whole world (ranks {world[0]}–{world[-1]})" if tuple(ranks) == tuple(world) else f"ranks {as_set(ranks)}"


def world_shard(r: dict) -> str | None:
    """Said when ``self.weight`` has the shape of a split over the whole world, not over the layer's group."""
    piece = "rows" if "rows" in r else "columns"
    if "weight shape" not in r or r["weight shape"] == r.get("expected weight"):
        return None
    (start, stop), (w_start, w_stop) = r[piece], r[f"world {piece}"]
    world_shape = list(r["expected weight"])
    world_shape[0 if piece == "rows" else 1] = w_stop - w_start
    if r["weight shape"] != tuple(world_shape):
        return None
    return (f"self.weight holds {piece} [{w_start}, {w_stop}) of a split over {_span(r['world ranks'], r['world ranks'])}, "
            f"not {piece} [{start}, {stop}) of the layer's group {as_set(r['group ranks'])}: pass group= to "
            "shard_range")


def wrong_group(r: dict) -> str | None:
    """Said when a collective ran over other ranks than the layer's group: the layer ignored ``group=``."""
    for call in r["calls"]:
        if tuple(call.ranks) != tuple(r["group ranks"]):
            told = (f"the {call.op.replace('_', '-')} ran over {_span(call.ranks, r['world ranks'])}, not over the "
                    f"layer's group {as_set(r['group ranks'])}: pass group= to every collective")
            shard = world_shard(r)
            return told + (f"; and {shard}" if shard else "")
    return None


def column_mistake(r: dict) -> str | None:
    """A column-parallel layer's wrong output or input gradient, named: f and g swapped, or f without backward."""
    forward, backward = count(r["calls"], "all_reduce", "forward"), count(r["calls"], "all_reduce", "backward")
    if forward and not backward:
        return COLUMN_SWAPPED
    if r["output"] < TOL and r["input grad is the shard's part"] < TOL:
        return F_NO_BACKWARD
    return None


def row_mistake(r: dict) -> str | None:
    """A row-parallel layer's wrong output, named: the bias on every rank, f and g swapped, or g left out."""
    forward, backward = count(r["calls"], "all_reduce", "forward"), count(r["calls"], "all_reduce", "backward")
    if r["bias t times"] < TOL:
        return BIAS_EVERY_RANK
    if not forward and backward:
        return ROW_SWAPPED
    if not forward and r["one rank's partial sum"] < TOL:
        return ROW_NO_REDUCE
    return None


def mlp_mistake(r: dict) -> str | None:
    """The MLP's wrong output or input gradient, named by which layer all-reduced in which pass."""
    in_fc, in_out = (count(r["calls"], "all_reduce", "forward", layer) for layer in ("fc", "out"))
    if not r["output"] < TOL:
        if in_fc and not in_out:
            return MLP_SWAPPED
        if not in_fc and not in_out:
            return MLP_NO_REDUCE
        if r["bias t times"] < TOL:
            return f"out, the row-parallel layer: {BIAS_EVERY_RANK}"
    elif (not r["input grad"] < TOL and r["input grad is the shard's part"] < TOL
          and not count(r["calls"], "all_reduce", "backward")):
        return f"fc, the column-parallel layer: {F_NO_BACKWARD}"
    return None


F_SUMS_FORWARD = ("f's forward all-reduces the input: f is identity in forward (every rank already holds the whole "
                  "input, so the sum holds it t times, t the ranks of the group); its all-reduce belongs in backward")
F_OWN_GRADIENT = ("f's backward returns this rank's gradient as it came: f must sum the input's gradient over the "
                  "group (all-reduce) in backward, since each rank's holds only the part its own shard computed")
G_OWN_INPUT = ("g's forward returns this rank's own tensor: g must sum the partial results over the group "
               "(all-reduce) in forward")
G_SUMS_BACKWARD = ("g's backward all-reduces the gradient, which every rank already holds whole (the output after "
                   "g is the same on every rank): it comes out t times, t the ranks of the group; g is identity in "
                   "backward")


def f_mistake(r: dict) -> str | None:
    """f alone, wrong: its all-reduce in forward (f and g swapped when backward passes through), or none in backward."""
    if not r["output"] < TOL:
        if r["output is the sum"] < TOL:
            both = r["input grad is its own"] < TOL
            return f"{SWAPPED}: {F_SUMS_FORWARD}" if both else F_SUMS_FORWARD
        return f"f's output differs from its input by {r['output']:.3g}: f is identity in forward"
    if not r["input grad"] < TOL:
        if r["input grad is its own"] < TOL:
            return F_OWN_GRADIENT
        return f"f's input gradient differs from the sum of the group's gradients by {r['input grad']:.3g}"
    return None


def g_mistake(r: dict) -> str | None:
    """g alone, wrong: no sum in forward (f and g swapped when backward sums), or an all-reduce in backward."""
    if not r["output"] < TOL:
        if r["output is its own"] < TOL:
            both = r["input grad t times"] < TOL
            return f"{SWAPPED}: {G_OWN_INPUT}, and its backward is identity" if both else G_OWN_INPUT
        return f"g's output differs from the sum of the group's inputs by {r['output']:.3g}"
    if not r["input grad"] < TOL:
        if r["input grad t times"] < TOL:
            return G_SUMS_BACKWARD
        return f"g's input gradient differs from its output's gradient by {r['input grad']:.3g}: g is identity in backward"
    return None
