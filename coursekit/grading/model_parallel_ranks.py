"""What runs on each rank in exercise 03: the learner's two halves training the course MLP, watched.

:func:`two_stage_rank` trains one case with ``first_stage`` on rank 0 and
``second_stage`` on rank 1 and returns, per rank, the step records
(:mod:`coursekit.measure.verify`), what each micro-batch sent, what the harness had to
rescue and what ``second_stage`` returned. Each message goes through a
:class:`StageWatch` (:mod:`.watch`), which refuses one to the wrong rank or one that
is not a tensor, so that the feedback names it instead of a deadlock. When the
second stage cannot send a gradient (``inputs.grad`` is None because the received
activations did not require grad, or it is sent to the wrong rank), the harness
sends rank 0 a zero gradient in its place, so that the run finishes and the
feedback can say what that costs: the first stage's gradients are zero. When the
first stage cannot continue backward because the activations it kept are detached
(``activations.backward(grad)`` on a tensor with no graph), the harness notes why and
goes on, so that the second stage's half is still judged. When only the forward is
checked, rank 0 stops right after its send: whatever its backward does, rank 1's
loss is what is judged.
"""

from __future__ import annotations

import math

import torch

from .. import comm
from ..models import TeacherData, loss_fn, tiny_mlp
from ..parallel.pipeline import split
from ..measure.verify import NamedPart, record_step
from .watch import Watch

__all__ = ["WORLD", "ROLE", "WHAT", "make_model", "make_optimizer", "boundary_width", "StageWatch",
           "two_stage_rank", "returned_value"]

WORLD = 2  # two stages, two ranks: the seed's example
ROLE = {0: "the first stage (rank 0)", 1: "the second stage (rank 1)"}
WHAT = {0: "the activations", 1: "the gradient"}


def make_model(d_hidden: int, n_layers: int):
    return tiny_mlp(seed=0, d_hidden=d_hidden, n_layers=n_layers)


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def boundary_width(d_hidden: int, n_layers: int, layers_per_stage) -> int:
    """Elements per sample of the activations crossing from stage 0 to stage 1."""
    return d_hidden  # every hidden layer of the course MLP is d_hidden wide


class _ForwardDone(BaseException):
    """Raised from the harness's loss_fn when only the forward is checked (BaseException: not swallowed)."""


class _Refused(Exception):
    """A message the harness refused to pass on (to the wrong rank, or None instead of a tensor)."""


class StageWatch(Watch):
    """The watch of one stage's rank: a message to itself, to a rank that does not exist or not a tensor is refused.

    ``stop_after_send``: the rank stops (raises ``_ForwardDone``) once its first payload has left, for a check of
    the forward alone: what it would do next (its backward, from a gradient nobody computed) is not judged.
    """

    def __init__(self, rank: int, stop_after_send: bool = False):
        super().__init__()
        self.me, self.stop_after_send = rank, stop_after_send

    def send(self, tensor, dst, group):
        work = super().send(tensor, dst, group)
        if self.stop_after_send and self.sent[-1]["kind"] == "payload":
            raise _ForwardDone
        return work

    def isend(self, tensor, dst, group):
        work = super().isend(tensor, dst, group)
        if self.stop_after_send and self.sent[-1]["kind"] == "payload":
            work.wait()  # delivered before the rank stops
            raise _ForwardDone
        return work

    def vet(self, tensor, peer: int, what: str) -> None:
        sending = what.startswith("send")
        if not isinstance(tensor, torch.Tensor):
            raise _Refused(f"{ROLE[self.me]} tried to {what} {type(tensor).__name__} instead of a tensor")
        if peer == self.me:
            raise _Refused(f"{ROLE[self.me]} tried to {what} rank {self.me}, itself: "
                           f"{WHAT[self.me] if sending else 'what it waits for'} "
                           f"{'goes to' if sending else 'comes from'} rank {1 - self.me}, its "
                           f"neighbour in the chain")
        if not 0 <= peer < WORLD:
            raise _Refused(f"{ROLE[self.me]} tried to {what} rank {peer}, which does not exist (ranks 0 and 1): "
                           f"{WHAT[self.me] if sending else 'it'} "
                           f"{'goes to' if sending else 'comes from'} rank {1 - self.me}")


