"""The same expert-parallel layer in PyTorch's production stack: torchtitan 0.3.0's dropless MoE, side by side.

:func:`torchtitan_moe` builds torchtitan's ``MoE`` (``torchtitan.models.common.moe``) with the weights of a
coursekit :class:`~coursekit.parallel.expert.MoE` and its experts spread over a group of ranks, each rank holding
``E / ep`` of them; :func:`torchtitan_step` runs one forward and backward and gives the output and the gradients
in coursekit's layout. Tested equal to :class:`~coursekit.parallel.expert.ExpertParallelMoE` and to the
one-process layer (``tests/test_parallel_expert_torch.py``).

=====================================  =====================================================================
coursekit                              torchtitan 0.3.0 (``torchtitan.models.common``)
=====================================  =====================================================================
``Router``: softmax, top-k, ``bias``   ``TokenChoiceTopKRouter(score_func="softmax")``, ``MoE.expert_bias_E``
                                       (chooses, never weighs, as ours)
``nudge_bias`` (all-reduced counts)    ``MoE.tokens_per_expert_E``, summed and applied by the trainer's
                                       optimizer pre-step hook (not run here)
``load_balance_loss`` (Switch)         none: torchtitan balances with the bias alone
``route`` / ``Routing``                ``LocalTokenDispatcher._local_reorder`` (stable argsort by expert)
``dispatch``: counts, then rows        ``AllToAllTokenDispatcher.dispatch``: counts all-to-all, rows
                                       all-to-all (uneven), ``_permute`` to expert-major
``Experts`` (GELU, ``w1 (E, d, F)``)   ``GroupedExperts`` (SwiGLU in bf16, ``w1_EFD (E, F, d)``): see below
``combine``: all-to-all back, gates    ``AllToAllTokenDispatcher.combine``: ``_unpermute``, all-to-all,
                                       gates, ``deterministic_scatter_add``
``ExpertParallelMoE(moe, group)``      expert weights ``DTensor`` ``Shard(0)`` on an ``("ep",)`` mesh,
                                       ``token_dispatcher.wire_meshes(ep_mesh=...)``
``capacity_factor``                    none: dropless only
=====================================  =====================================================================

What differs, and how it is matched:

* The experts. torchtitan's ``GroupedExperts`` is a SwiGLU MLP, ``w2(silu(w1 x) * w3 x)``, computed in bf16;
  ours is ``gelu(x w1) w2`` in fp32, and no choice of ``w3`` turns one into the other. So by default the experts
  are :func:`gelu_grouped_experts`: torchtitan's class with its forward replaced by ours, still through
  torchtitan's own grouped matmul (``GroupedExperts._grouped_mm``, the seam its fp8 converters override). The
  router, dispatch and combine are torchtitan's, unchanged. With ``w3`` given, the experts are torchtitan's
  stock SwiGLU in bf16 (compared against a SwiGLU variant of ours in the tests, within bf16's rounding).
* The weights are stored transposed: their ``w1_EFD[e] = w1[e].T`` and ``w2_EDF[e] = w2[e].T``.
* Wiring. torchtitan's trainer builds a ``ParallelDims`` mesh and ``parallelize`` wraps the experts in
  ``local_map``; here the experts' weights are made ``DTensor`` ``Shard(0)`` on a one-axis ``("ep",)`` mesh and
  the dispatcher is handed that mesh (``wire_meshes``), which is what ``RoutedExperts.parallelize`` does. The
  router stays a plain tensor on every rank, so its gradient is this rank's part, summed over ranks by whatever
  data parallelism runs beside it -- as :class:`ExpertParallelMoE`'s router gradient is.
* ``parallelism.spmd_backend = "partial_dtensor"`` (one of torchtitan's three): its default ``"spmd_types"``
  needs the trainer's global meshes, and its uneven all-to-all is ``dist.all_to_all`` on lists, which gloo
  refuses for pieces of unequal sizes; ``"partial_dtensor"`` calls ``all_to_all_single``, which gloo runs.

Install (``make lab`` and ``make test`` do; its ~60 training dependencies are not needed here)::

    pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["TORCHTITAN_INSTALL", "torchtitan_moe", "torchtitan_step", "torchtitan_gradients",
           "gelu_grouped_experts"]

TORCHTITAN_INSTALL = "pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3"


class _Unavailable:
    """Stands in for a torchtitan name whose module needs a package the MoE never uses."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"stubbed by coursekit.parallel.expert.torch: install torchtitan's full dependencies "
                           f"to use it ({TORCHTITAN_INSTALL} installs only what its MoE needs)")


