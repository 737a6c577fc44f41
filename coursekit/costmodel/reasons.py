"""The planner's one-line reasons: each decision of a layout, and the numbers that make it right or wrong.

Every sentence is computed, never canned: the time an axis's collectives take on the link it uses (and on
the other link, for tp), the bubble's share of the step at this many micro-batches, what ZeRO or
recomputation saves and costs, and -- when the layout does not fit -- its largest term against the GPU.

    >>> from coursekit.costmodel import Hardware, Layout, ModelConfig, evaluate
    >>> c = evaluate(ModelConfig.gpt2_small(), Layout(pp=4, micro_batches=8), Hardware(), global_batch=8)
    >>> [r for r in c.reasons if r.startswith("pp")][0]
    'pp = 4: the bubble costs 27% at m = 8 (1f1b, 4.23 ms) -- raise m; without a pipeline the model states would be 2.0 GB per GPU'
    >>> round(3 / 11, 2)                   # (p − 1)/(m + p − 1)
    0.27
"""

from __future__ import annotations

from dataclasses import replace

from .comm import axis_network, communication_time, group_network
from .compute import bubble_fraction, compute_time
from .config import Hardware, Layout, ModelConfig
from .gpu_memory import GPUMemory, memory_per_gpu, rank_state_bytes
from .step import TrainingStepTime

__all__ = ["layout_reasons", "gb", "ms", "duration"]

LINKS = {"intra": "inside the node (NVLink)", "net": "across nodes (InfiniBand)",
         "intra+net": "across nodes (NVLink and InfiniBand)"}


def gb(n: float) -> str:
    """Bytes as GB, 1 decimal (10⁹, as GPU memory is sold)."""
    return f"{n / 1e9:.1f} GB"


def ms(seconds: float) -> str:
    """Seconds as milliseconds, 3 significant digits."""
    return f"{seconds * 1e3:.3g} ms"


def duration(seconds: float) -> str:
    """Milliseconds below a second, else seconds; 3 significant digits: ``4.23 ms``, ``25.6 s``."""
    return ms(seconds) if seconds < 1 else f"{seconds:.3g} s"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def _tp_reason(config, layout, hardware, global_batch, time, **assumptions) -> str:
    t, seconds = layout.tp, time.communication.tp
    _, link = axis_network(layout, hardware, "tp")
    slow = replace(hardware, intra_bandwidth=hardware.bandwidth, intra_latency=hardware.latency)
    fast = replace(hardware, bandwidth=hardware.intra_bandwidth, latency=hardware.intra_latency)
    micro = global_batch // (layout.dp * layout.micro_batches)
    comm = {k: v for k, v in assumptions.items()
            if k in ("attention", "gather_logits", "vocab_parallel_loss", "imbalance")}
    if link == "intra":
        other = communication_time(config, layout, slow, micro, **comm).tp
        return (f"tp = {t} {LINKS[link]}: its all-reduces per layer take {duration(seconds)} "
                f"({_share(seconds, time.total)} of the step); across nodes they would take {duration(other)}")
    other = communication_time(config, layout, fast, micro, **comm).tp
    return (f"tp = {t} {LINKS[link]}: its all-reduces per layer take {duration(seconds)} "
            f"({_share(seconds, time.total)} of the step), against {duration(other)} if they stayed on NVLink")


def _pp_reason(config, layout, hardware, time) -> str:
    """The bubble at this m, and what the same tp, dp and ZeRO would hold without the pipeline."""
    p, m = layout.pp, layout.micro_batches
    f = bubble_fraction(layout)
    advice = " -- raise m" if f > 0.1 else ""
    flat = rank_state_bytes(config, replace(layout, pp=1)).total
    without = (f"without a pipeline the model states alone would need {gb(flat)} per GPU > {gb(hardware.memory)}"
               if flat > hardware.memory else f"without a pipeline the model states would be {gb(flat)} per GPU")
    return (f"pp = {p}: the bubble costs {100 * f:.0f}% at m = {m} ({layout.schedule}, {duration(time.bubble)}){advice}; "
            f"{without}")


def _dp_reason(layout, hardware, time) -> str:
    once = layout.sp > 1 and layout.zero == 0          # one all-reduce over the flattened dp×sp group
    _, link = group_network(layout, hardware, ("sp", "dp") if once else ("dp",))
    what = "all-reduce of the gradients takes" if layout.zero == 0 else f"ZeRO-{layout.zero} collectives take"
    if once:
        what = f"one all-reduce of the gradients over dp×sp = {layout.dp * layout.sp} ranks takes"
    if layout.ep > 1:
        kind, verb = ("all-reduce", "takes") if layout.zero == 0 else (f"ZeRO-{layout.zero} collectives", "take")
        what = (f"{kind} of the dense gradients (each expert lives on one rank: nothing to sum) {verb}"
                if layout.dp == layout.ep else
                f"{kind} of the dense gradients and the experts' (over dp/ep = {layout.dp // layout.ep}) take")
    return (f"dp = {layout.dp} {LINKS[link]}: the {what} {duration(time.communication.dp)} "
            f"({_share(time.communication.dp, time.total)} of the step)")


