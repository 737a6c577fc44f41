"""The time of one training step for a layout: compute, the pipeline's bubble, and the communication left exposed.

:func:`step_time` puts together :func:`coursekit.costmodel.compute_time` (FLOPs at the reached speed, the
bubble) and :func:`coursekit.costmodel.communication_time` (chapter 01's network model on each axis's link).
What overlaps what is an assumption, so each is a named argument: the share of an axis's communication
hidden behind compute (``dp_overlap`` and the others, 0 = none hidden, 1 = all of it). The defaults hide
nothing: tensor and sequence parallelism's collectives sit on the critical path of every layer, and a
pipeline's sends wait on the stage before; data parallelism's all-reduce *can* run during backward
(PyTorch DDP's buckets, chapter 02), so ``dp_overlap`` is the one a learner will usually raise.

On a hardware priced by shape (:meth:`~.config.Hardware.a100`) compute is its kernels' (:mod:`.kernels`), and the
pipeline's bubble stretches each micro-batch's whole time -- its kernels and the tp, sp, ep and pipeline waits
left exposed inside it -- once; the optimizer, after the flush, is outside the bubble.

    >>> gpt2, a100 = ModelConfig.gpt2_small(), Hardware()
    >>> t = step_time(gpt2, Layout(dp=8), a100, global_batch=64)
    >>> round(t.compute * 1e3, 1), round(t.exposed_communication * 1e3, 2), t.bubble
    (45.2, 1.52, 0.0)
    >>> round((6 * 124_439_808 + 12 * 12 * 1024 * 768) * 64 * 1024 / 8 / (312e12 * 0.5) * 1e3, 1)
    45.2
"""

from __future__ import annotations

from dataclasses import dataclass

from .comm import PerAxis, axis_network, communication_time
from .compute import bubble_fraction, compute_time
from .config import Hardware, Layout, ModelConfig
from .overlap import shares

__all__ = ["TrainingStepTime", "step_time"]


@dataclass(frozen=True)
class TrainingStepTime:
    """Seconds of one step: ``compute + bubble + exposed_communication`` = ``total``; ``communication`` is every
    axis's time before overlap (:class:`coursekit.costmodel.comm.PerAxis`), ``exposed`` what is left of it."""

    compute: float
    bubble: float
    communication: PerAxis
    exposed: PerAxis

    @property
    def exposed_communication(self) -> float:
        return self.exposed.total

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.exposed.total

    @property
    def hidden(self) -> PerAxis:
        """Each axis's communication hidden behind compute: ``communication − exposed``."""
        return PerAxis(**{axis: getattr(self.communication, axis) - getattr(self.exposed, axis)
                          for axis in ("dp", "tp", "pp", "sp", "ep")})

    def parts(self) -> list[str]:
        """One line per part of the step, what each axis's traffic costs and how much of it is hidden."""
        lines = [f"compute {self.compute:.3g} s", f"bubble {self.bubble:.3g} s"]
        for axis in ("dp", "tp", "pp", "sp", "ep"):
            if getattr(self.communication, axis):
                lines.append(f"{axis}: {getattr(self.communication, axis):.3g} s of traffic, "
                             f"{getattr(self.hidden, axis):.3g} s hidden, {getattr(self.exposed, axis):.3g} s exposed")
        return lines + [f"total {self.total:.3g} s"]


def _usage(layout: Layout, hardware: Hardware, axis: str) -> float:
    """The share of ``axis``'s hidden traffic's time its compute loses: its link's ``*_processor_usage``."""
    if not (hardware.intra_processor_usage or hardware.net_processor_usage):
        return 0.0
    link = axis_network(layout, hardware, axis)[1]
    return hardware.intra_processor_usage if link == "intra" else hardware.net_processor_usage


