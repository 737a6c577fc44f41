"""What runs on each rank in exercise 03: the learner's two-stage step training the course MLP, watched.

:func:`two_stage_rank` trains one case with ``two_stage_step`` on both ranks of a pipeline (the world's two, or the
pp group of a 2 × 2 mesh) and returns, per rank, the step records (:mod:`coursekit.measure.verify`), what each step
sent, and what the last stage returned against the batch's loss its outputs give. Each message goes through a
:class:`StageWatch` (:mod:`.watch`), which refuses one to the rank itself, to a rank outside the pipeline or one that
is not a tensor, so that the feedback names it instead of a deadlock. An error autograd raises for the usual
mistakes is re-raised in the exercise's words. When only the forward is checked, rank 0 stops right after its first
send and the last stage right after its first loss: whatever the backward does, the loss is what is judged.
"""

from __future__ import annotations

import torch

from .. import comm
from ..comm.mesh import Mesh
from ..models import TeacherData, loss_fn, tiny_mlp
from ..parallel.pipeline import split
from ..measure.verify import NamedPart, record_step
from .watch import Watch

__all__ = ["WORLD", "MESH", "ROLE", "WHAT", "make_model", "make_optimizer", "boundary_width", "StageWatch",
           "two_stage_rank", "returned_value"]

WORLD = 2  # two stages, two ranks: the seed's example
MESH = {"dp": 2, "pp": 2}  # the hidden sub-group case: two pipelines, [0, 1] and [2, 3]
ROLE = {0: "the first stage", 1: "the last stage"}
WHAT = {0: "the activations", 1: "the activations' gradient"}


def make_model(d_hidden: int, n_layers: int):
    return tiny_mlp(seed=0, d_hidden=d_hidden, n_layers=n_layers)


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def boundary_width(d_hidden: int, n_layers: int, layers_per_stage) -> int:
    """Elements per sample of the activations crossing from stage 0 to stage 1."""
    return d_hidden  # every hidden layer of the course MLP is d_hidden wide


class _ForwardDone(BaseException):
    """Raised by the harness when only the forward is checked (BaseException: not swallowed by the learner)."""


class Refused(RuntimeError):
    """A message the harness refused to pass on (to the rank itself, outside the pipeline, or not a tensor)."""


class StageWatch(Watch):
    """The watch of one stage's rank: a message to itself, to a rank outside its pipeline or not a tensor is refused.

    ``pair``: the global ranks of the pipeline, first stage first. ``stop_after_send``: the rank stops (raises
    ``_ForwardDone``) once its first payload has left, for a check of the forward alone.
    """

    def __init__(self, stage: int, pair: list[int], stop_after_send: bool = False):
        super().__init__()
        self.me, self.pair, self.stop_after_send = stage, pair, stop_after_send
        self.group = None

    def send(self, tensor, dst, group):
        self.group = group
        work = super().send(tensor, dst, group)
        if self.stop_after_send and self.sent[-1]["kind"] == "payload":
            raise _ForwardDone
        return work

    def isend(self, tensor, dst, group):
        self.group = group
        work = super().isend(tensor, dst, group)
        if self.stop_after_send and self.sent[-1]["kind"] == "payload":
            work.wait()  # delivered before the rank stops
            raise _ForwardDone
        return work

    def recv(self, tensor, src, group):
        self.group = group
        return super().recv(tensor, src, group)

    def irecv(self, tensor, src, group):
        self.group = group
        return super().irecv(tensor, src, group)

    def vet(self, tensor, peer: int, what: str) -> None:
        sending = what.startswith("send")
        role = f"{ROLE[self.me]} (rank {self.pair[self.me]})"
        if not isinstance(tensor, torch.Tensor):
            said = f"{role} tried to {what} rank {peer} {type(tensor).__name__} instead of a tensor"
            if tensor is None and sending and self.me == 1 and self.received and not self.received[-1].requires_grad:
                said = _NO_GRADIENT
            raise Refused(said)
        where = self.inner.global_rank(self.group, peer)
        other = self.pair[1 - self.me]
        what_moves = WHAT[self.me] if sending else WHAT[1 - self.me]
        if where == self.pair[self.me]:
            raise Refused(f"{role} tried to {what} rank {where}, itself: the other stage, rank {other}, "
                          f"{'receives' if sending else 'sends'} {what_moves}")
        if where != other:
            raise Refused(f"{role} tried to {what} rank {where}, outside its pipeline {self.pair}: the other stage, "
                          f"rank {other}, {'receives' if sending else 'sends'} {what_moves}. Inside a group, name the "
                          f"peer by its rank in the group (group=group, group_dst=/group_src=), or by its global rank")


