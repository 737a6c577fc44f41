"""Checkpoints that reshard: saved under one layout, resumed under another, by ``torch.distributed.checkpoint``.

A rank of the capstone holds plain tensors: its pipeline stage's parameters, each whole over ``dp`` and ``sp``
and, under tensor parallelism, its contiguous ``1/tp`` along one dim. :func:`state_dict` *describes* each as a
DTensor (``DTensor.from_local``) on the ``dp × sp × tp`` sub-mesh of its stage -- ``Shard(dim)`` along ``tp``,
``Replicate()`` along the others -- and DCP's planner does the rest (``torch.distributed.checkpoint.save`` /
``load``; see PyTorch's "Getting Started with Distributed Checkpoint"): each saved chunk is written once
(replicas are deduplicated), with its offset in the whole tensor; at load, every rank of the new layout asks
for the region *it* holds and DCP reads it from whichever chunks cover it. No resharding code of our own.

* **Keys are the dense model's names** (``model.blocks.0.fc.weight``), so a layout finds what another saved.
  ``qkv`` is stored as its three parts (``...qkv.weight.q``, ``.k``, ``.v``): a tensor-parallel rank holds the
  rows of *its heads* of each, which is a ``Shard(0)`` of each part, not of the stacked weight.
* **The optimizer's state** goes with its parameter: Adam's ``exp_avg`` and ``exp_avg_sq`` (SGD's momentum)
  placed as the parameter is, its ``step`` counter as a plain tensor (the same on every rank). A fresh optimizer
  has no state until its first step, so :func:`state_dict` creates it (zeros) for DCP to load into, in place.
* **Never a torn checkpoint.** :func:`save` writes ``step-000010.tmp/`` and, once every rank has finished
  (a barrier), rank 0 renames it ``step-000010/`` -- one atomic rename. A job killed while saving leaves a
  ``.tmp`` directory that :func:`latest` ignores, so the next start resumes from the last complete checkpoint
  and says what it skipped. The directory must be one every rank can reach (on a cluster: a shared filesystem).
* **A damaged checkpoint gets a sentence.** Before DCP reads anything, :func:`load` checks the newest complete
  checkpoint against this run: its ``meta.json`` and DCP's ``.metadata`` readable, every file they name there
  and long enough, every tensor this rank will ask for present with this run's shape. Each rank checks the same
  files, so all of them raise the same :class:`CheckpointError` -- one sentence naming the directory, what is
  wrong and what to do -- and none waits in a collective. A ``--resume`` never starts at step 0 over it.

The step is the data position: :class:`~coursekit.models.LanguageData` draws batch ``step`` from the seed and
the step alone, so a resumed run reads on exactly where the saved one stopped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from ..comm.mesh import Mesh

__all__ = ["CheckpointError", "device_mesh", "state_dict", "save", "load", "latest", "incomplete", "unfinished",
           "KILL_ENV"]

STEP = re.compile(r"step-(\d{6})$")
KILL_ENV = "COURSEKIT_KILL_DURING_SAVE"  # "rank:step": that rank kills itself in that save (the torn-checkpoint test)
STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")


class CheckpointError(RuntimeError):
    """A checkpoint this run cannot resume from: the message is one sentence, naming it and what to do."""


def device_mesh(mesh: Mesh, device_type: str = "cpu") -> DeviceMesh:
    """torch's ``DeviceMesh`` of the same shape and axis names as ``mesh`` (builds its groups: collective, once)."""
    return init_device_mesh(device_type, tuple(mesh.shape), mesh_dim_names=tuple(mesh.axes))


def _pieces(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The stored pieces of one parameter (or its optimizer state): ``qkv`` as q, k, v; anything else whole."""
    if name.endswith((".attn.qkv.weight", ".attn.qkv.bias")):
        return [(f"{name}.{part}", piece) for part, piece in zip("qkv", tensor.chunk(3, dim=0))]
    return [(name, tensor)]


def _ensure_state(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict:
    """The optimizer's state for ``param``, created (zeros, step 0) if it has not stepped yet."""
    state = optimizer.state[param]
    if not state:
        if isinstance(optimizer, torch.optim.Adam):
            state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))
            if optimizer.defaults.get("amsgrad"):
                state["max_exp_avg_sq"] = torch.zeros_like(param)
        elif isinstance(optimizer, torch.optim.SGD) and optimizer.defaults.get("momentum"):
            state["momentum_buffer"] = torch.zeros_like(param)
        else:
            raise TypeError(f"checkpoints know Adam's and SGD's state, not {type(optimizer).__name__}'s.")
    return state


def state_dict(shards, optimizer: torch.optim.Optimizer, dmesh: DeviceMesh) -> dict:
    """This rank's tensors as DCP sees them: ``model.<name>`` and ``optim.<name>.<state>``, DTensors on the stage's mesh.

    ``shards``: ``(dense name, parameter, dim split over tp or None)`` for each parameter this rank holds
    (:meth:`coursekit.parallel.hybrid.Hybrid.named_shards`). The DTensors share storage with the parameters
    and the optimizer state, so :func:`dcp.load <torch.distributed.checkpoint.load>` fills them in place.
    """
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.SGD)):
        raise TypeError(f"checkpoints of a {type(optimizer).__name__}: the capstone's are Adam's or SGD's "
                        f"(ZeRO's sharded optimizer state is not checkpointed in this course: use --zero 0).")
    stage_mesh = dmesh[tuple(a for a in dmesh.mesh_dim_names if a != "pp")]

    def placed(tensor: torch.Tensor, dim: int | None) -> DTensor:
        placements = [Replicate()] * (stage_mesh.ndim - 1) + [Shard(dim) if dim is not None else Replicate()]
        return DTensor.from_local(tensor, stage_mesh, placements, run_check=False)

    out = {}
    for name, param, dim in shards:
        state = _ensure_state(optimizer, param)
        for key, piece in _pieces(name, param.detach()):
            out[f"model.{key}"] = placed(piece, dim)
        for kind in STATE:
            if kind in state:
                for key, piece in _pieces(name, state[kind]):
                    out[f"optim.{key}.{kind}"] = placed(piece, dim)
        if "step" in state:
            out[f"optim.{name}.step"] = state["step"]
    return out