def step_time(config: ModelConfig, layout: Layout, hardware: Hardware, global_batch: int,
              dp_overlap: float = 0.0, tp_overlap: float = 0.0, pp_overlap: float = 0.0, sp_overlap: float = 0.0,
              efficiency: float | None = None, bytes_per_element: int = 2, ep_overlap: float = 0.0,
              optimizer: str = "adam", overlap: str = "declared", tp_comm_overlap: bool = False,
              async_p2p: bool = True, **assumptions) -> TrainingStepTime:
    """One step of ``global_batch`` sequences on ``layout``: the time half of "step time and memory for a layout".

    ``global_batch`` sequences of ``config.seq_len`` tokens are cut into ``dp`` slices of
    ``layout.micro_batches`` micro-batches each (it must divide); ``efficiency``: :func:`compute_time`'s
    (default ``hardware.efficiency``); ``bytes_per_element``: gradients and activations on the wire (16-bit);
    ``assumptions``: :func:`coursekit.costmodel.step_collectives`' (``attention="ring"`` or ``"ulysses"``
    along ``sp``, ``gather_logits``, ``vocab_parallel_loss``, and an MoE's ``imbalance``, which also makes the
    busiest rank's experts compute more: :func:`compute_time`). ``*_overlap``: the share of that axis's
    communication hidden behind compute, 0 to 1 (``ep_overlap``: the experts' all-to-alls, which Megatron Core
    overlaps with another micro-batch's compute, ``--overlap-moe-expert-parallel-comm``). ``optimizer``
    (``"adam"``, ``"sgd"``) and ``bytes_per_element`` also size the per-op and memory-bound terms where the
    hardware has them (:mod:`~.overhead`: activations in that precision).

    Hidden traffic is not free where the hardware says so: its compute loses ``*_processor_usage`` of the traffic's
    time (Calculon's, on :meth:`~.config.Hardware.a100` and :meth:`~.config.Hardware.h100`), counted as exposed.

    ``overlap="derived"``: the shares are not taken from the ``*_overlap`` arguments but derived from the step's
    parts (:func:`~.overlap.shares`: dp hidden up to the compute it can run beside, tp exposed unless
    ``tp_comm_overlap``, the pipeline's sends hidden when ``async_p2p``); :meth:`TrainingStepTime.parts` prints them.
    """
    if overlap not in ("declared", "derived"):
        raise ValueError(f"overlap is 'declared' (the *_overlap arguments) or 'derived' (from the step's parts); "
                         f"got {overlap!r}.")
    overlaps = {"dp": dp_overlap, "tp": tp_overlap, "pp": pp_overlap, "sp": sp_overlap, "ep": ep_overlap}
    for axis, share in overlaps.items():
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{axis}_overlap is the share of {axis}'s communication hidden behind compute: "
                             f"between 0 and 1 (got {share}).")
    if "seq_len" in assumptions:
        raise TypeError("step_time's sequences are config.seq_len tokens long (its FLOPs and its traffic): pass a "
                        "ModelConfig with that seq_len instead of seq_len=.")
    per_rank = layout.dp * layout.micro_batches
    if global_batch % per_rank:
        raise ValueError(f"global_batch {global_batch} does not split into dp = {layout.dp} slices of "
                         f"{layout.micro_batches} micro-batches: use a multiple of {per_rank}.")
    compute = compute_time(config, layout, hardware, global_batch, efficiency, assumptions.get("imbalance", 1.0),
                           bytes_per_element, optimizer)
    communication = communication_time(config, layout, hardware, global_batch // per_rank, bytes_per_element,
                                       **assumptions)
    if overlap == "derived":
        stage_layers = -(-config.layers // layout.pp)
        overlaps = shares(layout, communication, compute.compute, stage_layers, tp_comm_overlap, async_p2p)
    exposed = PerAxis(**{axis: getattr(communication, axis) * (1 - share + share * _usage(layout, hardware, axis))
                         for axis, share in overlaps.items()})
    # priced by shape, the bubble is (p - 1)/(v·m) of a micro-batch's *whole* time (Narayanan et al. 2021, section
    # 2.2: of t_f + t_b): what each micro-batch waits for on tp, sp, ep and the pipeline's sends is stretched with
    # its kernels. (One efficiency for the step is an end-to-end share, with these inside it: left as it was.)
    f = bubble_fraction(layout) if hardware.by_shape else 0.0
    inside = exposed.tp + exposed.sp + exposed.ep + exposed.pp
    return TrainingStepTime(compute.compute, compute.bubble + inside * f / (1 - f), communication, exposed)