class _StageRun:
    """One rank's stage and the learner's step for it; what each step sent and what the last stage returned."""

    def __init__(self, rank, step_fn, case, forward_only, mesh):
        d_hidden, n_layers, sizes, _, self.global_batch, self.micro_batches = case
        if mesh:
            axis = Mesh(MESH)["pp"]
            self.group, pair = axis, list(axis.ranks)
        else:
            self.group, pair = None, [0, 1]
        self.me = pair.index(rank)
        model = make_model(d_hidden, n_layers)
        names = {id(p): n for n, p in model.named_parameters()}
        self.stage = split(model, 2, layers_per_stage=list(sizes))[self.me]
        self.own = [(names[id(p)], p) for p in self.stage.parameters()]
        self.step_fn, self.forward_only = step_fn, forward_only
        self.width = boundary_width(d_hidden, n_layers, sizes)
        self.watch = StageWatch(self.me, pair, stop_after_send=forward_only and self.me == 0)
        self.sends, self.answers = [], []

    def _loss_fn(self, seen: list):
        def watched_loss(output, target):
            loss = loss_fn(output, target)
            seen.append((output.detach().clone(), target.shape[0], loss.item()))
            if self.forward_only:
                raise _ForwardDone
            return loss
        return watched_loss

    def step(self, step: int, inputs, targets) -> tuple[list, float]:
        """The learner's step on the whole batch: the last stage's outputs, and the batch's loss they give."""
        seen: list = []
        before = len(self.watch.sent)
        args = (self.stage, inputs, targets, self._loss_fn(seen), self.width, self.micro_batches)
        try:
            with comm.using(self.watch), comm.record():
                answer = self.step_fn(*args, group=self.group) if self.group is not None else self.step_fn(*args)
        except _ForwardDone:
            answer = None
        except RuntimeError as error:
            if _detached_backward(error):
                raise RuntimeError(_DETACHED_KEPT) from None
            raise
        except AttributeError as error:  # comm.send(None): .grad of a received buffer that did not require grad
            if self.me == 1 and "'NoneType'" in str(error) and self.watch.received \
                    and not self.watch.received[-1].requires_grad:
                raise RuntimeError(_NO_GRADIENT) from None
            raise
        self.sends.append((step, self.watch.payload_sent(before)))
        computed = sum(rows / inputs.shape[0] * loss for _, rows, loss in seen) if seen else None
        if self.me == 1 and not self.forward_only:  # stopped after its first loss, it returned nothing to judge
            unscaled = sum(loss for *_, loss in seen) if seen else None
            self.answers.append((step, returned_value(answer), computed, unscaled, len(seen)))
        return [output for output, *_ in seen], (computed if computed is not None else float("nan"))

    def result(self, **more) -> dict:
        return {**more, "stage": self.me, "sends": self.sends, "answers": self.answers}


def two_stage_rank(rank, world_size, step_fn, case, forward_only=False, mesh=False):
    """Train ``case`` with the learner's step; returns records, each step's sends and what the last stage returned
    (``forward_only``: the first micro-batch's loss instead of records)."""
    run, data = _StageRun(rank, step_fn, case, forward_only, mesh), TeacherData()
    optimizer = make_optimizer([p for _, p in run.own])
    steps, global_batch = case[3], case[4]
    records = []
    for step in range(1 if forward_only else steps):
        outputs, total = run.step(step, *data.batch(step, global_batch))
        if forward_only:
            return run.result(loss=total)
        grads = NamedPart({n: p.grad.detach().clone() for n, p in run.own if p.grad is not None})
        optimizer.step()
        records.append(record_step(torch.cat(outputs) if outputs else None, total, grads,
                                   NamedPart({n: p.detach() for n, p in run.own})))
        optimizer.zero_grad(set_to_none=True)
    return run.result(records=records)


def returned_value(answer):
    """What the step returned: the loss as a float, or words saying what came back instead."""
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        return answer.item()
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return float(answer)
    if isinstance(answer, torch.Tensor):
        return f"a tensor of shape {tuple(answer.shape)}"
    return "None" if answer is None else f"a {type(answer).__name__}"


_NO_GRADIENT = (
    "the last stage sent None instead of the activations' gradient: the activations it received do not require "
    "grad, so autograd computed no gradient for them (their .grad is None). Make what you receive into a leaf that "
    "requires grad before the forward")

_DETACHED_KEPT = (
    "the first stage's backward raised \"element 0 of tensors does not require grad\": the activations it kept "
    "are detached from its graph (stage(x).detach(), or computed under torch.no_grad()), so the backward cannot "
    "reach its layers. Detach only what you send, and keep the activations themselves for their backward")


def _detached_backward(error: BaseException) -> bool:
    """autograd refused a backward from a tensor that has no graph (torch's own words)."""
    return isinstance(error, RuntimeError) and "does not require grad and does not have a grad_fn" in str(error)
