"""The checkpoint directory, before and around the steps: one verdict for all ranks, nothing of another run lost.

:mod:`coursekit.capstone.checkpoint` saves and loads; this module answers what must hold for that to be safe:

* **Every rank reaches the verdict before any leaves** (:func:`agree`). A rank that refused on its own and
  exited left its peers in a collective or still building a group with it ("Gloo connectFullMesh failed ...
  Connection closed by peer", a traceback, in a fresh clone's ``make test`` under load). So each check yields
  a verdict (None or the sentence) on every rank, and one ``all_gather_object`` over the default group --
  after every group is built -- agrees on it: all ranks raise the same :class:`CheckpointError`, or none.
  The same for the checks of the directory (:func:`directory_problem`) and for a save that fails.
* **Nothing is deleted that this run did not write.** A ``.tmp`` a killed job left, or a step directory
  without its marker, is renamed aside (``step-000004.incomplete-<time>``) when this run saves that step --
  never removed: a file put there survives. A fresh run (no ``--resume``) refuses a directory holding another
  run's checkpoints, which would mix two runs in one directory (and a later ``--resume`` would take the other
  run's newest); ``--overwrite`` moves them aside (``.overwritten-<time>``) first. Each fresh run gets an id
  (``meta.json``'s ``"run"``), kept on resume.
* **The directory is checked before the first step** (:func:`directory_problem`), not after the training
  is done: a file in its place (``NotADirectoryError`` at the first save, before), a directory this rank
  cannot write, less free room than one checkpoint of this model takes (:func:`room_needed`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["CheckpointError", "agree", "new_run_id", "room_needed", "directory_problem", "others", "listing",
           "set_aside", "first_line", "prepare", "MARGIN", "PER_TENSOR"]

STEP = re.compile(r"step-(\d{6})$")  # a complete checkpoint's name (when it has its markers)
#: One checkpoint, over its values (parameters and optimizer state in fp32), and DCP's bytes per parameter tensor
#: (its index entry and the headers of its three pieces). Measured with dp2: 1 layer of d_model 16 (3,648
#: parameters, 15 tensors) 167 kB, the default 4 of 64 (202,368; 48) 2.83 MB, 8 of 128 (1.59 M; 92) 19.8 MB:
#: 8.2-8.4 kB per tensor beyond the values. The estimate is 10-20 % above each.
MARGIN, PER_TENSOR = 1.1, 10_000


class CheckpointError(RuntimeError):
    """A checkpoint, or a checkpoint directory, this run cannot use: the message is one sentence, naming it and
    what to do; every rank raises the same (:func:`agree`)."""


def agree(verdict: str | None) -> None:
    """Every rank's verdict (None, or the sentence of what is wrong), agreed in one collective; every rank calls it.

    The default group's ``all_gather_object``: no rank returns before every rank has given its verdict, so none
    leaves while a peer is still building a group or inside a collective with it. If any rank has a sentence,
    every rank raises :class:`CheckpointError` with the first one, in rank order: the same text everywhere.
    """
    verdicts: list = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, verdict)
    first = next((v for v in verdicts if v), None)
    if first is not None:
        raise CheckpointError(first)


def new_run_id() -> str:
    """A fresh run's id (``meta.json``'s ``"run"``), made on rank 0 and the same on every rank; every rank calls it."""
    made = [os.urandom(6).hex() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(made, src=0)
    return made[0]


def _size(count: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:,.0f} {unit}" if unit == "bytes" else f"{count:,.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def room_needed(shards, optimizer: torch.optim.Optimizer, dmesh: DeviceMesh) -> tuple[int, int]:
    """``(bytes, parameters)``: about what one checkpoint of the whole model takes; every rank calls it.

    The whole model's parameters (each rank's, tensor-parallel ones times tp, gathered over the stages) in fp32,
    and as many again for each optimizer state (Adam's two moments; SGD's momentum), times :data:`MARGIN`, and
    :data:`PER_TENSOR` for each parameter tensor.
    """
    tp = dmesh["tp"].size() if "tp" in (dmesh.mesh_dim_names or ()) else 1
    mine = {name: param.numel() * (tp if dim is not None else 1) for name, param, dim in shards}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    numel = {name: n for part in gathered for name, n in part.items()}
    parameters = sum(numel.values())
    if isinstance(optimizer, torch.optim.Adam):
        states = 3 if optimizer.defaults.get("amsgrad") else 2
    else:
        states = 1 if optimizer.defaults.get("momentum") else 0
    return int(parameters * 4 * (1 + states) * MARGIN) + PER_TENSOR * len(numel), parameters


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and not path.is_symlink() and path != path.parent:
        path = path.parent
    return path


def directory_problem(directory, needed: tuple[int, int]) -> str | None:
    """What stops ``directory`` from holding one checkpoint of ``needed`` (:func:`room_needed`), or None.

    Said before the first step, not after the training is done: a file in its place, a directory this rank
    cannot write (tried with an unnamed temporary file: ``os.access`` says yes to root on a read-only
    mount), less free room than one checkpoint takes. A directory not yet there is judged by the nearest one
    above it that is, and made only once every rank agrees (:func:`agree`).
    """
    directory = Path(directory)
    there = _nearest_existing(directory.absolute())
    if not there.is_dir():
        where = f"{directory} is a file" if there == directory.absolute() else \
            f"{directory} cannot be made: {there} is a file"
        return f"--checkpoint-dir {where}, not a directory: name a directory (it is made if missing)."
    try:
        with tempfile.TemporaryFile(dir=there):
            pass
    except OSError as error:
        inside = "" if there == directory.absolute() else f", in {there}"
        return (f"--checkpoint-dir {directory} cannot be written ({first_line(error)}{inside}): make it writable "
                f"or name another directory.")
    free = shutil.disk_usage(there).free
    need, parameters = needed
    if free < need:
        return (f"--checkpoint-dir {directory} has {_size(free)} free and one checkpoint of this model takes about "
                f"{_size(need)} ({parameters:,} parameters with the optimizer's state, fp32): free room there or "
                f"name another directory.")
    return None


def others(directory) -> list[Path]:
    """The step directories in ``directory``, complete or not (``.tmp`` too): what a fresh run would mix with."""
    return sorted(p for p in Path(directory).glob("step-*") if STEP.match(p.name) or p.name.endswith(".tmp"))


def listing(paths: list[Path], most: int = 3) -> str:
    """``"step-000002, step-000004 and 3 more"``: the names of ``paths``, at most ``most`` of them, for a sentence."""
    names = [p.name for p in paths[:most]]
    return ", ".join(names) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def set_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to ``step-000004.<why>-<time>`` beside it (a ``.tmp`` too): never removed, since this run
    did not write it; a name :func:`others` and the checkpoint's ``latest`` no longer see."""
    stamp, name = time.strftime("%Y%m%d-%H%M%S"), path.name.removesuffix(".tmp")
    target, n = path.with_name(f"{name}.{why}-{stamp}"), 1
    while target.exists() or target.is_symlink():
        target, n = path.with_name(f"{name}.{why}-{stamp}-{n}"), n + 1
    os.rename(path, target)
    return target


