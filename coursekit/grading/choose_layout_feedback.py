"""Exercise 08's feedback: what does not fit, or where a layout's step time goes that the planner's best does not spend.

Every sentence is computed from the cost model's numbers for the learner's layout (a
:class:`~coursekit.costmodel.Candidate`, as :func:`~coursekit.costmodel.evaluate` prices it):

* :func:`memory_advice` -- the memory per GPU by term (parameters, gradients, optimizer state, activations,
  ZeRO-3's gathered layer) against the GPU, and what shrinks the largest: a ZeRO stage over dp, tp or pp for
  the model states; more micro-batches, recomputation or tp + sequence parallelism for the activations;
* :func:`slow_advice` -- the step against the best (compute, bubble, exposed communication per axis), and the
  term that costs the most beyond the best's: a tp group crossing nodes, the bubble at this m, the exposed dp
  collectives (ZeRO-3's gathers every micro-batch), recomputation that memory did not need;
* :func:`tp_advice` -- what a tp group costs, across nodes against the same all-reduces on NVLink.
"""

from __future__ import annotations

from dataclasses import replace

from ..costmodel import Candidate, Hardware, Layout, axis_network, bubble_fraction, communication_time

__all__ = ["describe", "gb", "seconds", "memory_advice", "slow_advice", "tp_advice"]

LINK = {"intra": "inside the node (NVLink)", "net": "across nodes (InfiniBand)",
        "intra+net": "across nodes (NVLink inside, InfiniBand between)"}


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def seconds(s: float) -> str:
    return f"{s:.3f} s" if s < 1 else f"{s:.2f} s"


def describe(layout: Layout) -> str:
    """``dp 16 × tp 8 × pp 8, ZeRO-1, 1f1b, m = 96``: the choices that matter here, the defaults left out."""
    axes = " × ".join(f"{a} {getattr(layout, a)}" for a in ("dp", "tp", "pp", "sp") if getattr(layout, a) > 1)
    parts = [axes or "one GPU"]
    if layout.zero:
        parts.append(f"ZeRO-{layout.zero}")
    if layout.pp > 1:
        parts.append(layout.schedule + (f" (v = {layout.chunks})" if layout.schedule == "interleaved" else ""))
    parts.append(f"m = {layout.micro_batches}")
    if layout.recompute != "none":
        parts.append(f"recompute {layout.recompute}")
    if layout.sequence_parallel:
        parts.append("sequence_parallel")
    return ", ".join(parts)


def _states_advice(term: str, layout: Layout, size: float) -> str:
    """How to shrink parameters, gradients or optimizer state: the ZeRO stage that shards it, or tp / pp."""
    stage = {"optimizer state": 1, "gradients": 2, "parameters": 3}[term]
    split = "split the model by tp (inside a node) or pp"
    if layout.zero >= stage:
        return f"ZeRO-{layout.zero} already shards it over dp = {layout.dp}: {split}"
    if layout.dp == 1:
        return f"{split}, or keep some dp and shard it with ZeRO-{stage}"
    if layout.pp > 1 and stage >= 2:
        return f"{split} further (ZeRO-{stage} does not combine with a pipeline)"
    return f"add ZeRO over dp (zero={stage} shards it dp = {layout.dp} ways: {gb(size / layout.dp)}) or {split}"


def _activations_advice(candidate: Candidate) -> str:
    layout, b = candidate.layout, candidate.micro_batch
    ways = []
    if b > 1:
        ways.append(f"more micro-batches (micro_batches = {2 * layout.micro_batches} holds half as many "
                    f"sequences at once: gradient accumulation)")
    if layout.pp > 1 and layout.schedule == "gpipe":
        ways.append(f"1F1B instead of GPipe (it holds at most p = {layout.pp} micro-batches, not all "
                    f"{layout.micro_batches})")
    if layout.recompute != "full":
        ways.append("recompute ('selective' drops the attention scores, 'full' keeps only each layer's input)")
    ways.append("tp with sequence_parallel, or sp, to split them")
    return f"at {b} sequence{'s' if b > 1 else ''} per micro-batch: " + "; ".join(ways)


def memory_advice(candidate: Candidate, hardware: Hardware) -> str:
    """Why the most loaded GPU overflows: every term, then the largest one and what shrinks it."""
    m, layout = candidate.memory, candidate.layout
    terms = {"parameters": m.params, "gradients": m.grads, "optimizer state": m.optimizer,
             "activations": m.activations, "ZeRO-3's gathered layer": m.buffers}
    listed = ", ".join(f"{name} {gb(size)}" for name, size in terms.items() if size)
    largest = max(terms, key=terms.get)
    size = terms[largest]
    if largest == "activations":
        advice = _activations_advice(candidate)
    elif largest == "ZeRO-3's gathered layer":
        advice = "split the layers by tp: each rank then gathers 1/tp of a layer"
    else:
        advice = _states_advice(largest, layout, size)
    return (f"does not fit: {gb(m.total)} per GPU > {gb(hardware.memory)} ({listed}). The largest term: {largest} "
            f"{gb(size)} per GPU: {advice}")


