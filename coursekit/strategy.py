"""How a parallelism strategy plugs into the one training loop (:func:`coursekit.train.train`).

A strategy wraps the model and answers five questions the loop asks every
step: what to call forward on, what to do around backward, how to
synchronise, how to step, and what it holds and sent. Each chapter's module
defines its strategies as small subclasses of :class:`Strategy` and registers
them by name with :func:`register`; the loop never changes.

    >>> @register("my_strategy")
    ... class Mine(Strategy):
    ...     def synchronize(self):
    ...         ...                                   # e.g. all-reduce the gradients
    >>> sorted(STRATEGIES)[:2]                        # doctest: +SKIP
    ['bucketed', 'my_strategy']
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist
import torch.nn as nn

from .mesh import as_group
from .models import loss_fn
from .trace import Tracer

__all__ = ["Setup", "Strategy", "STRATEGIES", "register", "get_strategy", "optimizer_tensors"]


@dataclass
class Setup:
    """What the loop hands a strategy to build itself from.

    ``options`` holds the strategy's own keyword arguments given to ``train``
    (e.g. ``bucket_cap_mb`` for ``"bucketed"``); a strategy reads those it knows.
    """

    model: nn.Module
    optimizer_fn: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
    group: Any = None            # the data-parallel group: None (all ranks), a process group or a MeshAxis
    tracer: Tracer | None = None
    options: dict = field(default_factory=dict)


class Strategy:
    """The default strategy is one process: forward, backward, optimiser step, nothing to synchronise.

    The loop calls, every step, for each micro-batch inside
    ``micro_batch_context(last)``: ``forward`` and ``loss``, then backward inside
    ``backward_context(last)``; then ``synchronize()``,
    ``recorded_output()`` and ``gradients()`` (for the record, before the step), ``step()``,
    ``parameters()`` and ``held_tensors()`` (after it), ``zero_grad()``.
    Subclasses override what differs.
    """

    options: dict = {}  # the options this strategy reads, with their defaults

    #: A strategy that runs a whole step itself sets this to a method
    #: ``run_step(micro_batches, micro_loss) -> (output or None, local_loss)``: ``micro_batches`` is this rank's
    #: list of ``(inputs, targets)``, ``micro_loss(output, inputs, targets)`` the loop's scaled loss of one. The loop
    #: then calls it instead of its own forward and backward per micro-batch: a pipeline schedule interleaves the
    #: micro-batches' forwards and backwards across ranks (:mod:`coursekit.parallel.pipeline`).
    run_step: Callable | None = None

    def __init__(self, setup: Setup):
        self.setup = setup
        self.model = setup.model
        self.group = as_group(setup.group)
        self.tracer = setup.tracer
        self.optimizer = setup.optimizer_fn([p for p in self.model.parameters() if p.requires_grad])

    def option(self, name: str):
        return self.setup.options.get(name, self.options[name])

    # ---------------------------------------------------------------- how the batch is split
    @property
    def data_rank(self) -> int:
        """Which slice of the global batch this rank takes."""
        return dist.get_rank(self.group) if dist.is_initialized() else 0

    @property
    def data_size(self) -> int:
        """Into how many slices the global batch is cut (the data-parallel degree)."""
        return dist.get_world_size(self.group) if dist.is_initialized() else 1

    # ---------------------------------------------------------------- one step
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of one micro-batch from what :meth:`forward` returned (the loop scales it).

        Default: :func:`coursekit.models.loss_fn` on whole outputs. A strategy whose forward returns
        shards overrides it (tensor parallelism: the vocabulary-parallel loss, no logits gathered).
        """
        return loss_fn(output, targets)

    def recorded_output(self, outputs: list[torch.Tensor]) -> torch.Tensor | None:
        """The step's output as the record shows it (the micro-batches' detached outputs, concatenated).

        Called only when the loop records; a strategy whose outputs are shards reassembles them here,
        outside the step (not counted, not traced).
        """
        return torch.cat(outputs) if outputs else None  # None: this rank computes no output

    def micro_batch_context(self, last: bool) -> ContextManager:
        """Wrapped around each micro-batch's forward *and* backward (torch DDP's ``no_sync`` must see both)."""
        return nullcontext()

    def backward_context(self, last: bool) -> ContextManager:
        """Wrapped around each micro-batch's backward; ``last`` marks the one that should communicate."""
        return nullcontext()

    def synchronize(self) -> None:
        """After the last backward, before the optimiser step: e.g. average the gradients."""

    def step(self) -> None:
        with self.span("optimizer", "step"):
            self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    # ---------------------------------------------------------------- what the harness and the accounting see
    def gradients(self):
        """This rank's gradients, as :func:`coursekit.verify.record_step` takes them."""
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def parameters(self):
        """This rank's parameters, as :func:`coursekit.verify.record_step` takes them."""
        return self.model

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The tensors this rank holds, by kind: ``params``, ``grads``, ``optimizer``."""
        params = list(self.model.parameters())
        return {"params": params, "grads": [p.grad for p in params if p.grad is not None],
                "optimizer": optimizer_tensors(self.optimizer)}

    def counters(self) -> dict[str, int]:
        """Exact counts a test can assert (e.g. elements all-reduced)."""
        return {}

    def span(self, kind: str, name: str) -> ContextManager:
        """A timeline span if tracing, else nothing; ``kind="comm"`` blocks and counts as waiting."""
        if self.tracer is None:
            return nullcontext()
        return self.tracer.blocking(name) if kind == "comm" else self.tracer.span(kind, name)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor of an optimiser's state (Adam's two moments and step counters, momentum buffers)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


STRATEGIES: dict[str, type[Strategy]] = {"single": Strategy}


def register(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    """Class decorator: make a strategy available to ``train(..., strategy=name)``."""
    def add(cls: type[Strategy]) -> type[Strategy]:
        STRATEGIES[name] = cls
        return cls
    return add


def get_strategy(name: str) -> type[Strategy]:
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r}: use one of {tuple(STRATEGIES)}.")
    return STRATEGIES[name]
