"""A parallelism as a plan: a table from module path to what replaces the module there (torchtitan's form).

The course transformer is written once (:class:`coursekit.models.Block`, :class:`~coursekit.models.Transformer`)
and its parts are slots. A dimension that splits the model does not rewrite it: it names the slots it replaces.

    >>> from coursekit.parallel.tensor.plan import TRANSFORMER_PLAN
    >>> sorted(TRANSFORMER_PLAN)[:2]
    ['blocks.*.attn.proj', 'blocks.*.attn.qkv']

A plan is a dict ``{pattern: style}``. ``pattern`` is a module path, ``*`` standing for any name in it
(``"blocks.*.fc"``); ``style(module, parent, group)`` returns the module to put in that slot (``parent``: the
module holding it, for what the slot alone does not say, such as the number of heads). picotron writes the
same thing as a seven-row table ``(module, projection, column/row)``; torchtitan as a dict from path to a
``ParallelStyle``, given to ``parallelize_module``.
"""

from __future__ import annotations

import copy
from fnmatch import fnmatchcase
from typing import Callable

import torch
import torch.nn as nn

__all__ = ["Style", "parallelize_module", "with_parts", "FunctionCore", "with_core"]

Style = Callable[[nn.Module, nn.Module, object], nn.Module]


def parallelize_module(model: nn.Module, plan: dict[str, Style], group=None) -> nn.Module:
    """Replace, in place, every module of ``model`` whose path a row of ``plan`` names; returns ``model``.

    The model is walked in its own order (``named_modules``), so every rank builds its pieces in the same
    order; a path takes the first row that matches it, and nothing inside a replaced module is visited.
    A row that names no module is a ``ValueError``.
    """
    replaced: list[str] = []
    for path, module in list(model.named_modules()):
        if not path or any(path.startswith(done + ".") for done in replaced):
            continue
        style = next((style for pattern, style in plan.items() if fnmatchcase(path, pattern)), None)
        if style is None:
            continue
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        setattr(parent, name, style(module, parent, group))
        replaced.append(path)
    unused = [pattern for pattern in plan if not any(fnmatchcase(path, pattern) for path in replaced)]
    if unused:
        raise ValueError(f"the plan's rows {unused} name no module of this {type(model).__name__}: "
                         f"give paths of its named_modules(), such as {[p for p, _ in model.named_modules()][1:4]}.")
    return model


def with_parts(module: nn.Module, **parts: nn.Module) -> nn.Module:
    """A copy of ``module`` holding the same parameters and submodules, except ``parts`` (name: new module).

    For a plan that must leave the model it is given as it was, while sharing its parameters: the copy's
    gradients land on the model's own tensors, under the same names.
    """
    new = copy.copy(module)
    for key, value in vars(module).items():  # the copy's own tables (submodules, hooks); the tensors stay shared
        if isinstance(value, (dict, set)):
            new.__dict__[key] = copy.copy(value)
    for name, part in parts.items():
        setattr(new, name, part)
    return new


class FunctionCore(nn.Module):
    """Attention's core given as a function ``attend(q, k, v)``, for the slot ``attn.core`` of a block (ring
    attention over a sequence split, Ulysses, chunk-local attention)."""

    def __init__(self, attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.attend = attend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attend(q, k, v)


def with_core(block: nn.Module, attend: Callable) -> nn.Module:
    """``block`` (a :class:`coursekit.models.Block`) with ``attend(q, k, v)`` as its attention's core; its
    parameters shared, ``block`` itself unchanged."""
    return with_parts(block, attn=with_parts(block.attn, core=FunctionCore(attend)))
