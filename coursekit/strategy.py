"""How a parallelism strategy plugs into the one training loop (:func:`coursekit.train.train`).

A strategy wraps the model and answers five questions the loop asks every
step: what to call forward on, what to do around backward, how to
synchronise, how to step, and what it holds and sent. Each chapter's module
defines its strategies as small subclasses of :class:`Strategy` and registers
them by name with :func:`register`; the loop never changes.

Groups come from one :class:`~coursekit.comm.mesh.Mesh` handed in (``train(..., mesh=mesh)``): each strategy
names the axes it takes (:attr:`Strategy.axes`: ``("dp",)`` for data parallelism, ``("tp",)``,
``("dp", "tp")`` ...) and reads each by name (``setup.group("dp")``); no strategy builds a mesh.
Without a mesh, a strategy on one axis runs it over every rank; one on several axes says which
mesh it wants (:meth:`Strategy.default_mesh`), and :func:`mesh_for` builds it, once.

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

from .comm.mesh import Mesh, MeshAxis, as_group, rank_size
from .comm.traffic import Traffic
from .models import loss_fn
from .measure.trace import Tracer, span

__all__ = ["Setup", "Strategy", "STRATEGIES", "register", "get_strategy", "mesh_for", "optimizer_tensors"]


@dataclass
class Setup:
    """What the loop hands a strategy to build itself from.

    ``mesh`` is the run's :class:`~coursekit.comm.mesh.Mesh` (None: no mesh, every axis is all ranks); a strategy
    takes the axes it needs from it by name with :meth:`axis` or :meth:`group`. ``options`` holds the
    strategy's own keyword arguments given to ``train`` (e.g. ``bucket_cap_mb`` for ``"bucketed"``); a
    strategy reads those it knows.
    """

    model: nn.Module
    optimizer_fn: Callable[[list[nn.Parameter]], torch.optim.Optimizer]
    mesh: Mesh | None = None
    tracer: Tracer | None = None
    options: dict = field(default_factory=dict)

    def axis(self, name: str) -> MeshAxis | None:
        """This rank's axis ``name`` of the mesh, or None without a mesh (the axis is then every rank)."""
        return None if self.mesh is None else self.mesh[name]

    def group(self, name: str) -> Any:
        """The process group along axis ``name`` (None, all ranks, without a mesh), as ``Mesh.group``."""
        return as_group(self.axis(name))


class _KeepsNothing(list):
    """A list of transfers that keeps none (``Strategy.record`` counts collectives, not messages)."""

    def append(self, item) -> None:
        pass


