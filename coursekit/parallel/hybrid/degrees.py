"""The four degrees of a composed run -- ``pp × dp × sp × tp`` -- and what they must satisfy, checked before anything starts.

One mesh holds all four axes, outermost first as torchtitan orders them: ``pp, dp, sp, tp``. The last axis is
the innermost (its ranks are neighbours: on a cluster, the GPUs of one node), so tensor parallelism, which
all-reduces inside every layer, gets the fastest links, and the pipeline, which sends one activation per
micro-batch, the slowest.

    >>> mesh_shape(dp=2, tp=2)
    {'pp': 1, 'dp': 2, 'sp': 1, 'tp': 2}
    >>> check_degrees(mesh_shape(dp=2, tp=2), 4, n_heads=4, n_layers=2, vocab_size=16, seq_len=31)   # fits: None

:func:`check_degrees` takes the mesh's shape -- the one form a layout has from the command line to the ranks --
and says, in one sentence, the first thing that does not fit: the schedule, tp with sp, ZeRO-2/3 beside other
axes, the heads, the layers, the sequence, the schedule's micro-batches, then the degrees against the world size,
then the batch. So a bad layout never reaches the ranks (where it would hang or abort). A layout's own reason
comes before the world size: ``pp = 2, zero = 3`` on 4 ranks is refused for ZeRO-3, which no rank count mends.
The sentence ends with a change that passes the same check (:func:`~.suggest.refuse` tries them), also given as
the error's ``suggestion``. It speaks the library's words (``tp = 3``, ``micro_batches``); the command line
``coursekit train`` adds its flags (``--tp``, ``--microbatches``) to the same sentence.
"""

from __future__ import annotations

from itertools import islice

from ..pipeline.schedules import SCHEDULES, make_schedule
from .suggest import Refusal, nearest, refuse

__all__ = ["AXES", "mesh_shape", "check_degrees", "layout_problem", "settings_problem"]

AXES = ("pp", "dp", "sp", "tp")  # outermost first; tp innermost (inside a node)


def mesh_shape(pp: int = 1, dp: int = 1, sp: int = 1, tp: int = 1) -> dict[str, int]:
    """The mesh ``{axis: degree}`` in :data:`AXES` order (every axis present; 1: not split)."""
    return {"pp": pp, "dp": dp, "sp": sp, "tp": tp}


def check_degrees(shape: dict[str, int], world_size: int, *, n_heads: int, n_layers: int, vocab_size: int,
                  seq_len: int, global_batch: int | None = None, micro_batches: int | None = None,
                  schedule: str = "1f1b", stages_per_rank: int = 1, zero: int = 0) -> None:
    """Raise :class:`~.suggest.LayoutError` (a ``ValueError``): the first thing of the mesh ``shape`` that does not fit.

    ``shape``: ``{axis: degree}`` over :data:`AXES` (an axis left out is 1), as :func:`mesh_shape` makes it.

    ``n_layers`` are the transformer's blocks (a pipeline cuts ``n_layers + 2`` layers: embedding, blocks,
    head); ``seq_len`` the tokens of one sample; ``global_batch`` the samples of one step. Without
    ``global_batch`` and ``micro_batches`` (a strategy being built, before the loop says them) the batch
    and the schedule's micro-batches are not checked (the pipeline checks its schedule at its first step).
    The error's ``suggestion`` (``{setting: value}``, these names) passes this check on ``world_size`` ranks.
    """
    sizes = dict(n_heads=n_heads, n_layers=n_layers, vocab_size=vocab_size, seq_len=seq_len,
                 global_batch=global_batch, micro_batches=micro_batches, schedule=schedule,
                 stages_per_rank=stages_per_rank, zero=zero)
    refusal = layout_problem(shape, world_size, **sizes)
    if refusal is not None:
        settings = _settings(shape, sizes)
        raise refuse(refusal, settings, world_size,
                     lambda change: settings_problem({**settings, **change}, world_size) is None)


