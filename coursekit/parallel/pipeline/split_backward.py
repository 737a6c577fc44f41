"""A backward pass in two pieces: B, the input gradient a previous stage waits for, and W, the weight gradients.

Zero-bubble schedules (Qi et al. 2023) run ``B`` as soon as the next stage's gradient arrives and defer ``W``
into the bubble. That only pays if B and W *together* cost one backward, so W must start from what B already
computed instead of running autograd from the stage output again.

Where the work of a backward goes, for one ``nn.Linear`` ``Y = X·Wᵀ + b`` (X of shape batch × in):

* the **input gradient** ``dX = dY·W``  -- one matmul; the previous stage needs it, so it is B;
* the **weight gradient** ``dW = dYᵀ·X`` -- one matmul -- and ``db = Σ dY`` (a sum over the batch) -- W.

Both need ``dY``, the gradient arriving at the layer's output. Through a stack of layers, B computes every
layer's ``dY`` on the way down to the stage input (a layer's ``dX`` is the ``dY`` of the layer before it),
so B does the activation-gradient half of every layer and W the weight half: one matmul each per layer.

Why ``torch.autograd.grad(out, inputs=[x])`` skips the ``dW`` matmuls: before it runs, the engine marks
the graph nodes that lie on a path from ``out`` to ``x``; a node computes only the outputs whose edge leads
to a marked node. ``AddmmBackward`` (the linear layer's node) has three edges -- to ``b``, to the layer input,
to ``Wᵀ`` -- and with only the input marked it computes ``dX = dY·W`` and skips ``dYᵀ·X`` and ``Σ dY``.

What B keeps for W, in autograd's own terms (as ``torch.distributed.pipelining``'s ``stage_backward_input``
/ ``stage_backward_weight`` do it, written out to be read):

1. The **trunk**: the graph nodes from which the stage input is reachable -- what B runs.
2. For each weight, walk up from its gradient accumulator until the trunk: the trunk nodes reached first
   are where its gradient *leaves* the trunk (for a linear layer: its ``AddmmBackward``). B records, with a
   hook on each such node, the gradient arriving there (that layer's ``dY``).
3. W calls autograd from those nodes -- a :class:`torch.autograd.graph.GradientEdge` ``(node, k)`` is an
   output autograd can start from, given its gradient -- to the weights only: ``dYᵀ·X`` and ``Σ dY``.

This is general: LayerNorm, attention, an embedding, a weight used twice (its two nodes are started from in
one call; a hook pins the lower node to the gradient B recorded, so what flows down the trunk between them --
computed again, the one case of repeated work -- is not added twice). The first stage (an input that needs
no gradient) has no trunk: B has nothing to do and W runs the whole backward, as torch does.
Memory: until W runs, the graph below its nodes stays (their saved tensors: the layer inputs ``X``, and what
the trunk below saved), with B's recorded ``dY``'s; what lies above the topmost node is freed after B.

    >>> input_grads, work = backward_input([out], [grad], [x], stage.parameters())   # doctest: +SKIP
    >>> backward_weight(work)    # later: dW, db added into each parameter's .grad        # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = ["WeightWork", "backward_input", "backward_weight"]


@dataclass
class WeightGroup:
    """Weights whose gradients leave the trunk at the same ``nodes``; ``grads[k]``: what reached ``nodes[k]``."""

    nodes: list[Node]
    weights: list[torch.Tensor]
    grads: list[tuple] = field(default_factory=list)


@dataclass
class WeightWork:
    """What B leaves for W: the groups to start from, or (no trunk) the outputs to run the whole backward from."""

    groups: list[WeightGroup]
    outputs: list[torch.Tensor] = field(default_factory=list)
    grad_outputs: list = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)

    def kept(self) -> list[torch.Tensor]:
        """The gradients kept for W (the layers' ``dY``, or the output gradient): held beyond the saved activations."""
        recorded = [g for group in self.groups for grads in group.grads for g in grads if g is not None]
        return recorded + [g for g in self.grad_outputs if g is not None]


def _graph(roots: list[Node]) -> dict[Node, list[Node]]:
    """``parents[n]``: the nodes with an edge to ``n`` (autograd's edges point from an output to its inputs)."""
    parents: dict[Node, list[Node]] = {root: [] for root in roots}
    stack = list(roots)
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            if child not in parents:
                parents[child] = []
                stack.append(child)
            parents[child].append(node)
    return parents


def _above(starts: Iterable[Node], parents: dict[Node, list[Node]], stop: set[Node] = frozenset()):
    """Nodes reachable upwards from ``starts`` (themselves included), not walking past ``stop``; and the
    ``stop`` nodes met."""
    seen, met, stack = set(), set(), [n for n in starts if n in parents]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for parent in parents[node]:
            if parent in stop:
                met.add(parent)
            elif parent not in seen:
                stack.append(parent)
    return seen, met


def _groups(trunk: set[Node], weights: list[torch.Tensor], parents) -> list[WeightGroup]:
    """Each weight with the trunk nodes where its gradient leaves the trunk; weights sharing a node, one group."""
    groups: list[WeightGroup] = []
    for w in weights:
        _, leave_at = _above([get_gradient_edge(w).node], parents, stop=trunk)
        if not leave_at:
            continue  # not used in this graph: no gradient, as in one full backward
        joined = [g for g in groups if leave_at & set(g.nodes)]
        group = WeightGroup([n for g in joined for n in g.nodes], [v for g in joined for v in g.weights])
        group.nodes += [n for n in leave_at if n not in group.nodes]
        group.weights.append(w)
        groups = [g for g in groups if g not in joined] + [group]
    return groups


def backward_input(outputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor | None],
                   inputs: Sequence[torch.Tensor], weights: Iterable[torch.Tensor]):
    """B: the gradients of ``inputs`` (None where one needs none), and the :class:`WeightWork` W will need.

    ``outputs`` and ``grad_outputs`` as for :func:`torch.autograd.grad` (a ``None`` grad for a scalar loss);
    ``weights``: the stage's parameters. Nothing is added into any ``.grad`` here.
    """
    weights = [w for w in weights if w.requires_grad]
    outputs, grad_outputs = list(outputs), list(grad_outputs)
    wanted = [x for x in inputs if x.requires_grad]
    if not wanted:  # nobody waits for an input gradient: W runs the whole backward
        return [None] * len(inputs), WeightWork([], outputs, grad_outputs, weights)
    parents = _graph([o.grad_fn for o in outputs if o.grad_fn is not None])
    trunk, _ = _above([get_gradient_edge(x).node for x in wanted], parents)
    groups = _groups(trunk, weights, parents)
    handles = []
    for group in groups:
        group.grads = [()] * len(group.nodes)
        for k, node in enumerate(group.nodes):
            def record(grads, group=group, k=k):
                group.grads[k] = grads
            handles.append(node.register_prehook(record))
    try:
        grads = torch.autograd.grad(outputs, wanted, grad_outputs, retain_graph=True, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    found = iter(grads)
    return [next(found) if x.requires_grad else None for x in inputs], WeightWork(groups)


def backward_weight(work: WeightWork) -> None:
    """W: every weight gradient from what B kept, *added* into ``.grad`` (as a full backward accumulates).

    Through autograd's own accumulation (``backward(..., inputs=weights)``), as a full backward does it: each
    weight's gradient is added into ``.grad`` as soon as it is computed and its buffer freed, so one layer's
    ``dW`` is alive at a time. Collecting them all first (``autograd.grad``) computes the same, but holds every
    ``dW`` at once: on a CPU each then lands in memory the allocator has just handed back to the system, and
    faulting it in again made W's matmuls 1.7× slower than the same matmuls in one backward (1024 wide).
    """
    if work.outputs:  # no trunk (the first stage): the whole backward, from the stage's outputs
        if work.weights:
            torch.autograd.backward(work.outputs, work.grad_outputs, inputs=work.weights)
    else:
        for group in work.groups:
            _from_the_trunk(group)
    work.groups, work.outputs, work.grad_outputs = [], [], []   # W ran: the graph and the kept gradients go


def _from_the_trunk(group: WeightGroup) -> None:
    """Autograd from the group's nodes, each given the gradient B recorded there, into the group's weights only."""
    edges = [(GradientEdge(node, k), g) for node, grads in zip(group.nodes, group.grads)
             for k, g in enumerate(grads) if g is not None]
    if not edges:
        return
    # A weight used at two trunk nodes: the lower node gets what B recorded there, not that plus the gradient
    # recomputed down the trunk from the upper one.
    pins = [node.register_prehook(lambda _, recorded=grads: recorded)
            for node, grads in zip(group.nodes, group.grads)] if len(group.nodes) > 1 else []
    try:
        torch.autograd.backward([e for e, _ in edges], [g for _, g in edges], inputs=group.weights)
    finally:
        for pin in pins:
            pin.remove()
