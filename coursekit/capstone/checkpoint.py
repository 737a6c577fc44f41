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
  checkpoint against this run: its ``meta.json`` and DCP's ``.metadata`` readable, the model it records the
  same as this run's (``layers``, ``d_model``, ``heads``, ``vocab``, ``seq_len``, ``experts``, ``top_k``: a
  checkpoint of 4 layers never fills 2 of them, nor one of 4 heads a model of 8 at the same width -- the
  shapes alone let both through), every file it names there, long enough and with the sha256 ``meta.json``
  recorded (DCP keeps no checksum of its own: bytes damaged at the same size would otherwise load, or fail
  inside DCP), every tensor this rank will ask for present with this run's shape and none of another model.
  The sentence names the file, what is wrong, and the next older complete checkpoint to go back to. The
  layout and the precision may differ (DCP reshards; weights and Adam are fp32 under any precision): the
  log says so. A checkpoint from before ``meta.json`` recorded the model and the checksums (no
  ``"format"``) is accepted with a note that says what could not be checked: its names and shapes still are,
  and refusing it would strand the run that wrote it.
* **DCP's own errors are caught by name.** ``dcp.load`` and ``dcp.save`` gather the ranks' failures into a
  ``CheckpointException``, which derives from ``BaseException``: ``except Exception`` lets it through (four
  tracebacks for a damaged ``.distcp``). A save that fails (a full disk: ``[enforce fail ...] unexpected
  pos``; a read-only directory: ``[Errno 30]``) is one sentence too.
* **The directory** -- checked before the first step, nothing of another run deleted, every rank's verdict
  agreed before any leaves -- is :mod:`coursekit.capstone.checkpoint_dir`'s.

The step is the data position: :class:`~coursekit.models.LanguageData` draws batch ``step`` from the seed and
the step alone, so a resumed run reads on exactly where the saved one stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: `except Exception` misses it
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from ..comm.mesh import Mesh
from .checkpoint_dir import STEP, CheckpointError, agree, first_line, set_aside

__all__ = ["CheckpointError", "device_mesh", "state_dict", "save", "load", "latest", "incomplete", "unfinished",
           "verify", "KILL_ENV", "MODEL_FIELDS", "FORMAT"]

KILL_ENV = "COURSEKIT_KILL_DURING_SAVE"  # "rank:step": that rank kills itself in that save (the torn-checkpoint test)
STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")
FORMAT = 2  # meta.json's "format": 2 records the model, precision, layout, run id and each file's sha256 (1: none)
#: The settings that make the model: a checkpoint fills only a run with the same (the layout and precision may differ).
MODEL_FIELDS = ("layers", "d_model", "heads", "vocab", "seq_len", "experts", "top_k")


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


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cause(error: BaseException) -> BaseException:
    """The first rank's own error inside DCP's ``CheckpointException`` (whose text is every rank's traceback)."""
    failures = getattr(error, "failures", None) or {}
    for rank in sorted(failures):
        cause = failures[rank]
        return cause[0] if isinstance(cause, tuple) else cause
    return error


def _cannot_save(final: Path, error: BaseException) -> str:
    before = latest(final.parent)
    then = (f"then add --resume to go on from {before[1].name} (kept)" if before is not None
            else "then run again")
    return (f"{final} could not be saved ({first_line(_cause(error))}): free room in {final.parent} or make it "
            f"writable, or name another --checkpoint-dir; {then}.")