def layout_problem(shape: dict[str, int], world_size: int, **sizes) -> Refusal | None:
    """The first thing that does not fit (``sizes``: :func:`check_degrees`'s keywords), or None: nothing raised."""
    unknown = set(shape) - set(AXES)
    if unknown:
        return Refusal(f"mesh axes {sorted(unknown)}: a composed layout has the axes {list(AXES)}", None)
    return settings_problem(_settings(shape, sizes), world_size)


def _settings(shape: dict[str, int], sizes: dict) -> dict:
    """One flat ``{setting: value}``: the four degrees and check_degrees's keywords, defaults filled in."""
    return {"global_batch": None, "micro_batches": None, "schedule": "1f1b", "stages_per_rank": 1, "zero": 0,
            **{axis: shape.get(axis, 1) for axis in AXES}, **sizes}


def settings_problem(s: dict, world_size: int) -> Refusal | None:
    """:func:`layout_problem` of one flat ``{setting: value}`` (the degrees and every keyword of check_degrees).

    A layout's own reasons come first, the product of the degrees against the ranks after them: no rank count
    mends a reason of its own, and its suggestion mends both at once.
    """
    refusal = _whole_numbers(s)
    if refusal:
        return refusal
    product = s["pp"] * s["dp"] * s["sp"] * s["tp"]
    for check in (_combinations, _model_split, _pipeline):
        refusal = check(s, world_size)
        if refusal:
            if product == world_size:
                return refusal
            return Refusal(f"{refusal.reason}, and make the degrees multiply to the job's {world_size} ranks",
                           refusal.fixes, refusal.example)
    if product != world_size:
        return Refusal(f"pp = {s['pp']}, dp = {s['dp']}, sp = {s['sp']}, tp = {s['tp']} multiply to {product}, but "
                       f"the job has {world_size} ranks: make the degrees multiply to {world_size}")
    return _batch(s)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _whole_numbers(s: dict) -> Refusal | None:
    """Each setting one of its kind: whole degrees, a ZeRO stage, a schedule by name."""
    for name in AXES:
        if not _whole(s[name]):
            return Refusal(f"{name} = {s[name]!r}: each degree is a whole number >= 1 (1: that axis is not split)",
                           ({name: 1},), example=False)
    for name in ("stages_per_rank", "micro_batches"):
        if s[name] is not None and not _whole(s[name]):
            return Refusal(f"{name} = {s[name]!r}: use a whole number >= 1", ({name: 1},), example=False)
    if s["zero"] not in (0, 1, 2, 3) or isinstance(s["zero"], bool):
        return Refusal(f"zero = {s['zero']!r}: use 0 (none), 1, 2 or 3", ({"zero": 0}, {"zero": 1}), example=False)
    if s["schedule"] not in SCHEDULES:
        return Refusal(f"schedule = {s['schedule']!r}: use one of {sorted(SCHEDULES)}",
                       tuple({"schedule": name} for name in ("1f1b", "gpipe", "interleaved", "zb_h1")),
                       example=False)
    return None


def _combinations(s: dict, world_size: int) -> Refusal | None:
    """Settings that this course does not run together, whatever the sizes."""
    pp, sp, tp, zero, v = s["pp"], s["sp"], s["tp"], s["zero"], s["stages_per_rank"]
    if v > 1 and s["schedule"] != "interleaved":
        return Refusal(f"stages_per_rank = {v} needs schedule = 'interleaved' (got {s['schedule']!r})",
                       ({"schedule": "interleaved"}, {"stages_per_rank": 1}))
    if tp > 1 and sp > 1:
        return Refusal(f"tp = {tp} and sp = {sp} together: ring attention over tensor-parallel heads is not in this "
                       f"course (chapter 06's sequence parallelism runs on whole-model replicas); use one of them",
                       ({"sp": 1}, {"tp": 1}))
    if zero >= 2 and (pp, sp, tp) != (1, 1, 1):
        return Refusal(f"zero = {zero} shards one whole model, so in this trainer it runs on pure data parallelism "
                       f"(pp = sp = tp = 1): with pipeline, sequence or tensor parallelism use zero = 1",
                       ({"zero": 1}, {"pp": 1, "sp": 1, "tp": 1, "dp": world_size}))
    return None


