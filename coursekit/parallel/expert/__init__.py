"""Expert parallelism: mixture-of-experts layers with their experts spread over ranks.

* ``core`` -- the router (top-k, gates, a balancing bias), the experts, the Switch Transformer's balancing loss,
  the capacity regime, the layer on one process (:class:`MoE`), and expert parallelism: :func:`dispatch`,
  :func:`combine` (uneven all-to-alls, counted) and :class:`ExpertParallelMoE`.

Every name below is importable from here (``from coursekit.parallel.expert import MoE``).
"""

from .core import (Experts, ExpertParallelMoE, MoE, Router, Routing, combine, dispatch, keep_within_capacity,
                   load_balance_loss, nudge_bias)

__all__ = ["Experts", "ExpertParallelMoE", "MoE", "Router", "Routing", "combine", "dispatch", "keep_within_capacity",
           "load_balance_loss", "nudge_bias"]