def _stub_unless_importable(needs: str, module: str, names: list[str]) -> None:
    """Put an empty ``module`` in ``sys.modules`` if the package it ``needs`` is missing (and nothing is there)."""
    if importlib.util.find_spec(needs) is None and module not in sys.modules:
        stub = types.ModuleType(module, f"stub: {module} imports {needs}, which torchtitan's MoE does not use")
        stub.__dict__.update({name: _Unavailable for name in names})
        sys.modules[module] = stub


def _torchtitan():
    """torchtitan's MoE modules (Python imports them once); a clear ImportError naming the install if absent."""
    if importlib.util.find_spec("torchtitan") is None or importlib.util.find_spec("spmd_types") is None:
        raise ImportError(f"torchtitan's MoE is not installed; install it with: {TORCHTITAN_INSTALL}")
    # torchtitan.config imports its command-line parser (tyro) and the token dispatchers import a GPU-only
    # dispatcher (triton); the MoE uses neither. Stubbing the two modules spares installing them (a fake
    # `triton` itself would not do: torch._dynamo probes it).
    _stub_unless_importable("tyro", "torchtitan.config.manager", ["ConfigManager"])
    _stub_unless_importable("triton", "torchtitan.distributed.minimal_async_ep",
                            ["combine_op", "dispatch_op", "init_buffer", "MinimalAsyncEPDispatchMetadata"])
    # The router asks autocast for fp32 so its gate stays fp32 under bf16 training; CPU autocast knows no fp32
    # and says so on every call before disabling itself, which changes nothing for fp32 inputs.
    warnings.filterwarnings("ignore", message="In CPU autocast, but the target dtype is not supported")
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.common import linear, moe, token_dispatcher
    return types.SimpleNamespace(moe=moe, Linear=linear.Linear, set_spmd_backend=set_spmd_backend,
                                 AllToAllTokenDispatcher=token_dispatcher.AllToAllTokenDispatcher)


@functools.cache
def gelu_grouped_experts() -> type:
    """torchtitan's ``GroupedExperts`` with coursekit's MLP, ``gelu(x w1) w2`` in the input's dtype, no ``w3``.

    A subclass with its own ``Config``, as torchtitan's gpt-oss experts are: ``Config.build()`` makes this class.
    """
    from dataclasses import dataclass

    GroupedExperts = _torchtitan().moe.GroupedExperts

    class GeluGroupedExperts(GroupedExperts):
        @dataclass(kw_only=True, slots=True)
        class Config(GroupedExperts.Config):
            pass

        def __init__(self, config):
            super().__init__(config)
            del self.w3_EFD                            # SwiGLU's third matrix: our MLP has none

        def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
            w1, w2 = (w.to_local() if hasattr(w, "to_local") else w for w in (self.w1_EFD, self.w2_EDF))
            offsets = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)   # as theirs
            hidden = F.gelu(self._grouped_mm(A=x_RD, B_t=w1.transpose(-2, -1), offs=offsets))
            return self._grouped_mm(A=hidden, B_t=w2.transpose(-2, -1), offs=offsets)

    return GeluGroupedExperts


def _config(titan, n_experts: int, d_model: int, d_ff: int, k: int, swiglu: bool):
    """torchtitan's MoE config: softmax top-k, no route normalisation or scale, no shared expert, a bias."""
    experts = (titan.moe.GroupedExperts if swiglu else gelu_grouped_experts()).Config(
        dim=d_model, hidden_dim=d_ff, num_experts=n_experts)
    router = titan.moe.TokenChoiceTopKRouter.Config(
        num_experts=n_experts, top_k=k, score_func="softmax", route_norm=False, route_scale=1.0,
        gate=titan.Linear.Config(in_features=d_model, out_features=n_experts, bias=False))
    dispatcher = titan.AllToAllTokenDispatcher.Config(num_experts=n_experts, top_k=k)
    return titan.moe.MoE.Config(
        num_experts=n_experts, router=router, shared_experts=None,
        routed_experts=titan.moe.RoutedExperts.Config(inner_experts=experts, token_dispatcher=dispatcher),
        load_balance_coeff=1e-3)                        # any value: it only makes the layer keep expert_bias_E