class _StageRun:
    """One rank's stage and the learner's half for it; what each micro-batch sent, what was rescued and returned."""

    def __init__(self, rank, first_stage, second_stage, case, forward_only):
        d_hidden, n_layers, sizes, _, self.global_batch, self.micro_batches = case
        model = make_model(d_hidden, n_layers)
        names = {id(p): n for n, p in model.named_parameters()}
        self.stage = split(model, 2, layers_per_stage=list(sizes))[rank]
        self.own = [(names[id(p)], p) for p in self.stage.parameters()]
        self.rank, self.halves, self.forward_only = rank, (first_stage, second_stage), forward_only
        self.width = boundary_width(d_hidden, n_layers, sizes)
        self.watch = StageWatch(rank, stop_after_send=forward_only and rank == 0)
        self.sends, self.rescued, self.answers = [], [], []
        # The stage's output, seen without the loss_fn: a second stage that computes a loss of its own is judged
        # on what it returned and on this output (its gradients may still be right), not reported as having none.
        self.forwarded: list = []
        if rank == 1:
            self.stage.register_forward_hook(self._keep_output)

    def _keep_output(self, module, args, output):
        self.forwarded[:] = [output.detach().clone()]  # the latest only

    def step(self, step: int, inputs, targets) -> tuple[list, float]:
        """Every micro-batch of one step: the outputs of the second stage and the batch's loss."""
        outputs, total = [], 0.0
        for micro, (x, y) in enumerate(zip(inputs.tensor_split(self.micro_batches),
                                           targets.tensor_split(self.micro_batches))):
            seen = self._micro_batch(step, micro, x, y)
            if seen:
                outputs.append(seen[-1][0])
                total += seen[-1][1]
            elif self.rank == 1 and self.answers and self.answers[-1][:2] == (step, micro):  # loss_fn never called
                outputs += self.forwarded[-1:]
                total += self.answers[-1][2] if isinstance(self.answers[-1][2], float) else math.nan
        return outputs, total

    def _scaled_loss(self, share: float, seen: list):
        def scaled_loss(output, target):
            loss = loss_fn(output, target) * share  # the micro-batches' losses add up to the batch's mean
            seen.append((output.detach().clone(), loss.item()))
            if self.forward_only:
                raise _ForwardDone
            return loss
        return scaled_loss

    def _micro_batch(self, step: int, micro: int, x, y) -> list:
        """The learner's half on one micro-batch; ``[(output, loss)]`` if the harness's loss_fn was called."""
        seen: list = []
        scaled_loss = self._scaled_loss(x.shape[0] / self.global_batch, seen)
        before_sent, before_received = len(self.watch.sent), len(self.watch.received)
        try:
            with comm.using(self.watch), comm.record():
                if self.rank == 0:
                    self.halves[0](self.stage, x)
                else:
                    answer = self.halves[1](self.stage, y, scaled_loss, (x.shape[0], self.width))
                    # (step, micro-batch, what it returned, the loss loss_fn computed or None if never called)
                    self.answers.append((step, micro, returned_value(answer), seen[-1][1] if seen else None))
        except (_ForwardDone, _Refused, AttributeError, TypeError, RuntimeError) as error:
            self._rescue(step, micro, x.shape[0], error, before_sent, before_received)
        self.sends.append((step, micro, x.shape[0], self.watch.payload_sent(before_sent)))
        return seen

    def _rescue(self, step: int, micro: int, samples: int, error: BaseException, before_sent: int,
                before_received: int) -> None:
        """Go on after the learner's half stopped, where the harness can (else re-raise): rank 0 stopped after its
        send (the forward alone), rank 1 without a gradient to send, rank 0 unable to continue backward."""
        sent = self.watch.payload_sent(before_sent)
        received = len(self.watch.received) > before_received
        if self.rank == 0:
            if isinstance(error, _ForwardDone):
                return
            if received and any(s["dst"] == 1 for s in sent) and _detached_backward(error):
                self.rescued.append((step, micro, _DETACHED_KEPT))
                return
            raise error
        if isinstance(error, RuntimeError) or not received or any(s["dst"] == 0 for s in sent):
            raise error
        if not isinstance(error, _ForwardDone):
            self.rescued.append((step, micro, _rescue_reason(error, self.watch.received[-1])))
        if not self.forward_only:  # rank 0 may go on (not counted); in the forward alone it stopped after its send
            self.watch.inner.send(torch.zeros(samples, self.width), 0, None)

    def result(self, **more) -> dict:
        return {**more, "sends": self.sends, "rescued": self.rescued, "answers": self.answers}


def two_stage_rank(rank, world_size, first_stage, second_stage, case, forward_only=False):
    """Train ``case`` with the learner's halves; returns records, per-micro-batch sends, what was rescued and what
    second_stage returned (``forward_only``: the first micro-batches' loss instead of records)."""
    run, data = _StageRun(rank, first_stage, second_stage, case, forward_only), TeacherData()
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
    """What second_stage returned: the loss as a float, or words saying what came back instead."""
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        return answer.item()
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return float(answer)
    if isinstance(answer, torch.Tensor):
        return f"a tensor of shape {tuple(answer.shape)}"
    return "None" if answer is None else f"a {type(answer).__name__}"


_DETACHED_KEPT = (
    "first_stage's activations.backward(grad) raised \"element 0 of tensors does not require grad\": the "
    "activations it kept on rank 0 are detached from rank 0's graph (stage(inputs).detach(), or computed under "
    "torch.no_grad()), so the backward cannot reach rank 0's layers. Detach only what you send: "
    "comm.send(activations.detach(), dst=1), and keep activations = stage(inputs) itself for "
    "activations.backward(grad)")


def _detached_backward(error: BaseException) -> bool:
    """autograd refused a backward from a tensor that has no graph (torch's own words)."""
    return isinstance(error, RuntimeError) and "does not require grad and does not have a grad_fn" in str(error)


def _rescue_reason(error: Exception, received: torch.Tensor) -> str:
    if isinstance(error, _Refused):
        return str(error)
    if not received.requires_grad:
        return ("inputs.grad is None: the activations it received do not require grad, so autograd computed no "
                "gradient for them — call inputs.requires_grad_() after receiving them")
    return f"it raised {type(error).__name__}: {error} before sending it"