def save(directory, step: int, shards, optimizer, dmesh: DeviceMesh, extra: dict | None = None,
         say=lambda text: None) -> Path:
    """Save this rank's part after ``step`` steps; every rank calls it. Returns the complete checkpoint's path.

    ``meta.json`` gets ``extra`` (the model, precision, layout and run id :func:`load` checks), the step, the
    format and each file's sha256, hashed on rank 0 once every rank has written (DCP keeps none). A save that
    fails raises :class:`CheckpointError` on every rank (:func:`agree`); its own ``.tmp`` is removed, to give
    the room back, and the checkpoints before it are kept. ``say``: rank 0's log line (what it set aside).
    """
    final = _step_dir(directory, step)
    tmp = final.with_name(final.name + ".tmp")
    rank, made, problem = dist.get_rank(), False, None
    if rank == 0:
        try:
            for old in (tmp, final):  # a torn attempt at this step (a killed job), or a copy without its marker
                if old.exists() or old.is_symlink():
                    why = "replaced" if old == final and (old / "meta.json").exists() else "incomplete"
                    say(f"set aside {old} as {set_aside(old, why).name}: not written by this run")
            tmp.mkdir(parents=True)
            made = True
        except OSError as error:
            problem = _cannot_save(final, error)
    try:
        agree(problem)
        if os.environ.get(KILL_ENV) == f"{rank}:{step}" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            os.kill(os.getpid(), 9)  # SIGKILL, mid-save (the first attempt only: a job torchrun restarts runs on)
        try:
            dcp.save(state_dict(shards, optimizer, dmesh), checkpoint_id=str(tmp))
        except CheckpointException as error:  # any rank's failure, gathered by DCP: the same on every rank
            problem = _cannot_save(final, error)
        agree(problem)  # every rank's files are written: now, and only now, it becomes a checkpoint
        if rank == 0:
            try:
                files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
                meta = {"step": step, **(extra or {}), "format": FORMAT, "files": files}
                (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
                os.replace(tmp, final)  # final is not there: set aside above
            except OSError as error:
                problem = _cannot_save(final, error)
        agree(problem)
    except CheckpointError:
        if made:  # this run's own torn save: its room back (nothing another run wrote is in it)
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def latest(directory) -> tuple[int, Path] | None:
    """The last complete checkpoint in ``directory``: ``(step, path)``, or None. ``.tmp`` directories never count."""
    found = _complete(directory)
    return found[-1] if found else None


def _complete(directory) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in Path(directory).glob("step-*")
                  if (m := STEP.match(p.name)) and (p / ".metadata").exists() and (p / "meta.json").exists())


def incomplete(directory) -> list[Path]:
    """Checkpoints a job did not finish (a ``.tmp`` directory: it was killed while saving)."""
    return sorted(Path(directory).glob("step-*.tmp"))


def unfinished(directory) -> list[Path]:
    """Step directories without the marker :func:`save` writes last (``meta.json``, or DCP's ``.metadata``):
    copied or written in part, never complete; :func:`latest` passes over them."""
    return sorted(p for p in Path(directory).glob("step-*") if STEP.match(p.name)
                  and not ((p / ".metadata").exists() and (p / "meta.json").exists()))


def _what_to_do(path: Path) -> str:
    """Where to go from a checkpoint that cannot be read: the next older complete one, or step 0."""
    older = [p for step, p in _complete(path.parent) if p.name < path.name]
    if older:
        return (f"move it aside (mv {path} {path}.damaged) to resume from {older[-1].name}, the one before it, or "
                f"start at step 0 with --overwrite instead of --resume")
    return "there is no complete checkpoint before it: start at step 0 with --overwrite instead of --resume"


def _check_files(path: Path, metadata, recorded: dict[str, str]) -> None:
    """Every file DCP's index names there and long enough; this rank's share of ``recorded`` (every
    ``world_size``-th) with the sha256 meta.json gives it."""
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
    for name, needed in sorted(sizes.items()):
        file = path / name
        if not file.exists():
            raise CheckpointError(f"{path} is incomplete: {name} is missing (its .metadata names it): "
                                  f"{_what_to_do(path)}.")
        if file.stat().st_size < needed:
            raise CheckpointError(f"{path} is damaged: {name} holds {file.stat().st_size:,} bytes, its .metadata "
                                  f"expects {needed:,} (a truncated file): {_what_to_do(path)}.")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    for name in sorted(recorded)[rank::world]:
        file = path / name
        if not file.exists():
            raise CheckpointError(f"{path} is incomplete: {name} is missing (its meta.json names it): "
                                  f"{_what_to_do(path)}.")
        if _sha256(file) != recorded[name]:
            raise CheckpointError(f"{path} is damaged: {name} is not the file that was saved (its sha256 differs "
                                  f"from meta.json's): {_what_to_do(path)}.")