def first_line(error: BaseException) -> str:
    """``"OSError: [Errno 30] Read-only file system: ..."``: an error's type and its first sentence, for ours."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(text) > 100 and ". " in text:  # torch's long advice after the reason ("... is corrupted. This is ...")
        text = text[:text.index(". ")]
    return f"{type(error).__name__}: {text[:160]}"


def prepare(directory, needed: tuple[int, int], resume: bool, overwrite: bool, say=lambda text: None) -> None:
    """Before the first step, on every rank: refuse what cannot go well, agreed by all; then make the directory.

    Refused: :func:`directory_problem`; ``--resume`` with ``--overwrite`` (one goes on, the other starts over);
    a fresh run in a directory holding step directories (:func:`others`) unless ``overwrite`` -- then rank 0
    renames them aside. Raises :class:`CheckpointError` on every rank, or returns on every rank.
    """
    directory = Path(directory)
    problem = directory_problem(directory, needed)
    if problem is None and resume and overwrite:
        problem = (f"--resume and --overwrite together: --resume goes on from the checkpoints in {directory}, "
                   f"--overwrite starts at step 0 and sets them aside; choose one.")
    theirs = others(directory) if directory.is_dir() and not resume else []
    if problem is None and theirs and not overwrite:
        problem = (f"{directory} holds checkpoints of another run ({listing(theirs)}): add --resume to go on from "
                   f"them, --overwrite to start at step 0 and set them aside, or name another --checkpoint-dir.")
    agree(problem)  # every rank's verdict, before any rank changes anything
    if dist.get_rank() == 0:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            moved = [set_aside(path, "overwritten") for path in theirs]
            if moved:
                say(f"--overwrite: set aside {listing(moved, most=len(moved))} in {directory} (nothing is deleted)")
        except OSError as error:
            problem = (f"--checkpoint-dir {directory} cannot be prepared ({first_line(error)}): make it writable or "
                       f"name another directory.")
    agree(problem)