class Strategy:
    """The default strategy is one process: forward, backward, optimiser step, nothing to synchronise.

    The loop calls, every step, for each micro-batch inside
    ``micro_batch_context(last)``: ``forward`` and ``loss``, then backward inside
    ``backward_context(last)``; then ``synchronize()``, ``step()``, ``global_loss()``,
    ``recorded_output()``, ``gradients()`` and ``parameters()`` (for the record; optimisers do not
    change ``.grad``), ``held_tensors()``, ``zero_grad()``.
    Subclasses override what differs.
    """

    options: dict = {}  # the options this strategy reads, with their defaults
    #: The mesh axes this strategy takes, by name. The first one's group is :attr:`group`, the group the loop
    #: averages the loss over when the strategy splits the batch (:attr:`data_size` > 1).
    axes: tuple[str, ...] = ("dp",)

    #: A strategy that runs a whole step itself sets this to a method
    #: ``run_step(micro_batches, micro_loss) -> (output or None, local_loss)``: ``micro_batches`` is this rank's
    #: list of ``(inputs, targets)``, ``micro_loss(output, inputs, targets)`` the loop's scaled loss of one. The loop
    #: then calls it instead of its own forward and backward per micro-batch: a pipeline schedule interleaves the
    #: micro-batches' forwards and backwards across ranks (:mod:`coursekit.parallel.pipeline`).
    run_step: Callable | None = None

    def __init__(self, setup: Setup):
        """Every strategy calls this first: then it replaces what it changes (its form of :attr:`model`, its
        :attr:`group`, an optimiser of its own); an optimiser it does not give is built on first use."""
        self.setup, self.tracer = setup, setup.tracer
        self.model = setup.model
        self.group = setup.group(self.axes[0])
        self._optimizer: torch.optim.Optimizer | None = None
        #: The collectives the steps issued (the loop records forward, backward, synchronize and step into it; not
        #: the gathers for the record): the counters a strategy reports are read from here. It keeps no message:
        #: a long run would hold every point-to-point transfer it sent (``train(count_traffic=True)`` keeps those).
        self.record = Traffic(transfers=_KeepsNothing())

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The loop's optimiser over the trainable parameters of :attr:`model`, as the strategy left it (built once,
        on first use); a strategy with its own (ZeRO's, a pipeline stage's) assigns it."""
        if self._optimizer is None:
            self._optimizer = self.setup.optimizer_fn([p for p in self.model.parameters() if p.requires_grad])
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer

    def option(self, name: str):
        return self.setup.options.get(name, self.options[name])

    @classmethod
    def default_mesh(cls, world_size: int, options: dict) -> dict[str, int] | None:
        """The mesh's shape when ``train`` is given none; None: no mesh.

        A strategy on one axis needs no mesh: without one, its axis is every rank (the default group,
        no new process group made). One on two axes, ``dp`` outside and one more inside, sizes the inner
        axis by its option of the same name: ``"dp_tp"`` with ``tp=2`` on 4 ranks gets
        ``{"dp": 2, "tp": 2}``, ``"sequence_data"`` with ``sp=2`` ``{"dp": 2, "sp": 2}``. A strategy whose
        axes are laid out otherwise overrides this.
        """
        if len(cls.axes) < 2:
            return None
        if len(cls.axes) > 2:
            raise NotImplementedError(f"{cls.__name__} takes the axes {list(cls.axes)}: pass train(..., "
                                      f"mesh=Mesh(...)) or override default_mesh to size them.")
        outer, inner = cls.axes
        size = options.get(inner, cls.options[inner])
        if isinstance(size, int) and not isinstance(size, bool) and size >= 1 and world_size % size == 0:
            return {outer: world_size // size, inner: size}
        raise ValueError(f"{inner}={size!r} must be a positive divisor of the world size {world_size} "
                         f"(the mesh is {outer}={world_size}//{inner} × {inner}).")

    # ---------------------------------------------------------------- how the batch is split
    @property
    def data_rank(self) -> int:
        """Which slice of the global batch this rank takes."""
        return rank_size(self.group)[0]

    @property
    def data_size(self) -> int:
        """Into how many slices the global batch is cut (the data-parallel degree)."""
        return rank_size(self.group)[1]

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

    def global_loss(self, local_loss: float) -> float:
        """The global batch's loss, the same on every rank, from this rank's ``local_loss`` (after the step).

        ``local_loss`` is the sum of this rank's scaled micro-batch losses (see :func:`shard_batch`'s weight).
        Default: averaged over the data-parallel ranks (:attr:`group`) with torch's all-reduce of one number,
        not part of the counted traffic. A strategy whose ranks each hold part of every sample reduces its own
        way (the sequence strategies: the summed loss and the token count, over the ranks holding the batch).
        """
        total = torch.tensor([local_loss / self.data_size], dtype=torch.float64)
        if self.data_size > 1:
            dist.all_reduce(total, group=self.group)
        return total.item()

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
        """This rank's gradients, as :func:`coursekit.measure.verify.record_step` takes them."""
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def parameters(self):
        """This rank's parameters, as :func:`coursekit.measure.verify.record_step` takes them."""
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
        return span(self.tracer, kind, name, waits=kind == "comm")


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


def mesh_for(name: str, world_size: int, options: dict, mesh: Mesh | None = None) -> Mesh | None:
    """The mesh strategy ``name`` runs on: ``mesh`` checked to have the axes the strategy takes, or, when
    None, the strategy's :meth:`~Strategy.default_mesh` built here (once: building groups is collective).

    An axis the strategy does not take is left alone: each of its groups runs the strategy on its own
    (data parallelism on ``Mesh({"dp": 2, "tp": 2})`` trains two copies, one per ``tp`` coordinate).
    """
    cls = get_strategy(name)
    if mesh is None:
        shape = cls.default_mesh(world_size, options)
        return None if shape is None else Mesh(shape)
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh= takes a coursekit.comm.mesh.Mesh (e.g. Mesh({{'dp': 2, 'tp': 2}})), not "
                        f"{type(mesh).__name__}: strategy={name!r} takes the axes {list(cls.axes)} from it by name.")
    missing = [axis for axis in cls.axes if axis not in mesh.axes]
    if missing:
        raise ValueError(f"strategy={name!r} takes the mesh axes {list(cls.axes)}, but this mesh has "
                         f"{list(mesh.axes)} (no {', '.join(map(repr, missing))}); name the mesh's axes "
                         f"{list(cls.axes)}, e.g. Mesh({{{', '.join(f'{a!r}: ...' for a in cls.axes)}}}).")
    for axis in cls.axes:
        if axis in options and options[axis] != mesh.size(axis):
            raise ValueError(f"{axis}={options[axis]!r} but the mesh's {axis!r} axis has {mesh.size(axis)} ranks: "
                             f"give the mesh or the option {axis}=, not both.")
    return mesh