def _step_dir(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}"


def save(directory, step: int, shards, optimizer, dmesh: DeviceMesh, extra: dict | None = None) -> Path:
    """Save this rank's part after ``step`` steps; every rank calls it. Returns the complete checkpoint's path."""
    final = _step_dir(directory, step)
    tmp = final.with_name(final.name + ".tmp")
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a torn attempt at this step, from a killed job
        tmp.mkdir(parents=True)
    dist.barrier()
    if os.environ.get(KILL_ENV) == f"{rank}:{step}" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os.kill(os.getpid(), 9)  # SIGKILL, mid-save (the first attempt only: a job torchrun restarts runs on)
    dcp.save(state_dict(shards, optimizer, dmesh), checkpoint_id=str(tmp))
    dist.barrier()  # every rank's files are written: now, and only now, it becomes a checkpoint
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps({"step": step, **(extra or {})}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final


def latest(directory) -> tuple[int, Path] | None:
    """The last complete checkpoint in ``directory``: ``(step, path)``, or None. ``.tmp`` directories never count."""
    found = [(int(m.group(1)), p) for p in Path(directory).glob("step-*")
             if (m := STEP.match(p.name)) and (p / ".metadata").exists() and (p / "meta.json").exists()]
    return max(found) if found else None


def incomplete(directory) -> list[Path]:
    """Checkpoints a job did not finish (a ``.tmp`` directory: it was killed while saving)."""
    return sorted(Path(directory).glob("step-*.tmp"))


def unfinished(directory) -> list[Path]:
    """Step directories without the marker :func:`save` writes last (``meta.json``, or DCP's ``.metadata``):
    copied or written in part, never complete; :func:`latest` passes over them."""
    return sorted(p for p in Path(directory).glob("step-*") if STEP.match(p.name)
                  and not ((p / ".metadata").exists() and (p / "meta.json").exists()))


_WHAT_TO_DO = "delete it to resume from the checkpoint before it, or leave out --resume to start at step 0"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


def verify(path: Path, expected: dict) -> dict:
    """``path``'s ``meta.json``, after checking the checkpoint can fill ``expected`` (``{key: tensor}``, as
    :func:`state_dict` makes it); :class:`CheckpointError` with one sentence where it cannot."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} is damaged: its meta.json cannot be read ({_first_line(error)}): "
                              f"{_WHAT_TO_DO}.") from None
    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as error:  # a pickle of anything: any error says the same, it is not DCP's metadata
        raise CheckpointError(f"{path} is damaged: its .metadata is not a torch.distributed.checkpoint index "
                              f"({_first_line(error)}): {_WHAT_TO_DO}.") from None
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
    for name, needed in sorted(sizes.items()):
        file = path / name
        if not file.exists():
            raise CheckpointError(f"{path} is incomplete: {name} is missing (its .metadata names it): "
                                  f"{_WHAT_TO_DO}.")
        if file.stat().st_size < needed:
            raise CheckpointError(f"{path} is damaged: {name} holds {file.stat().st_size:,} bytes, its .metadata "
                                  f"expects {needed:,} (a truncated file): {_WHAT_TO_DO}.")
    saved = metadata.state_dict_metadata
    for key, tensor in expected.items():
        if key not in saved:
            raise CheckpointError(f"{path} was saved from another model: it has no {key}, which this run needs; "
                                  f"resume with the model it was saved from, or use another --checkpoint-dir.")
        shape = tuple(getattr(saved[key], "size", ()))
        if isinstance(tensor, torch.Tensor) and tensor.dim() and shape != tuple(tensor.shape):
            raise CheckpointError(f"{path} was saved from another model: {key} is {list(shape)} there and "
                                  f"{list(tensor.shape)} in this run; resume with the model it was saved from, or "
                                  f"use another --checkpoint-dir.")
    return meta


def load(directory, shards, optimizer, dmesh: DeviceMesh) -> tuple[int, Path, dict] | None:
    """Fill this rank's parameters and optimizer state from the last complete checkpoint; every rank calls it.

    Returns ``(step, path, meta)`` (``meta``: what :func:`save` was given as ``extra``), or None when there is no
    complete checkpoint. The layout may differ from the one that saved it. A checkpoint this run cannot read
    raises :class:`CheckpointError` on every rank (:func:`verify`).
    """
    found = latest(directory)
    if found is None:
        return None
    step, path = found
    wanted = state_dict(shards, optimizer, dmesh)
    meta = verify(path, wanted)
    try:
        dcp.load(wanted, checkpoint_id=str(path))
    except Exception as error:  # what the checks above could not see (bytes damaged inside a file): still a sentence
        raise CheckpointError(f"{path} could not be read ({_first_line(error)}): {_WHAT_TO_DO}.") from None
    return step, path, meta