def verify(path: Path, expected: dict, model: dict | None = None, every_key: set | None = None) -> dict:
    """``path``'s ``meta.json``, after checking the checkpoint can fill ``expected`` (``{key: tensor}``, as
    :func:`state_dict` makes it) of a run whose model is ``model`` (:data:`MODEL_FIELDS`) and whose ranks
    together ask for ``every_key``; :class:`CheckpointError` with one sentence where it cannot. This rank
    hashes its share of the files (every ``world_size``-th)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} is damaged: its meta.json cannot be read ({first_line(error)}): "
                              f"{_what_to_do(path)}.") from None
    recorded = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or (meta.get("format", 1) != 1 and not isinstance(recorded, dict)):
        what = "is not an object" if not isinstance(meta, dict) else "names no files and checksums"
        raise CheckpointError(f"{path} is damaged: its meta.json {what}: {_what_to_do(path)}.")
    saved_model = meta.get("model")
    if isinstance(saved_model, dict) and model:
        for name in MODEL_FIELDS:
            if name in saved_model and name in model and saved_model[name] != model[name]:
                raise CheckpointError(f"{path} was saved with {name} = {saved_model[name]} and this run has "
                                      f"{name} = {model[name]}: resume with {name} = {saved_model[name]}, or use "
                                      f"another --checkpoint-dir.")
    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as error:  # a pickle of anything: any error says the same, it is not DCP's metadata
        raise CheckpointError(f"{path} is damaged: its .metadata is not a torch.distributed.checkpoint index "
                              f"({first_line(error)}): {_what_to_do(path)}.") from None
    _check_files(path, metadata, recorded or {})  # no checksums in an older coursekit's checkpoint
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
    extra = sorted(key for key in saved if key.startswith("model.") and every_key and key not in every_key)
    if extra:  # more layers than this run (the older checkpoints record no model: this is what shows it)
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"{path} was saved from another model: it has {extra[0]}{more}, which this run has "
                              f"not; resume with the model it was saved from, or use another --checkpoint-dir.")
    return meta


def load(directory, shards, optimizer, dmesh: DeviceMesh, model: dict | None = None
         ) -> tuple[int, Path, dict] | None:
    """Fill this rank's parameters and optimizer state from the last complete checkpoint; every rank calls it.

    Returns ``(step, path, meta)`` (``meta``: what :func:`save` was given as ``extra``), or None when there is no
    complete checkpoint. The layout may differ from the one that saved it; the model (``model``: this run's
    :data:`MODEL_FIELDS`) may not. A checkpoint this run cannot read raises :class:`CheckpointError` on every
    rank, with the same sentence, once every rank has checked it (:func:`verify`, :func:`agree`).
    """
    found = latest(directory)
    if found is None:
        return None
    step, path = found
    wanted = state_dict(shards, optimizer, dmesh)
    keys: list = [None] * dist.get_world_size()
    dist.all_gather_object(keys, sorted(key for key in wanted if key.startswith("model.")))
    meta, problem = None, None
    try:
        meta = verify(path, wanted, model, {key for part in keys for key in part})
    except CheckpointError as error:
        problem = str(error)
    agree(problem)
    try:
        dcp.load(wanted, checkpoint_id=str(path))
    except CheckpointException as error:  # what the checks above could not see, gathered by DCP on every rank
        problem = f"{path} could not be read ({first_line(_cause(error))}): {_what_to_do(path)}."
    agree(problem)
    return step, path, meta
