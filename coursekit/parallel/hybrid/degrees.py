"""The four degrees of a composed run -- ``pp × dp × sp × tp`` -- and what they must satisfy, checked before anything starts.

One mesh holds all four axes, outermost first as torchtitan orders them: ``pp, dp, sp, tp``. The last axis is
the innermost (its ranks are neighbours: on a cluster, the GPUs of one node), so tensor parallelism, which
all-reduces inside every layer, gets the fastest links, and the pipeline, which sends one activation per
micro-batch, the slowest.

    >>> mesh_shape(dp=2, tp=2)
    {'pp': 1, 'dp': 2, 'sp': 1, 'tp': 2}
    >>> check_degrees(mesh_shape(dp=2, tp=2), 4, n_heads=4, n_layers=2, vocab_size=16, seq_len=31)   # fits: None

:func:`check_degrees` takes the mesh's shape -- the one form a layout has from the command line to the ranks --
and says, in one sentence each, what does not fit -- the degrees against the world size, the
heads, the layers, the sequence, the batch, the schedule's micro-batches -- so a bad layout never reaches the
ranks (where it would hang or abort). It speaks the library's words (``tp = 3``, ``micro_batches``); the
command line ``coursekit train`` adds its flags (``--tp``, ``--microbatches``) to the same sentence.
"""

from __future__ import annotations

from ..pipeline.schedules import SCHEDULES, make_schedule

__all__ = ["AXES", "mesh_shape", "check_degrees"]

AXES = ("pp", "dp", "sp", "tp")  # outermost first; tp innermost (inside a node)


def mesh_shape(pp: int = 1, dp: int = 1, sp: int = 1, tp: int = 1) -> dict[str, int]:
    """The mesh ``{axis: degree}`` in :data:`AXES` order (every axis present; 1: not split)."""
    return {"pp": pp, "dp": dp, "sp": sp, "tp": tp}


def check_degrees(shape: dict[str, int], world_size: int, *, n_heads: int, n_layers: int, vocab_size: int,
                  seq_len: int, global_batch: int | None = None, micro_batches: int | None = None,
                  schedule: str = "1f1b", stages_per_rank: int = 1, zero: int = 0) -> None:
    """Raise ``ValueError`` naming the first degree of the mesh ``shape`` that does not fit, and what would.

    ``shape``: ``{axis: degree}`` over :data:`AXES` (an axis left out is 1), as :func:`mesh_shape` makes it.

    ``n_layers`` are the transformer's blocks (a pipeline cuts ``n_layers + 2`` layers: embedding, blocks,
    head); ``seq_len`` the tokens of one sample; ``global_batch`` the samples of one step. Without
    ``global_batch`` and ``micro_batches`` (a strategy being built, before the loop says them) the batch
    and the schedule's micro-batches are not checked (the pipeline checks its schedule at its first step).
    """
    unknown = set(shape) - set(AXES)
    if unknown:
        raise ValueError(f"mesh axes {sorted(unknown)}: a composed layout has the axes {list(AXES)}.")
    degrees = {axis: shape.get(axis, 1) for axis in AXES}
    pp, dp, sp, tp = degrees.values()
    for name, size in degrees.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"{name} = {size!r}: each degree is a whole number >= 1 (1: that axis is not split).")
    product = pp * dp * sp * tp
    if product != world_size:
        rest = world_size // (pp * sp * tp) if world_size % (pp * sp * tp) == 0 else 0
        raise ValueError(f"pp = {pp}, dp = {dp}, sp = {sp}, tp = {tp} multiply to {product}, but the job has "
                         f"{world_size} ranks: make the degrees multiply to {world_size}"
                         + (f" (e.g. dp = {rest} with the others as given)." if rest else "."))
    if tp > 1 and sp > 1:
        raise ValueError(f"tp = {tp} and sp = {sp} together: ring attention over tensor-parallel heads is not in "
                         f"this course (chapter 06's sequence parallelism runs on whole-model replicas). Use one of "
                         f"them, with dp and pp as you like.")
    if n_heads % tp:
        raise ValueError(f"tp = {tp} does not divide the model's {n_heads} attention heads: each rank takes whole "
                         f"heads. Use a tp that divides {n_heads}.")
    if vocab_size % tp:
        raise ValueError(f"tp = {tp} does not divide the vocabulary of {vocab_size}: use a tp that divides it.")
    stages = pp * stages_per_rank
    if stages > n_layers + 2:
        raise ValueError(f"pp = {pp} with stages_per_rank = {stages_per_rank} needs {stages} stages, but the model "
                         f"has {n_layers + 2} layers to cut (embedding, {n_layers} blocks, head): use more layers "
                         f"or a smaller pp.")
    if sp > 1 and seq_len < 2 * sp:
        raise ValueError(f"sp = {sp}: the zig-zag split gives each rank two chunks of the sequence, but a sample "
                         f"has only {seq_len} tokens; use sp at most {seq_len // 2}.")
    if global_batch is not None and micro_batches is not None and global_batch < dp * micro_batches:
        raise ValueError(f"global_batch = {global_batch} over dp = {dp} gives a slice of {global_batch // dp} "
                         f"samples, fewer than micro_batches = {micro_batches}: use a batch of at least "
                         f"{dp * micro_batches}.")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule = {schedule!r}: use one of {sorted(SCHEDULES)}.")
    if stages_per_rank > 1 and schedule != "interleaved":
        raise ValueError(f"stages_per_rank = {stages_per_rank} needs schedule = 'interleaved' (got {schedule!r}).")
    if pp > 1 and micro_batches is not None:
        make_schedule(schedule, pp, micro_batches, stages_per_rank)  # its own sentence if m does not fit
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero = {zero!r}: use 0 (none), 1, 2 or 3.")
    if zero >= 2 and (pp, sp, tp) != (1, 1, 1):
        raise ValueError(f"zero = {zero} shards the gradients{' and parameters' if zero == 3 else ''} of one whole "
                         f"model: in this course it runs on pure data parallelism (pp = sp = tp = 1). With pipeline, "
                         f"sequence or tensor parallelism use zero = 1 (the optimizer state sharded over dp).")
