"""The equivalence harness: is a parallel run the same training as one process?

Every strategy chapter proves its code with this module. A run is a list of
*step records*, one per optimiser step, each a plain dict::

    {"output": Tensor,                   # forward output (this rank's part of the batch)
     "loss":   float,                    # loss of the *global* batch
     "grads":  {name: Tensor} or FlatShard,   # gradients the optimiser will use
     "params": {name: Tensor} or FlatShard}   # parameters after the optimiser step

:func:`record_step` builds one. The reference is recorded by
:func:`reference_run` in a single process on the global batch; each rank of
the parallel run records its own view. :func:`compare` then checks, step by
step, the output (rank outputs concatenated in rank order), the loss, every
gradient and every parameter, and reports the **first** divergence: which
step, which tensor, which rank, where, by how much.

Sharded tensors are reassembled before comparison: a rank that holds only a
slice of the flattened parameters (ZeRO) records a :class:`FlatShard` (or a
list of them, one per bucket, when it holds several slices), and the harness
concatenates the ranks' slices. A rank that holds some of the layers (model and
pipeline parallelism) records a :class:`NamedPart`: each tensor is checked on
every rank that holds it, and the output on the ranks that computed one.

    >>> report = compare(reference, per_rank)          # doctest: +SKIP
    >>> report.ok
    False
    >>> print(report.first)                            # doctest: +SKIP
    step 2, grad 'blocks.0.fc.weight', rank 1: max |diff| 3.1e-02 at (5, 7): expected 0.0123, got 0.0432 ...

Tolerances depend on the dtype (:data:`TOLERANCES`): a sum over ranks is a
different order of additions than a sum over one batch, so float32 results
agree to rounding, not bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

__all__ = ["FlatShard", "NamedPart", "Divergence", "Report", "TOLERANCES", "record_step", "reference_run", "compare",
           "assert_equivalent", "reassemble"]

# (rtol, atol): |got - expected| <= atol * scale + rtol * |expected|, where scale
# is max(1, max |expected|) of the tensor (so atol is relative to its magnitude).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-11),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (2e-2, 1e-2),
    torch.float16: (2e-3, 1e-3),
}


@dataclass
class FlatShard:
    """This rank's slice ``[start, start + len(data))`` of the parameters flattened in ``layout`` order.

    ``layout`` lists ``(name, shape)`` of every flattened parameter, in order;
    every rank of one run has the same layout. ``replicated`` holds tensors
    every rank keeps whole (a frozen parameter); each rank's copy is checked.
    """

    layout: list[tuple[str, tuple[int, ...]]]
    start: int
    data: torch.Tensor
    replicated: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. frozen parameters, not sharded


@dataclass
class NamedPart:
    """The named tensors this rank holds when each rank holds *some* of the model (model and pipeline
    parallelism: the layers of its stages).

    Every tensor of the reference must be held by at least one rank; one held by several (the tied
    embedding of the first and the last stage) is checked on each. Only ranks that computed an output
    (the last stage) record one; the others record ``None``.
    """

    tensors: dict[str, torch.Tensor]


def reassemble(shards: list[FlatShard]) -> dict[str, torch.Tensor]:
    """Concatenate the ranks' slices and cut the flat vector back into named tensors.

    Raises ``ValueError`` if the slices leave a gap, overlap, or disagree on the layout.
    """
    shards = sorted(shards, key=lambda s: s.start)
    layout = shards[0].layout
    total = sum(math.prod(shape) for _, shape in layout)
    position = 0
    for shard in shards:
        if shard.layout != layout:
            raise ValueError("ranks recorded different layouts of the flat parameters.")
        if shard.start != position:
            raise ValueError(f"flat shards do not tile the parameters: expected a slice starting at {position}, "
                             f"got one starting at {shard.start}.")
        position += shard.data.numel()
    if position != total:
        raise ValueError(f"flat shards cover {position} of {total} elements.")
    flat = torch.cat([s.data.reshape(-1) for s in shards])
    out, offset = {}, 0
    for name, shape in layout:
        n = math.prod(shape)
        out[name] = flat[offset:offset + n].view(shape)
        offset += n
    return out


def _owner(shards: list[FlatShard], layout, name: str, flat_index: int) -> int:
    """Position in ``shards`` of the shard that holds element ``flat_index`` of tensor ``name`` (-1: none)."""
    offset = 0
    for n, shape in layout:
        if n == name:
            break
        offset += math.prod(shape)
    absolute = offset + flat_index
    for position, shard in enumerate(shards):
        if shard.start <= absolute < shard.start + shard.data.numel():
            return position
    return -1


def record_step(output: torch.Tensor | None, loss: float | torch.Tensor, grads: Any, params: Any) -> dict:
    """One step record (see the module docstring). Tensors are detached and cloned.

    ``grads``/``params`` may be a module (its named parameters / their ``.grad``),
    a ``{name: tensor}`` dict, a :class:`FlatShard` or a list of them, or a :class:`NamedPart`.
    """
    def as_record(value, attribute):
        if isinstance(value, list):  # several slices of the flat parameters (ZeRO with buckets)
            return [as_record(shard, attribute) for shard in value]
        if isinstance(value, NamedPart):
            return NamedPart({name: t.detach().clone() for name, t in value.tensors.items()})
        if isinstance(value, FlatShard):
            return FlatShard(value.layout, value.start, value.data.detach().clone(),
                             {k: v.detach().clone() for k, v in value.replicated.items()})
        if isinstance(value, torch.nn.Module):
            items = [(name, getattr(p, attribute)) for name, p in value.named_parameters()]
            return {name: t.detach().clone() for name, t in items if t is not None}
        return {name: t.detach().clone() for name, t in value.items() if t is not None}

    return {"output": None if output is None else output.detach().clone(),
            "loss": float(loss.detach() if isinstance(loss, torch.Tensor) else loss),
            "grads": as_record(grads, "grad"),
            "params": as_record(params, "data")}


def reference_run(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[dict]:
    """Train ``model`` in one process on each global batch; return one record per step.

        >>> model = tiny_mlp(seed=0)                                      # doctest: +SKIP
        >>> ref = reference_run(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        ...                     [data.batch(s, 32) for s in range(3)], loss_fn)
    """
    records = []
    for inputs, targets in batches:
        optimizer.zero_grad(set_to_none=True)
        output = model(inputs)
        loss = loss_fn(output, targets)
        loss.backward()
        grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        records.append(record_step(output, loss, grads, model))
    return records


@dataclass
class Divergence:
    """Where a parallel run first left the reference."""

    step: int
    kind: str            # "output", "loss", "grad", "param", "missing"
    name: str            # tensor name ("" for the loss and the output)
    rank: int            # the rank whose copy (or slice) differs; -1 when not attributable
    max_abs_diff: float
    index: tuple = ()
    expected: float = float("nan")
    got: float = float("nan")
    tolerance: str = ""

    def __str__(self) -> str:
        what = f"{self.kind} {self.name!r}" if self.name else self.kind
        where = f", rank {self.rank}" if self.rank >= 0 else ""
        if self.kind == "missing":
            return f"step {self.step}, {what}{where}: {self.tolerance}"
        at = f" at {self.index}" if self.index else ""
        return (f"step {self.step}, {what}{where}: max |diff| {self.max_abs_diff:.3g}{at}: "
                f"expected {self.expected:.6g}, got {self.got:.6g} ({self.tolerance})")


@dataclass
class Report:
    """The result of :func:`compare`: ``ok``, the ``first`` divergence, and one row per check."""

    divergences: list[Divergence] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.divergences

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def __str__(self) -> str:
        checked = sum(r["tensors"] for r in self.rows)
        if self.ok:
            return f"equivalent: {len(self.rows)} checks over {checked} tensors, all within tolerance"
        return f"NOT equivalent: first divergence at {self.first} ({len(self.divergences)} divergences in all)"

    def table(self) -> str:
        """A plain-text table: one line per (step, kind) with the worst difference seen."""
        lines = [f"{'step':>4}  {'what':<7} {'tensors':>7}  {'max |diff|':>10}  ok"]
        for r in self.rows:
            lines.append(f"{r['step']:>4}  {r['kind']:<7} {r['tensors']:>7}  {r['max_abs_diff']:>10.2e}  "
                         f"{'yes' if r['ok'] else 'NO'}")
        return "\n".join(lines)


def _check(expected: torch.Tensor, got: torch.Tensor, rtol: float | None, atol: float | None):
    """Return None if close, else (max_abs_diff, index, expected_value, got_value, tolerance text)."""
    tol_r, tol_a = TOLERANCES.get(expected.dtype, TOLERANCES[torch.float32])
    rtol = tol_r if rtol is None else rtol
    atol = tol_a if atol is None else atol
    if got.shape != expected.shape:
        return (float("inf"), (), float("nan"), float("nan"),
                f"shape {tuple(got.shape)} instead of {tuple(expected.shape)}")
    e, g = expected.detach().double(), got.detach().double()
    diff = (g - e).abs()
    scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
    bad = ~(diff <= atol * scale + rtol * e.abs())  # also catches NaN
    if not bad.any():
        return None
    first = tuple(int(i) for i in torch.nonzero(bad)[0]) if e.dim() else ()
    worst = diff.nan_to_num(float("inf")).max().item()
    return (worst, first, e[first].item(), g[first].item(), f"rtol={rtol:g}, atol={atol:g}x{scale:.3g}")


def _max_diff(expected: torch.Tensor, got: torch.Tensor) -> float:
    if got.shape != expected.shape:
        return float("inf")
    if expected.numel() == 0:
        return 0.0
    return (got.detach().double() - expected.detach().double()).abs().nan_to_num(float("inf")).max().item()


def compare(reference: list[dict], ranks: list[list[dict]], rtol: float | None = None, atol: float | None = None,
            output_dim: int = 0, check_output: bool = True) -> Report:
    """Compare per-rank records of a parallel run with the single-process reference.

    Args:
        reference: records of :func:`reference_run` (one per step).
        ranks: ``ranks[r]`` is rank r's list of records (same number of steps).
        rtol, atol: override the dtype's :data:`TOLERANCES`.
        output_dim: the batch dimension along which rank outputs are concatenated.
        check_output: set False when ranks do not record outputs.

    Returns a :class:`Report`; divergences are ordered by step, then output,
    loss, gradients, parameters (in the reference's parameter order).
    """
    report = Report()
    if not ranks:
        raise ValueError("no ranks to compare: pass one list of step records per rank.")
    for r, records in enumerate(ranks):
        if len(records) != len(reference):
            raise ValueError(f"rank {r} recorded {len(records)} steps, the reference {len(reference)}.")
    for step, ref in enumerate(reference):
        here = [records[step] for records in ranks]
        if check_output and ref["output"] is not None:
            holders = list(range(len(here)))
            if isinstance(here[0]["grads"], NamedPart):  # only the stages that compute the output hold it
                holders = [r for r, rec in enumerate(here) if rec["output"] is not None] or holders
            _compare_output(report, step, ref["output"], [here[r]["output"] for r in holders], rtol, atol, output_dim,
                            holders)
        _compare_loss(report, step, ref["loss"], [rec["loss"] for rec in here], rtol, atol)
        for kind, key in (("grad", "grads"), ("param", "params")):
            _compare_tensors(report, step, kind, ref[key], [rec[key] for rec in here], rtol, atol)
    order = {"output": 0, "loss": 1, "missing": 2, "grad": 2, "param": 3}
    report.divergences.sort(key=lambda d: (d.step, order[d.kind]))
    return report


def _note(report: Report, step: int, kind: str, tensors: int, worst: float, ok: bool) -> None:
    report.rows.append({"step": step, "kind": kind, "tensors": tensors, "max_abs_diff": worst, "ok": ok})


def _compare_output(report: Report, step: int, expected: torch.Tensor, parts: list, rtol, atol,
                    output_dim: int, ranks: list[int] | None = None) -> None:
    """The forward output: the ranks' parts (of ``ranks``, default all), concatenated in rank order."""
    if any(p is None for p in parts):
        report.divergences.append(Divergence(step, "missing", "", -1, float("inf"),
                                             tolerance="a rank recorded no output"))
        _note(report, step, "output", 1, float("inf"), False)
        return
    got = torch.cat(parts, dim=output_dim)
    bad = _check(expected, got, rtol, atol)
    if bad:
        rank = -1
        if bad[1]:  # which rank's part holds the bad row
            row, acc = bad[1][output_dim], 0
            for rank, size in enumerate(p.shape[output_dim] for p in parts):
                if row < acc + size:
                    break
                acc += size
            rank = rank if ranks is None else ranks[rank]
        report.divergences.append(Divergence(step, "output", "", rank, *bad))
    _note(report, step, "output", 1, _max_diff(expected, got), bad is None)


def _compare_loss(report: Report, step: int, expected_loss: float, losses: list[float], rtol, atol) -> None:
    """Every rank must report the global batch's loss (the first wrong rank is named)."""
    expected = torch.tensor(expected_loss, dtype=torch.float64)
    worst, first_bad = 0.0, None
    for rank, loss in enumerate(losses):
        worst = max(worst, abs(loss - expected_loss))
        bad = _check(expected.float(), torch.tensor(loss, dtype=torch.float64).float(), rtol, atol)
        if bad and first_bad is None:
            first_bad = Divergence(step, "loss", "", rank, *bad)
    if first_bad:
        report.divergences.append(first_bad)
    _note(report, step, "loss", 1, worst, first_bad is None)


def _compare_tensors(report: Report, step: int, kind: str, expected_tensors: dict, records: list, rtol,
                     atol) -> None:
    """Gradients or parameters: every rank's own, or shards reassembled (:class:`FlatShard`, or lists of them)."""
    if isinstance(records[0], NamedPart):
        _compare_parts(report, step, kind, expected_tensors, records, rtol, atol)
        return
    sharded = isinstance(records[0], (FlatShard, list))
    gathered, whole = records, {}
    if sharded:
        per_rank = [rec if isinstance(rec, list) else [rec] for rec in records]
        shards = [shard for pieces in per_rank for shard in pieces]
        owners = [rank for rank, pieces in enumerate(per_rank) for _ in pieces]
        try:
            whole = reassemble(shards)
        except ValueError as error:
            report.divergences.append(Divergence(step, "missing", f"{kind}s", -1, float("inf"), tolerance=str(error)))
            _note(report, step, kind, 0, float("inf"), False)
            return
        gathered = [{**whole, **{k: v for shard in pieces for k, v in shard.replicated.items()}}
                    for pieces in per_rank]
    worst, ok = 0.0, True
    for name, expected in expected_tensors.items():
        for rank, tensors in enumerate(gathered):
            got = tensors.get(name)
            if got is None:
                ok = False
                report.divergences.append(Divergence(step, "missing", name, -1 if sharded else rank, float("inf"),
                                                     tolerance=f"{kind} of {name!r} not recorded"))
                break
            worst = max(worst, _max_diff(expected, got))
            bad = _check(expected, got, rtol, atol)
            if bad:
                ok = False
                if sharded and name in whole:
                    flat_index = 0
                    for i, size in zip(bad[1], expected.shape):
                        flat_index = flat_index * size + i
                    holder = _owner(shards, shards[0].layout, name, flat_index)
                    rank = owners[holder] if holder >= 0 else -1
                report.divergences.append(Divergence(step, kind, name, rank, *bad))
                break  # one divergence per tensor is enough
    _note(report, step, kind, len(expected_tensors), worst, ok)


def _compare_parts(report: Report, step: int, kind: str, expected_tensors: dict, records: list[NamedPart], rtol,
                   atol) -> None:
    """Each reference tensor on every rank that holds it (:class:`NamedPart`); held by none: missing."""
    worst, ok = 0.0, True
    for name, expected in expected_tensors.items():
        holders = [(rank, rec.tensors[name]) for rank, rec in enumerate(records) if name in rec.tensors]
        if not holders:
            ok = False
            report.divergences.append(Divergence(step, "missing", name, -1, float("inf"),
                                                 tolerance=f"{kind} of {name!r} held by no rank"))
        for rank, got in holders:
            worst = max(worst, _max_diff(expected, got))
            bad = _check(expected, got, rtol, atol)
            if bad:
                ok = False
                report.divergences.append(Divergence(step, kind, name, rank, *bad))
                break
    _note(report, step, kind, len(expected_tensors), worst, ok)


def assert_equivalent(reference: list[dict], ranks: list[list[dict]], **kwargs) -> Report:
    """:func:`compare`, raising ``AssertionError`` that names the first divergence."""
    report = compare(reference, ranks, **kwargs)
    if not report.ok:
        raise AssertionError(str(report))
    return report
