"""What communication hides behind compute, derived from the step's parts instead of declared per axis.

:func:`~.step.step_time` takes a share of each axis's traffic as hidden (``dp_overlap`` and the others, 0 to 1),
an assumption a learner must type. With ``overlap="derived"`` the shares come from what each axis's traffic can
run beside, under the rules the frameworks follow:

* **dp, ZeRO 0 to 2** -- the gradients' reduce runs bucket by bucket during the backward of the micro-batch
  that completes them, the last (PyTorch DDP's buckets, Li et al. 2020; Megatron-LM's ``--overlap-grad-reduce``):
  hidden up to that backward, two thirds of a micro-batch's compute (backward costs twice the forward: two
  matmuls for one, Kaplan et al. 2020, section 2.1); the rest waits. ZeRO-1 and 2's gather of the updated
  parameters is booked with it (Megatron's ``--overlap-param-gather`` hides it behind the next forward).
* **dp, ZeRO 3 (FSDP)** -- each layer's parameters are gathered while the layer before computes (FSDP's
  prefetch, Zhao et al. 2023, section 3.3), every micro-batch, so the whole of the compute is there to hide behind;
  what cannot hide is the first layer's gather, one layer's share of the traffic.
* **tp** -- on the critical path of every layer (Shoeybi et al. 2019: each all-reduce's output is the next
  matmul's input): exposed, unless a communication-overlap kernel splits the matmuls to run beside it
  (``tp_comm_overlap``: NeMo's ``ub_tp_comm_overlap``, Transformer Engine's userbuffers), then hidden.
* **pp** -- asynchronous sends (``async_p2p``: Megatron-LM's ``--overlap-p2p-communication``, torch.distributed's
  ``isend``) hidden behind the next micro-batch's compute; synchronous ones (Megatron-LM of 2022) exposed.
* **sp** (ring attention) and **ep** -- exposed: their overlap depends on the kernel's blocking, not priced here.

    >>> shares(Layout(dp=8), PerAxis(dp=3.0), compute=6.0)            # 3 s of gradients behind 4 s of backward
    {'dp': 1.0, 'tp': 0.0, 'pp': 1.0, 'sp': 0.0, 'ep': 0.0}
"""

from __future__ import annotations

from .config import Layout
from .rows import PerAxis

__all__ = ["shares", "BACKWARD_SHARE"]

BACKWARD_SHARE = 2 / 3      # of a micro-batch's compute: backward is twice the forward


def _hidden(traffic: float, behind: float, unhidable: float = 0.0) -> float:
    """The share of ``traffic`` seconds hidden behind ``behind`` seconds of compute, ``unhidable`` of it never."""
    if traffic <= 0:
        return 1.0
    return max(0.0, min(traffic - unhidable, behind)) / traffic


def shares(layout: Layout, communication: PerAxis, compute: float, layers: int = 1, tp_comm_overlap: bool = False,
           async_p2p: bool = True) -> dict[str, float]:
    """Each axis's hidden share (0 to 1) for a step of ``compute`` seconds over ``layout.micro_batches``
    micro-batches (the pipeline's bubble aside), ``layers`` on this stage (FSDP's first gather: one of them)."""
    per_micro = compute / layout.micro_batches
    if layout.zero == 3:
        dp = _hidden(communication.dp, compute, communication.dp / max(layers, 1))
    else:
        dp = _hidden(communication.dp, BACKWARD_SHARE * per_micro)
    return {"dp": dp, "tp": 1.0 if tp_comm_overlap else 0.0, "pp": 1.0 if async_p2p else 0.0, "sp": 0.0, "ep": 0.0}
