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

f and g alone (:func:`operator_mistake`) are told apart by what came out: f's output equal to the
group's sum (it all-reduced in forward), f's input gradient equal to this rank's own (it did not sum it), g's output
equal to this rank's own input (no sum), g's input gradient t times the output's (it all-reduced a gradient every
rank already holds whole).
"""

from __future__ import annotations

__all__ = ["TOL", "count", "as_set", "wrong_group", "world_shard", "operator_mistake", "column_mistake",
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


#: per operator: (the output's right value, said when wrong; its backward's) -- and for each pass the recorded
#: difference that names the usual mistake, with what it is told
_OPERATORS = {
    "f": (("output is the sum", F_SUMS_FORWARD, "its input", "f is identity in forward"),
          ("input grad is its own", F_OWN_GRADIENT, "the sum of the group's gradients", "")),
    "g": (("output is its own", G_OWN_INPUT, "the sum of the group's inputs", ""),
          ("input grad t times", G_SUMS_BACKWARD, "its output's gradient", "g is identity in backward")),
}


def operator_mistake(name: str, r: dict) -> str | None:
    """f or g alone, wrong: the all-reduce in the wrong pass, or missing, named; both at once: f and g swapped."""
    forward, backward = _OPERATORS[name]
    for key, (named_by, named, right, rule), other in (("output", forward, backward),
                                                        ("input grad", backward, None)):
        if r[key] < TOL:
            continue
        if r[named_by] < TOL:
            swapped = other is not None and r[other[0]] < TOL
            return f"{SWAPPED}: {named}" if swapped else named
        return f"{name}'s {key.replace('input grad', 'input gradient')} differs from {right} by {r[key]:.3g}" \
            + (f": {rule}" if rule else "")
    return None
