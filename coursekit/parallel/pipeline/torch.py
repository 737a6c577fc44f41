"""The same pipeline in PyTorch's own API: ``torch.distributed.pipelining``, run by the same training loop.

The stages are coursekit's (:func:`coursekit.parallel.pipeline.split`, the same layers on the same ranks), the
micro-batches the loop's, the loss the loop's scaled loss; only the executor changes:

======================================================  ==============================================
coursekit                                               PyTorch (registered here as ``"torch_pipeline"``)
======================================================  ==============================================
``split(model, p * v)``; stage ``s`` on rank ``s % p``  ``PipelineStage(stage, s, p * v, device)``
``make_schedule("gpipe", p, m)`` + ``execute``          ``ScheduleGPipe(stage, m, loss_fn)``
``make_schedule("1f1b", p, m)``                         ``Schedule1F1B(stage, m, loss_fn)`` (needs m >= p)
``make_schedule("interleaved", p, m, v)``               ``ScheduleInterleaved1F1B([stages], m, loss_fn)``
``Channel``'s shape header, once per shape              the stage's shape inference, at its first step
``sum_tied_gradients`` (embedding = head)               not done by torch: the same call, after ``step``
======================================================  ==============================================

The loop's loss of a micro-batch is already scaled (the sum over micro-batches is the batch's mean loss), so
the schedules run with ``scale_grads=False``. torch splits the batch with ``tensor_split``, as the loop does,
but its stages receive into buffers shaped at the first micro-batch: micro-batches must be of one size.

    >>> train(rank, world_size, "torch_pipeline", model="transformer", micro_batches=4)  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from ...strategy import Setup, register
from .model import StagedStrategy
from .comm import broadcast_loss, sum_tied_gradients

__all__ = ["TorchPipeline", "torch_schedule"]

TORCH_SCHEDULES = ("gpipe", "1f1b", "interleaved")


def torch_schedule(name: str, stages: dict, n_stages: int, m: int, loss_fn, group=None):
    """``torch.distributed.pipelining``'s schedule ``name`` over this rank's ``{global stage: module}``."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if name not in TORCH_SCHEDULES:
        raise ValueError(f"schedule={name!r}: torch.distributed.pipelining is run here with {TORCH_SCHEDULES}.")
    pipeline_stages = [PipelineStage(module, index, n_stages, torch.device("cpu"), group=group)
                       for index, module in sorted(stages.items())]
    if name == "interleaved":
        return ScheduleInterleaved1F1B(pipeline_stages, m, loss_fn=loss_fn, scale_grads=False)
    if len(pipeline_stages) != 1:
        raise ValueError(f"{name} runs one stage per rank; use 'interleaved' for stages_per_rank > 1.")
    cls = ScheduleGPipe if name == "gpipe" else Schedule1F1B
    return cls(pipeline_stages[0], m, loss_fn=loss_fn, scale_grads=False)


@register("torch_pipeline")
class TorchPipeline(StagedStrategy):
    """The stages of ``"pipeline"``, run by ``torch.distributed.pipelining``'s schedule of the same name."""

    options = {**StagedStrategy.options, "schedule": "1f1b", "stages_per_rank": 1}

    def __init__(self, setup: Setup):
        super().__init__(setup, stages_per_rank=setup.options.get("stages_per_rank", 1))
        self._schedules: dict = {}
        self._micro_loss = None

    def _loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # torch calls loss_fn(output, target) per micro-batch; the loop's scale needs only its size
        return self._micro_loss(output, targets, targets)

    def run_step(self, micro_batches, micro_loss):
        m, self._micro_loss = len(micro_batches), micro_loss
        sizes = [x.shape[0] for x, _ in micro_batches]
        if len(set(sizes)) > 1:
            raise ValueError(f"torch.distributed.pipelining receives into buffers shaped by its first micro-batch, so "
                             f"micro-batches must be of one size; got {sizes}: use a batch divisible by "
                             f"micro_batches={m} (coursekit's 'pipeline' takes uneven ones).")
        if m not in self._schedules:
            self._schedules[m] = torch_schedule(self.option("schedule"), self.mine, self.n_stages, m, self._loss,
                                                self.group)
        schedule = self._schedules[m]
        inputs = torch.cat([x for x, _ in micro_batches])
        targets = torch.cat([y for _, y in micro_batches])
        first, last = 0 in self.mine, self.n_stages - 1 in self.mine
        losses: list = []
        with self.span("forward", "torch pipeline step"):
            output = schedule.step(*([inputs] if first else []), target=targets if last else None,
                                   losses=losses if last else None)
        sum_tied_gradients(self.tied, owner=lambda s: s % self.size, group=self.group)
        loss = broadcast_loss(sum(x.item() for x in losses), src=(self.n_stages - 1) % self.size, group=self.group)
        return (output.detach() if last and output is not None else None), loss