def _model_split(s: dict, world_size: int) -> Refusal | None:
    """What each degree cuts must split: heads and vocabulary by tp, layers by the stages, the sequence by sp."""
    pp, sp, tp, v = s["pp"], s["sp"], s["tp"], s["stages_per_rank"]
    n_heads, n_layers, vocab, seq_len = s["n_heads"], s["n_layers"], s["vocab_size"], s["seq_len"]
    if n_heads % tp:
        return Refusal(f"tp = {tp} does not divide the model's {n_heads} attention heads (each rank takes whole "
                       f"heads): use a tp that divides {n_heads}", nearest("tp", tp, _divisors(n_heads)))
    if vocab % tp:
        return Refusal(f"tp = {tp} does not divide the vocabulary of {vocab}: use a tp that divides it",
                       nearest("tp", tp, _divisors(vocab)))
    stages, layers = pp * v, n_layers + 2
    if stages > layers:
        blocks = f"{n_layers} block{'s' if n_layers != 1 else ''}"
        return Refusal(f"pp = {pp}{f' with stages_per_rank = {v}' if v > 1 else ''} needs {stages} stages, but the "
                       f"model has {layers} layers to cut (embedding, {blocks}, head): use more layers or fewer stages",
                       nearest("pp", pp, range(1, layers // v + 1)) + nearest("stages_per_rank", v,
                                                                                range(1, layers // pp + 1)))
    if sp > 1 and seq_len < 2 * sp:
        return Refusal(f"sp = {sp}: the zig-zag split gives each rank two chunks of the sequence, but a sample has "
                       f"only {seq_len} tokens; use sp at most {seq_len // 2}",
                       nearest("sp", sp, range(1, seq_len // 2 + 1)))
    return None


def _pipeline(s: dict, world_size: int) -> Refusal | None:
    """The schedule must run the step's micro-batches over the pipeline's ranks."""
    pp, m, v, name = s["pp"], s["micro_batches"], s["stages_per_rank"], s["schedule"]
    if pp == 1 or m is None or _schedule_runs(name, pp, m, v):
        return None
    nearby = sorted(range(1, 2 * max(m, pp) + 1), key=lambda k: (abs(k - m), -k))
    counts = list(islice((k for k in nearby if _schedule_runs(name, pp, k, v)), 3))  # building one takes time
    fixes = nearest("micro_batches", m, counts) + ({"schedule": "1f1b", "stages_per_rank": 1},)
    if m < pp:
        why = " to fill the bubble with weight gradients" if name == "zb_h1" else ""
        return Refusal(f"schedule = {name!r} needs at least pp = {pp} micro-batches a step{why}, but "
                       f"micro_batches = {m}: use micro_batches >= {pp}", fixes)
    rounds = max(1, m // pp)
    return Refusal(f"schedule = 'interleaved' runs micro_batches = {m} over pp = {pp} in max(1, {m} // {pp}) = "
                   f"{rounds} equal rounds, and {m} does not split into {rounds}: use a count that does (a multiple "
                   f"of {pp} always does)", fixes)


def _batch(s: dict) -> Refusal | None:
    """Each data-parallel replica needs a sample for each micro-batch."""
    dp, batch, m = s["dp"], s["global_batch"], s["micro_batches"]
    if batch is None or m is None or batch >= dp * m:
        return None
    fixes = ({"global_batch": dp * m},) + (({"micro_batches": batch // dp},) if batch >= dp else ())
    return Refusal(f"global_batch = {batch} over dp = {dp} gives a slice of {batch // dp} samples, fewer than "
                   f"micro_batches = {m}: use a batch of at least {dp * m}", fixes)


def _schedule_runs(name: str, pp: int, m: int, v: int) -> bool:
    try:
        make_schedule(name, pp, m, v)
    except ValueError:
        return False
    return True


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]