def torchtitan_moe(moe, group=None, w3: torch.Tensor | None = None) -> nn.Module:
    """torchtitan's ``MoE`` with ``moe``'s router (weight and bias) and experts, spread over ``group``
    (default: the world): this rank holds experts ``r·E/ep ... (r+1)·E/ep - 1``, as :class:`ExpertParallelMoE`.

    ``moe``: a dropless coursekit :class:`~coursekit.parallel.expert.MoE`. ``w3``: ``(E, d, d_ff)``, coursekit's
    layout: torchtitan's stock SwiGLU experts in bf16 with this third matrix; None: our GELU MLP (see the module).
    Call it on ``(batch, tokens, d)``, or use :func:`torchtitan_step`.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    titan = _torchtitan()
    if moe.capacity_factor is not None:
        raise ValueError(f"torchtitan's MoE is dropless; this layer drops tokens (capacity_factor "
                         f"{moe.capacity_factor}): compare with MoE(..., capacity_factor=None)")
    group = group if group is not None else dist.group.WORLD
    rank, ep = dist.get_rank(group), dist.get_world_size(group)
    n_experts, (d_model, d_ff) = moe.n_experts, moe.experts.w1.shape[1:]
    if n_experts % ep:
        raise ValueError(f"{n_experts} experts over ep = {ep} ranks: use an ep that divides the expert count")
    titan.set_spmd_backend("partial_dtensor")          # see the module's docstring: gloo's all-to-all
    device = moe.experts.w1.device
    with torch.device(device):
        layer = _config(titan, n_experts, d_model, d_ff, moe.router.k, w3 is not None).build()
    mesh = DeviceMesh.from_group(group, device.type, mesh_dim_names=("ep",))
    local = slice(rank * (n_experts // ep), (rank + 1) * (n_experts // ep))
    ours = {"w1_EFD": moe.experts.w1, "w2_EDF": moe.experts.w2, "w3_EFD": w3}
    experts = layer.routed_experts.inner_experts
    for name, weight in ours.items():
        if hasattr(experts, name):                     # theirs is ours transposed: (E, d_ff, d) for (E, d, d_ff)
            rows = weight.detach()[local].transpose(1, 2).contiguous()
            setattr(experts, name, nn.Parameter(DTensor.from_local(rows, mesh, [Shard(0)])))
    with torch.no_grad():
        layer.router.gate.weight.copy_(moe.router.score.weight)
        layer.expert_bias_E.copy_(moe.router.bias)
    layer.routed_experts.token_dispatcher.wire_meshes(ep_mesh=mesh)   # what RoutedExperts.parallelize does
    return layer


def torchtitan_gradients(layer: nn.Module) -> dict[str, torch.Tensor]:
    """The layer's gradients in coursekit's layout: ``router`` ``(E, d)`` (this rank's part), ``w1`` ``(E/ep, d,
    d_ff)``, ``w2`` ``(E/ep, d_ff, d)`` (and ``w3``) of this rank's experts."""
    grads = {"router": layer.router.gate.weight.grad}
    for name, param in layer.routed_experts.inner_experts.named_parameters():
        grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
        grads[name[:2]] = grad.transpose(1, 2)
    return grads


def torchtitan_step(layer: nn.Module, x: torch.Tensor, grad_output: torch.Tensor):
    """One forward and backward of ``layer`` on this rank's tokens ``x`` ``(T, d)``, ``grad_output`` flowing
    back: ``(output (T, d), gradients)``, the gradients as :func:`torchtitan_gradients` plus ``x``'s."""
    x = x.detach().clone().requires_grad_()
    out = layer(x.unsqueeze(0)).squeeze(0)               # torchtitan wants (batch, tokens, d)
    out.backward(grad_output)
    return out.detach(), {"x": x.grad, **torchtitan_gradients(layer)}
