"""Expert parallelism: mixture-of-experts layers with their experts spread over ranks.

* ``core`` -- the router (top-k, gates, a balancing bias), the experts, the Switch Transformer's balancing loss,
  the capacity regime, the layer on one process (:class:`MoE`), and expert parallelism: :func:`dispatch`,
  :func:`combine` (uneven all-to-alls, counted) and :class:`ExpertParallelMoE`;
* ``model`` -- a small model of MoE blocks (:func:`tiny_moe`) and the course transformer with MoE blocks
  (:func:`moe_transformer`: what ``coursekit train --experts E`` trains);
* ``strategy`` -- ``"expert"``: experts over ``ep``, copies over ``dp``, each parameter averaged over its group;
* ``torch`` -- the same layer in PyTorch's production stack: torchtitan's dropless MoE with expert parallelism, to
  run side by side (needs ``pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3``; imported only when used).

Every name below is importable from here (``from coursekit.parallel.expert import MoE``).
"""

from .core import (Experts, ExpertParallelMoE, MoE, Router, Routing, combine, dispatch, keep_within_capacity,
                   load_balance_loss, nudge_bias, route)
from .model import MoEModel, MoETransformer, moe_transformer, tiny_moe
from .strategy import ExpertParallel
from .torch import TORCHTITAN_INSTALL, gelu_grouped_experts, torchtitan_gradients, torchtitan_moe, torchtitan_step

__all__ = ["Experts", "ExpertParallelMoE", "MoE", "Router", "Routing", "combine", "dispatch", "keep_within_capacity",
           "load_balance_loss", "nudge_bias", "route",
           "MoEModel", "tiny_moe", "MoETransformer", "moe_transformer", "ExpertParallel",
           "TORCHTITAN_INSTALL", "torchtitan_moe", "torchtitan_step", "torchtitan_gradients", "gelu_grouped_experts"]