def tp_advice(candidate: Candidate, scenario, extra: float | None = None) -> str:
    """What tp costs this layout: across nodes, against the same all-reduces on NVLink; inside, against the best."""
    layout, hw = candidate.layout, scenario.hardware
    tp, link = candidate.time.exposed.tp, axis_network(layout, hw, "tp")[1]
    if link == "intra":
        return (f"tp = {layout.tp}'s all-reduces (4 a layer and micro-batch) take {seconds(tp)}, "
                f"{seconds(extra or 0.0)} more than the best spends there: tp pays only where the model does not fit "
                f"without it; less tp and more dp sends less")
    nvlink = replace(hw, bandwidth=hw.intra_bandwidth, latency=hw.intra_latency)
    inside = communication_time(scenario.config, layout, nvlink, candidate.micro_batch).tp
    return (f"the tp = {layout.tp} group crosses nodes ({hw.gpus_per_node} GPUs a node): its all-reduces, 4 a layer "
            f"and micro-batch, run {LINK[link]} and take {seconds(tp)} of the step, against {seconds(inside)} on "
            f"NVLink: keep tp inside a node (tp <= {hw.gpus_per_node}) and put pp or dp across nodes")


def _bubble_advice(candidate: Candidate) -> str:
    layout, t = candidate.layout, candidate.time
    f = bubble_fraction(layout)
    return (f"the pipeline bubble takes {seconds(t.bubble)}: pp = {layout.pp} at m = {layout.micro_batches} "
            f"idles {f:.0%} of the time ({layout.schedule}; 1F1B's (p−1)/(m+p−1)): raise micro_batches (smaller "
            f"micro-batches, the same batch) or use fewer stages")


def _dp_advice(candidate: Candidate, hardware: Hardware) -> str:
    layout, dp = candidate.layout, candidate.time.exposed.dp
    link = LINK[axis_network(layout, hardware, "dp")[1]]
    if layout.zero == 3:
        return (f"ZeRO-3 gathers the parameters before every forward and backward of each of the "
                f"m = {layout.micro_batches} micro-batches: {seconds(dp)} exposed over dp = {layout.dp} {link}; "
                f"fewer micro-batches, ZeRO-1 or 2 where the states fit, or tp inside the node")
    what = "all-reduce of the gradients" if layout.zero == 0 else f"ZeRO-{layout.zero} collectives"
    return (f"the exposed dp {what} takes {seconds(dp)} over dp = {layout.dp} {link}: fewer, larger dp "
            f"groups (more tp or pp) send less")


def slow_advice(candidate: Candidate, best: Candidate, scenario, band: float, only: str | None = None) -> str:
    """The step against the planner's best, term by term, then the term that costs the most beyond the best's
    (``only``: that term, named whatever the others cost)."""
    mine, ref = candidate.time, best.time
    excess = {"compute": mine.compute - ref.compute, "bubble": mine.bubble - ref.bubble,
              **{axis: getattr(mine.exposed, axis) - getattr(ref.exposed, axis) for axis in ("dp", "tp", "pp", "sp")}}
    worst = only or max(excess, key=excess.get)
    layout = candidate.layout
    if worst == "tp":
        why = tp_advice(candidate, scenario, excess["tp"])
    elif worst == "bubble":
        why = _bubble_advice(candidate)
    elif worst == "dp":
        why = _dp_advice(candidate, scenario.hardware)
    elif worst == "compute":
        why = (f"recompute = '{layout.recompute}' adds {seconds(excess['compute'])} of compute (a forward "
               f"again): recompute only what memory needs")
    else:
        why = (f"{worst} = {getattr(layout, worst)}'s exposed communication takes "
               f"{seconds(getattr(mine.exposed, worst))}, {seconds(excess[worst])} more than the best's")
    if only == "bubble":
        return f"{why} (a bubble under a fifth of the step earns the point)"
    return (f"step {seconds(candidate.seconds)}, {candidate.seconds / best.seconds:.2f} × the planner's best "
            f"{seconds(best.seconds)} (within {band:g} × earns the point: the factor the time model is checked to): "
            f"compute {seconds(mine.compute)}, bubble {seconds(mine.bubble)}, exposed communication "
            f"{seconds(mine.exposed_communication)}. Most of the difference: {why}")