def _ep_reason(config, layout, hardware, memory, time, global_batch, imbalance) -> str:
    """How many experts a GPU keeps, its model states against ep = 1's, and what the all-to-alls cost."""
    _, link = axis_network(layout, hardware, "ep")
    micro = global_batch // (layout.dp * layout.micro_batches)
    alone = memory_per_gpu(config, replace(layout, ep=1), micro, imbalance=imbalance)
    verdict = (f"; without it {gb(alone.total)} > {gb(hardware.memory)}: it would not fit"
               if alone.total > hardware.memory >= memory.total else "")
    routing = f" at imbalance {imbalance:g}" if imbalance != 1 else ""
    return (f"ep = {layout.ep} {LINKS[link]}: each GPU keeps {config.experts // layout.ep} of {config.experts} experts, "
            f"model states {gb(memory.params + memory.grads + memory.optimizer)} per GPU instead of "
            f"{gb(alone.params + alone.grads + alone.optimizer)}{verdict}; the dispatch and combine all-to-alls "
            f"take {duration(time.communication.ep)}{routing} ({_share(time.communication.ep, time.total)} of the step)")


def _zero_reason(config, layout, hardware, memory, global_batch, imbalance=1.0) -> str:
    micro = global_batch // (layout.dp * layout.micro_batches)
    plain = memory_per_gpu(config, replace(layout, zero=0), micro, imbalance=imbalance)
    saved = plain.total - memory.total
    verdict = (f"; without it {gb(plain.total)} > {gb(hardware.memory)}: it would not fit"
               if plain.total > hardware.memory >= memory.total else "")
    return (f"ZeRO-{layout.zero} over dp = {layout.dp}: model states "
            f"{gb(memory.params + memory.grads + memory.optimizer + memory.buffers)} per GPU instead of "
            f"{gb(plain.params + plain.grads + plain.optimizer)} ({gb(saved)} saved){verdict}")


def _recompute_reason(config, layout, hardware, global_batch, memory, imbalance=1.0) -> str:
    micro = global_batch // (layout.dp * layout.micro_batches)
    kept = memory_per_gpu(config, replace(layout, recompute="none"), micro, imbalance=imbalance)
    extra = (compute_time(config, layout, hardware, global_batch, imbalance=imbalance).compute
             - compute_time(config, replace(layout, recompute="none"), hardware, global_batch,
                            imbalance=imbalance).compute)
    return (f"recompute = {layout.recompute}: activations {gb(memory.activations)} instead of "
            f"{gb(kept.activations)}, for {duration(extra)} more compute")


def _fit_reason(memory: GPUMemory, hardware: Hardware, fits: bool) -> str:
    terms = {"parameters": memory.params, "gradients": memory.grads, "optimizer state": memory.optimizer,
             "activations": memory.activations, "ZeRO-3's gathered layer": memory.buffers}
    largest = max(terms, key=terms.get)
    if fits:
        return (f"fits: {gb(memory.total)} of {gb(hardware.memory)} (largest term: {largest} "
                f"{gb(terms[largest])})")
    rest = memory.total - terms[largest]
    return (f"does not fit: {largest} {gb(terms[largest])} > {gb(hardware.memory)} - {gb(rest)} for the rest "
            f"({gb(memory.total)} in all)")


def layout_reasons(config: ModelConfig, layout: Layout, hardware: Hardware, global_batch: int, memory: GPUMemory,
                   time: TrainingStepTime, fits: bool, **assumptions) -> tuple[str, ...]:
    """One line per decision of ``layout`` (its axes of degree > 1, ZeRO, recomputation) and one on memory."""
    imbalance = assumptions.get("imbalance", 1.0)
    lines = [f"step {duration(time.total)}: compute {duration(time.compute)}, bubble {duration(time.bubble)}, exposed "
             f"communication {duration(time.exposed_communication)}"]
    if layout.tp > 1:
        lines.append(_tp_reason(config, layout, hardware, global_batch, time, **assumptions))
    if layout.pp > 1:
        lines.append(_pp_reason(config, layout, hardware, time))
    if layout.dp > 1:
        lines.append(_dp_reason(layout, hardware, time))
    if layout.sp > 1:
        _, link = axis_network(layout, hardware, "sp")
        lines.append(f"sp = {layout.sp} {LINKS[link]}: attention's blocks cost {duration(time.communication.sp)}, each "
                     f"rank keeps 1/{layout.sp} of the activations")
    if layout.ep > 1:
        lines.append(_ep_reason(config, layout, hardware, memory, time, global_batch, imbalance))
    if layout.zero:
        lines.append(_zero_reason(config, layout, hardware, memory, global_batch, imbalance))
    if layout.recompute != "none":
        lines.append(_recompute_reason(config, layout, hardware, global_batch, memory, imbalance))
    lines.append(_fit_reason(memory, hardware, fits))
    return tuple(lines)
