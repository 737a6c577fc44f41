"""Pipeline parallelism: one executor that runs any valid schedule, action by action (seed claim P7).

Model parallelism is a chain: one rank computes while the others wait. Pipelining (GPipe, Huang et al. 2019;
1F1B, Narayanan et al. 2021) cuts the batch into ``m`` micro-batches, so that while stage 1 works on
micro-batch 0, stage 0 already starts micro-batch 1. *Which* rank does *what* and *when* is the schedule --
plain data, a list of actions per rank (:mod:`~coursekit.parallel.pipeline.schedules`) -- and this executor
only carries it out:

* ``F(s, i)``: forward of micro-batch ``i`` through stage ``s``. Its input is the batch on stage 0, else what
  ``RECV_F`` received (or this rank's own stage ``s-1``'s output). The last stage also computes the
  micro-batch's loss, scaled so that the gradients *accumulate* to exactly one process's.
* ``B(s, i)``: backward of stage ``s``. When the schedule also has ``W`` actions (zero bubble, Qi et al. 2023),
  B computes only the gradient of the stage's *input*, which the previous stage waits for; ``W(s, i)`` computes
  the *weight* gradients later (:mod:`~coursekit.parallel.pipeline.split_backward`).
* ``SEND_F``/``SEND_B``: a non-blocking send, all waited at the end of the step; ``RECV_F``/``RECV_B``: a
  blocking receive, or one posted before the compute in front of it (``Channel(post_ahead=True)``).

``around(action, step)``, if given, is a context manager wrapped around each action: how the training loop's
adapter draws each one on the timeline and measures the activations it keeps (:mod:`.executor`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn

from .comm import Channel
from .schedules import Action, Schedule
from .split_backward import backward_input, backward_weight

__all__ = ["run_schedule", "Step"]


def run_schedule(schedule: Schedule, rank: int, stages: dict[int, nn.Module], micro_batches, micro_loss,
                 channel: Channel, around: Callable | None = None) -> tuple[list[torch.Tensor], float]:
    """Run ``schedule.actions[rank]`` in order; return the last stage's outputs and the loss summed.

    ``stages`` maps each stage this rank holds to its module; ``micro_batches`` is the list of ``(inputs,
    targets)``; ``micro_loss(output, inputs, targets)`` the scaled loss of one. Gradients accumulate into the
    stages' ``.grad``. The schedule must be valid (:func:`~coursekit.parallel.pipeline.validate`).
    """
    step = Step(schedule, rank, stages, micro_batches, micro_loss, channel)
    ahead = getattr(channel, "post_ahead", False)  # a channel of receives posted before the compute
    for position, action in enumerate(schedule.actions[rank]):
        with around(action, step) if around is not None else nullcontext():
            step.run(action)
        if ahead:
            step.post_ahead(position)
    channel.wait()
    return [step.results[i] for i in sorted(step.results)], step.loss_sum


class Step:
    """One step on one rank: what each action leaves for the actions after it, keyed ``(stage, micro-batch)``.

    The inputs and outputs of each forward, what ``RECV_F`` received, the output gradients (from ``RECV_B`` or
    this rank's next stage), the input gradients ``SEND_B`` sends, and what ``W`` needs after a split ``B``.
    """

    def __init__(self, schedule: Schedule, rank: int, stages: dict[int, nn.Module], micro_batches, micro_loss,
                 channel: Channel):
        self.schedule, self.rank, self.stages, self.channel = schedule, rank, stages, channel
        self.micro_batches, self.micro_loss = micro_batches, micro_loss
        self.last, self.split = schedule.n_stages - 1, schedule.split_backward
        self.owner = schedule.stage_owner
        self.key = [tuple(x.shape) for x, _ in micro_batches]  # both ends of a link know a micro-batch's shape
        self.inputs, self.outputs, self.received, self.grads, self.to_send, self.for_w = {}, {}, {}, {}, {}, {}
        self.results, self.loss_sum = {}, 0.0
        self.receives = [k for k, a in enumerate(schedule.actions[rank]) if a.op in ("RECV_F", "RECV_B")]
        self.ahead = 0  # index in self.receives of the next receive neither posted ahead nor run

    def run(self, action: Action) -> None:
        op, s, i = action.op, action.stage, action.micro_batch
        if op == "F":
            self.forward(s, i)
        elif op == "B":
            self.backward(s, i)
        elif op == "W":
            backward_weight(self.for_w.pop((s, i)))
        elif op == "SEND_F":
            self.channel.isend(self.outputs[(s, i)].detach(), self.owner(s + 1), key=(s, self.key[i]))
        elif op == "SEND_B":
            self.channel.isend(self.to_send.pop((s, i)), self.owner(s - 1))
        elif op == "RECV_F":
            self.received[(s, i)] = self.channel.recv(self.owner(s - 1), (s - 1, self.key[i]), name=str(action))
        elif op == "RECV_B":
            self.grads[(s, i)] = self.channel.recv(self.owner(s + 1), None, like=self.outputs[(s, i)],
                                                   name=str(action))
        else:
            raise ValueError(f"rank {self.rank}: unknown action {action}")
        if op.startswith("SEND"):
            self.channel.prune()

    def forward(self, s: int, i: int) -> None:
        if s == 0:
            x = self.micro_batches[i][0]
        else:  # from RECV_F, or this rank's own stage s-1: a new leaf either way, so stages backward apart
            x = self.received.pop((s, i)) if self.owner(s - 1) != self.rank else self.outputs[(s - 1, i)].detach()
            x.requires_grad_(True)
        out = self.stages[s](x)
        if s == self.last:
            self.results[i] = out.detach()
            out = self.micro_loss(out, *self.micro_batches[i])
            self.loss_sum += out.item()
        self.inputs[(s, i)], self.outputs[(s, i)] = x, out

    def backward(self, s: int, i: int) -> None:
        x, out = self.inputs.pop((s, i)), self.outputs.pop((s, i))
        grad = None if s == self.last else self.grads.pop((s, i))
        if self.split:  # the input gradient only; what W needs stays, the rest of the graph goes
            (dx,), self.for_w[(s, i)] = backward_input([out], [grad], [x], self.stages[s].parameters())
        else:           # input and weight gradients; the graph (and its saved activations) is freed
            torch.autograd.backward(out, grad)
            dx = x.grad if x.requires_grad else None
        del x, out, grad
        if s > 0 and self.owner(s - 1) == self.rank:
            self.grads[(s - 1, i)] = dx           # this rank's stage s-1 carries on from here
        elif s > 0:
            self.to_send[(s, i)] = dx             # for SEND_B

    def post_ahead(self, position: int) -> None:
        """After the action at ``position``: post the next receive ahead (one at a time), once its buffer can
        be made -- so the message can land while this rank computes."""
        actions, receives = self.schedule.actions[self.rank], self.receives
        while self.ahead < len(receives) and receives[self.ahead] <= position:
            self.ahead += 1       # run before it could be posted: recv() received it the plain way
        if self.ahead == len(receives) or (self.ahead and receives[self.ahead - 1] > position):
            return                # all done, or the one posted before is not collected yet
        a = actions[receives[self.ahead]]
        s, i = a.stage, a.micro_batch
        if a.op == "RECV_F":
            posted = self.channel.post(self.owner(s - 1), (s - 1, self.key[i]))
        else:
            posted = (s, i) in self.outputs and self.channel.post(self.owner(s + 1), None, like=self.outputs[(s, i)])
        self.ahead += posted
