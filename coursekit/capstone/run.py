"""The capstone's training run: one function, any layout, the same on ``torchrun`` and in a notebook.

:func:`run` is what every rank executes. It builds the one :class:`~coursekit.comm.mesh.Mesh` of the job from the
degrees (``pp, dp, sp, tp``, tp innermost), the course transformer and its data from the seed, and hands all of
it to the one training loop (:func:`coursekit.train.train`) with the composed strategy ``"hybrid"``
(:mod:`coursekit.parallel.hybrid`) -- or, for ``--zero 2`` of a whole model, chapter 02's ``"zero2"``, and for
``--zero 3`` its per-unit ZeRO-3, ``"zero3_units"`` with every layer of a block a unit
(:func:`~coursekit.parallel.data.layer_units`: a rank holds at most two layers gathered at once); with
``experts > 0``, the transformer with MoE blocks and chapter 07's ``"expert"``, its experts spread over ``ep``
of the ``dp`` ranks (:mod:`coursekit.capstone.experts`). Rank 0 prints one line per step (loss, tokens/s) and writes the loss curve to a JSON log.

    >>> config = Config(dp=2, tp=2, steps=5)
    >>> coursekit.launch(run, config.world_size, config)[0]["losses"]       # doctest: +SKIP

Every layout trains the same model on the same global batches, so every layout's curve is the one-process
curve, to rounding (``tests/test_capstone.py`` checks it under ``torchrun``).

:func:`check` refuses what cannot run before any rank starts -- the layout, every size and number out of its range,
a log that cannot be written -- and a run whose loss diverges (:func:`diverged`) stops on every rank after the same
step; each says why in one sentence (``tests/test_capstone_refusals.py``).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist

from ..comm.mesh import Mesh
from ..models import LanguageData, loss_fn, tiny_transformer
from ..parallel.data import layer_units
from ..parallel.hybrid import Refusal, layout_problem, mesh_shape, nearest, refuse
from ..train import train
from .experts import expert_mesh, expert_problem, moe_model, one_process_moe_losses
from .limits import DIVERGED_NATS, Diverged, divergence_bound, diverged, divisors, log_problem, sizes_problem

__all__ = ["Config", "run", "check", "one_process_losses", "divergence_bound", "diverged", "Diverged",
           "DIVERGED_NATS"]


@dataclass
class Config:
    """Everything one run needs: the layout, the model, the data, the steps (the command line's options)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: int = 1
    zero: int = 0
    schedule: str = "1f1b"
    stages_per_rank: int = 1
    microbatches: int = 1
    steps: int = 20
    seed: int = 0
    batch: int = 16            # sequences per step, over all data-parallel ranks
    seq_len: int = 32          # tokens per sequence (inputs are seq_len - 1: targets are shifted by one)
    layers: int = 4
    d_model: int = 64
    heads: int = 4
    vocab: int = 16
    lr: float = 1e-3
    precision: str = "fp32"    # "bf16" or "fp16": 16-bit compute, fp32 weights, gradients and Adam
    experts: int = 0           # experts per block (0: the dense course transformer)
    top_k: int = 2             # experts per token
    ep: int = 1                # experts split over ep of the dp ranks (ep borrows from dp: no more ranks)
    aux_weight: float = 0.0    # the balance loss's weight in the training loss ("expert" strategy's option)
    bias_rate: float = 0.0     # the routers' bias nudge per step ("expert" strategy's option)
    log: str | None = None     # a JSON file for the loss curve (rank 0 writes it)
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps between checkpoints (0: only at the end, when checkpoint_dir is given)
    resume: bool = False
    overwrite: bool = False    # a fresh run may set aside (never delete) the checkpoints already in checkpoint_dir
    quiet: bool = False
    timeout: float = 300.0     # seconds a rank waits for another (coursekit.launch's, init_process_group's)
    extra: dict = field(default_factory=dict)

    @property
    def shape(self) -> dict[str, int]:
        """The mesh ``{"pp": …, "dp": …, "sp": …, "tp": …}``: the one form the layout is checked and built in."""
        return mesh_shape(self.pp, self.dp, self.sp, self.tp)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.sp * self.tp

    @property
    def layout(self) -> str:
        """``"dp2×tp2"``: the degrees above 1 (``"single"`` when all are 1), ZeRO appended; a mixture of experts
        as the cost model's ``Layout(dp=4, ep=2)`` says it, ``"dp4×ep2 E4 k2"`` (ep of the dp ranks, not more)."""
        name = "×".join(f"{a}{d}" for a, d in {**self.shape, "ep": self.ep}.items() if d > 1)
        return (name or "single") + (f" zero{self.zero}" if self.zero else "") + (
            f" {self.precision}" if self.precision != "fp32" else "") + (
            f" E{self.experts} k{self.top_k}" if self.experts else "")


def check(config: Config, world_size: int | None = None) -> None:
    """Refuse a layout that cannot run, before any rank starts (see :func:`~coursekit.parallel.hybrid.check_degrees`).

    The error is a :class:`~coursekit.parallel.hybrid.LayoutError`: its sentence names the reason and a change
    that passes this check on the same ranks; its ``suggestion`` is that change as :class:`Config` fields
    (``{"zero": 1, "dp": 2}``). Without ``world_size`` the job has as many ranks as the degrees make (the command
    line starts them), so a suggestion may change their number too.
    """
    world = world_size or config.world_size
    refusal = _problem(config, world) or log_problem(config.log)
    if refusal is not None:
        def fits(change: dict) -> bool:
            changed = replace(config, **{FIELDS.get(k, k): v for k, v in change.items()})
            return _problem(changed, world_size or changed.world_size) is None

        settings = {**config.shape, "zero": config.zero, "schedule": config.schedule,
                    "stages_per_rank": config.stages_per_rank, "micro_batches": config.microbatches,
                    "global_batch": config.batch, "d_model": config.d_model, "steps": config.steps,
                    "ep": config.ep, "experts": config.experts, "top_k": config.top_k, "precision": config.precision,
                    "aux_weight": config.aux_weight, "bias_rate": config.bias_rate,
                    "checkpoint_dir": config.checkpoint_dir, "resume": config.resume, "heads": config.heads,
                    "layers": config.layers, "vocab": config.vocab, "seq_len": config.seq_len, "lr": config.lr,
                    "seed": config.seed, "timeout": config.timeout, "log": config.log,
                    "overwrite": config.overwrite}
        raise refuse(refusal, settings, world, fits, free=world_size is None, rename=FIELDS)


#: The library's name of a setting -> its :class:`Config` field, where they differ (the sentences use the former).
FIELDS = {"micro_batches": "microbatches", "global_batch": "batch"}

#: What ``--precision`` takes: the compute dtype (the weights, gradients and Adam stay fp32).
PRECISIONS = ("fp32", "bf16", "fp16")

def _problem(config: Config, world_size: int) -> Refusal | None:
    """The first reason ``config`` cannot run on ``world_size`` ranks: the sizes and numbers of the model, data and
    run (:func:`sizes_problem`: the layout's check divides by them), the layout's, then the trainer's own."""
    refusal = sizes_problem(config)
    if refusal is not None:
        return refusal
    refusal = layout_problem(config.shape, world_size, n_heads=config.heads, n_layers=config.layers,
                             vocab_size=config.vocab, seq_len=config.seq_len - 1, global_batch=config.batch,
                             micro_batches=config.microbatches, schedule=config.schedule,
                             stages_per_rank=config.stages_per_rank, zero=config.zero)
    if refusal is not None:
        return refusal
    if config.precision not in PRECISIONS:
        return Refusal(f"precision = {config.precision!r}: use one of {', '.join(PRECISIONS)} (the dtype the model "
                       f"computes in; weights, gradients and Adam stay fp32)", ({"precision": "bf16"},))
    refusal = expert_problem(config)
    if refusal is not None:
        return refusal
    if config.d_model % config.heads:
        below = config.d_model - config.d_model % config.heads
        return Refusal(f"d_model = {config.d_model} is not a multiple of heads = {config.heads}: use a multiple "
                       f"of {config.heads}", nearest("d_model", config.d_model, (below, below + config.heads)) +
                       nearest("heads", config.heads, divisors(config.d_model)))
    features = 4 * config.d_model
    if features % config.tp:  # kept, though tp | heads | d_model implies it: the MLP's split is its own rule
        return Refusal(f"tp = {config.tp} does not divide the MLP's {features} features: use a tp that divides it",
                       nearest("tp", config.tp, [t for t in range(1, features + 1) if features % t == 0]))
    if config.checkpoint_dir and config.zero:
        return Refusal(f"checkpoint_dir with zero = {config.zero}: ZeRO's optimizer state is a flat shard of its "
                       f"own layout, which this course does not checkpoint; use zero = 0 to checkpoint",
                       ({"zero": 0},), example=False)
    if config.resume and not config.checkpoint_dir:
        return Refusal("resume = True needs checkpoint_dir (where to find the checkpoint)", None)
    if config.resume and config.overwrite:  # before launch, so that no rank starts to find it out
        return Refusal("resume = True with overwrite = True: resume goes on from the checkpoints, overwrite starts "
                       "at step 0 and sets them aside; choose one", None)
    return None


def _model(config: Config):
    if config.experts:
        return moe_model(config)
    return lambda: tiny_transformer(seed=config.seed, vocab_size=config.vocab, d_model=config.d_model,
                                    n_heads=config.heads, n_layers=config.layers, max_seq_len=config.seq_len)


def one_process_losses(config: Config) -> list[float]:
    """The curve every layout of ``config`` must reproduce: chapter 02's one-process loop on the same model and data.

    It shares no code with the composed strategy but the model and the data, so it is the reference. In bf16 or
    fp16 it is PyTorch's own recipe instead: ``torch.autocast`` around the forward and, for fp16, ``GradScaler``.
    A mixture of experts' is :func:`~coursekit.capstone.experts.one_process_moe_losses` (the same loop, or, with
    the balance loss, the batch in the ranks' slices).
    """
    if config.experts:
        return one_process_moe_losses(config, _data(config))
    if config.precision != "fp32":
        return _autocast_losses(config)
    return train(0, 1, "single", model=_model(config), data=_data(config), steps=config.steps,
                 global_batch=config.batch, lr=config.lr, seed=config.seed, record=False)["losses"]


def _autocast_losses(config: Config) -> list[float]:
    """The one-process loop of PyTorch's mixed-precision recipe: fp32 weights and Adam, the forward under
    ``torch.autocast`` in ``config.precision``, the loss on fp32 logits; fp16 scaled by ``torch.amp.GradScaler``."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[config.precision]
    model, data = _model(config)(), _data(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    losses = []
    for step in range(config.steps):
        inputs, targets = data.batch(step, config.batch)
        with torch.autocast("cpu", dtype=dtype):
            logits = model(inputs)
        loss = loss_fn(logits.float(), targets)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


def _data(config: Config) -> LanguageData:
    return LanguageData(vocab_size=config.vocab, seq_len=config.seq_len, seed=config.seed)


def run(rank: int, world_size: int, config: Config) -> dict:
    """Train ``config`` on this rank (one of ``world_size``); return the loss curve and what was measured, or
    ``{"refused": sentence}`` on every rank where ``--resume`` meets a checkpoint it cannot read, or where the loss
    diverged (:func:`diverged`: every rank stops after the same step), or (rank 0) where the log cannot be
    written."""
    check(config, world_size)
    strategy, shape, options = _strategy(config)
    mesh = Mesh(shape)
    tokens = config.batch * (config.seq_len - 1)
    say = rank == 0 and not config.quiet
    hooks = _checkpoints(config) if config.checkpoint_dir else {}
    refusal = hooks.get("refusal", ())  # () catches nothing: without checkpoints there is nothing to refuse
    last: dict = {}  # the last step whose loss was finite and below the bound, and that loss

    def on_step(step, loss, seconds, runner):
        if say:
            print(f"step {step + 1:>4}/{config.steps}  loss {loss:.4f}  {tokens / seconds:>9,.0f} tokens/s",
                  flush=True)
        # The loop's loss is the global batch's, the same number on every rank (each strategy's global_loss
        # all-reduces it, the pipeline broadcasts it from the last stage), so every rank stops after the same step,
        # with no collective left open, and before a checkpoint of the diverged weights is saved.
        sentence = diverged(config, step, loss, last.get("step"), last.get("loss"))
        if sentence:
            raise Diverged(sentence)
        last.update(step=step, loss=loss)
        if "on_step" in hooks:
            hooks["on_step"](step, loss, seconds, runner)

    if say:
        print(f"coursekit capstone: {config.layout} on {world_size} rank(s), mesh {mesh}", flush=True)
    try:
        result = train(rank, world_size, strategy, model=_model(config), data=_data(config),
                       steps=config.steps, global_batch=config.batch, micro_batches=config.microbatches, lr=config.lr,
                       seed=config.seed, mesh=mesh, record=False, on_start=hooks.get("on_start"), on_step=on_step,
                       **options)
    except (Diverged, *refusal) as refused:  # a diverged loss, a damaged checkpoint: every rank raises it at the
        return {"layout": config.layout, "refused": str(refused)}  # same point; the caller says it
    first = config.steps - len(result["losses"])
    gathered = [None] * world_size  # which node (torchrun's GROUP_RANK) and local rank each rank ran on; its experts
    here = {"node": int(os.environ.get("GROUP_RANK", 0)), "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
            "agent_pid": os.getppid()}  # under torchrun, the agent that started this rank
    dist.all_gather_object(gathered, (here, result.get("experts_here")))
    placement = [where for where, _ in gathered]
    times = result["step_times"][1:] or result["step_times"]  # the first step also builds shapes and buffers
    summary = {"layout": config.layout, "world_size": world_size, "config": asdict(config), "first_step": first,
               "losses": result["losses"], "step_times": result["step_times"],
               "tokens_per_s": tokens / statistics.median(times) if times else None, "peak_memory": result["peak_memory"],
               "compute_dtype": result.get("compute_dtype"),  # what the strategy's forwards ran in
               "placement": placement, "tp_groups": _groups(mesh, "tp", world_size)}
    if config.experts:  # what the "expert" strategy built: each rank's experts per layer, the ep groups
        summary.update(experts_here=[experts for _, experts in gathered], ep_groups=mesh.all_groups("ep"))
    if rank == 0 and config.log:
        try:
            _write(Path(config.log), json.dumps(summary, indent=1))
        except OSError as error:  # checked before the first step (log_problem); the disk may still fill, or change
            return {**summary, "refused": f"log = {config.log!r} could not be written ({error.strerror or error}) "
                                          f"after the last step; name a file in a folder this job can write to"}
    return summary


def _write(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: written beside it, then put in its place (a file there before
    stays as it was if the write fails)."""
    path = path.resolve()  # a link is followed, as opening it would
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, part = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(part, path)
    except BaseException:
        os.unlink(part)
        raise


def _strategy(config: Config) -> tuple[str, dict[str, int], dict]:
    """The strategy ``config`` trains with, its mesh's shape and its options."""
    if config.experts:
        return "expert", expert_mesh(config), {"ep": config.ep, "aux_weight": config.aux_weight,
                                               "bias_rate": config.bias_rate}
    if config.zero >= 2:  # ZeRO-2/3 of a whole model: chapter 02's, which keeps a 16-bit copy and an fp32 master
        options = {"units": layer_units} if config.zero == 3 else {}
    else:  # the composed strategy, which autocasts
        options = {"zero": config.zero, "schedule": config.schedule, "stages_per_rank": config.stages_per_rank}
    if config.precision != "fp32":
        options["precision"] = config.precision
    name = {2: "zero2", 3: "zero3_units"}.get(config.zero, "hybrid")
    return name, config.shape, options


def _groups(mesh: Mesh, axis: str, world_size: int) -> list[list[int]]:
    """Every group along ``axis``; each rank alone where the mesh has no such axis."""
    return mesh.all_groups(axis) if axis in mesh.axes else [[r] for r in range(world_size)]


def _checkpoints(config: Config) -> dict:
    """The loop's ``on_start``/``on_step`` for ``--checkpoint-dir`` (:mod:`coursekit.capstone.checkpoint`).

    Before the first step, on every rank and agreed by all once every group is built
    (:func:`~coursekit.capstone.checkpoint_dir.prepare`): the directory can hold a checkpoint of this model, and
    a fresh run finds no other run's there; a ``--resume`` then checks the newest against this model. A refusal is
    a :class:`~coursekit.capstone.checkpoint.CheckpointError` on every rank: :func:`run` returns its sentence.

    A ``--resume`` with nothing left to train (the checkpoint at or past ``--steps``) trains nothing and says so
    on rank 0, even with ``--quiet``. It is no error (exit status 0): the job is where it was asked to be, and a
    finished job started again -- a scheduler's retry, ``torchrun --max-restarts``, its command run twice --
    must not turn into a failure.
    """
    from . import checkpoint, checkpoint_dir

    every, held = config.checkpoint_every, {}
    rank0 = dist.get_rank() == 0
    say = (lambda text: print(text, flush=True)) if rank0 and not config.quiet else (lambda text: None)
    model = {name: getattr(config, name) for name in checkpoint.MODEL_FIELDS}

    def on_start(runner) -> int:
        held["mesh"] = checkpoint.device_mesh(runner.mesh)  # torch's DeviceMesh of the same axes: built once
        needed = checkpoint_dir.room_needed(runner.named_shards(), runner.optimizer, held["mesh"])
        checkpoint_dir.prepare(config.checkpoint_dir, needed, config.resume, config.overwrite, say)
        held["run"] = checkpoint_dir.new_run_id()  # a fresh run's; a resumed one keeps its checkpoint's
        if not config.resume:
            return 0
        for torn in checkpoint.incomplete(config.checkpoint_dir):
            say(f"ignoring {torn}: incomplete (the job stopped while saving it)")
        for part in checkpoint.unfinished(config.checkpoint_dir):
            say(f"ignoring {part}: not a complete checkpoint (no .metadata or meta.json)")
        found = checkpoint.load(config.checkpoint_dir, runner.named_shards(), runner.optimizer, held["mesh"], model)
        if found is None:
            say(f"no complete checkpoint in {config.checkpoint_dir}: starting at step 0")
            return 0
        step, path, meta = found
        held["run"] = meta.get("run", held["run"])
        say(f"resuming from {path} (saved under {meta.get('layout', '?')} after {step} steps; now {config.layout})"
            + "".join(f"; {note}" for note in _resume_notes(meta, config)))
        if step >= config.steps and rank0:
            print(f"{path} is already at step {step} of --steps {config.steps}: nothing to train; raise --steps to "
                  f"go on.", flush=True)
        return step

    def on_step(step, loss, seconds, runner) -> None:
        done = step + 1
        if done == config.steps or (every and done % every == 0):
            path = checkpoint.save(config.checkpoint_dir, done, runner.named_shards(), runner.optimizer, held["mesh"],
                                   extra={"layout": replace(config, precision="fp32").layout, "loss": loss, "run": held["run"], "model": model,
                                          "precision": config.precision, "seed": config.seed}, say=say)
            say(f"saved {path}")

    return {"on_start": on_start, "on_step": on_step, "refusal": (checkpoint.CheckpointError,)}


def _resume_notes(meta: dict, config: Config) -> list[str]:
    """What the log says of a checkpoint resumed under other settings than it was saved with (all allowed)."""
    notes = []
    if "format" not in meta:
        notes.append("it records neither its model nor its files' checksums (an older coursekit saved it): only "
                     "its tensors' names and shapes were checked")
    then, now = meta.get("layout"), replace(config, precision="fp32").layout  # the layout alone, as save records it
    if then is not None and then.replace(" bf16", "").replace(" fp16", "") != now:
        notes.append(f"the layout differs, {then} then and {now} now: DCP reshards it")
    if meta.get("precision", config.precision) != config.precision:
        notes.append(f"the precision differs, {meta['precision']} then and {config.precision} now: the weights "
                     f"and Adam's state are fp32 under both")
    return notes
