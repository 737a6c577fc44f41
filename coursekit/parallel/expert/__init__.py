"""Expert parallelism: mixture-of-experts layers with their experts spread over ranks.

* ``core`` -- the router (top-k, gates, a balancing bias), the experts, the Switch Transformer's balancing loss,
  the capacity regime, the layer on one process (:class:`MoE`), and expert parallelism: :func:`dispatch`,
  :func:`combine` (uneven all-to-alls, counted) and :class:`ExpertParallelMoE`;
* ``model`` -- a small model of MoE blocks (:func:`tiny_moe`);
* ``strategy`` -- ``"expert"``: experts over ``ep``, copies over ``dp``, each parameter averaged over its group.

Every name below is importable from here (``from coursekit.parallel.expert import MoE``).
"""

from .core import (Experts, ExpertParallelMoE, MoE, Router, Routing, combine, dispatch, keep_within_capacity,
                   load_balance_loss, nudge_bias, route)
from .model import MoEModel, tiny_moe
from .strategy import ExpertParallel

__all__ = ["Experts", "ExpertParallelMoE", "MoE", "Router", "Routing", "combine", "dispatch", "keep_within_capacity",
           "load_balance_loss", "nudge_bias", "route",
           "MoEModel", "tiny_moe", "ExpertParallel"]
