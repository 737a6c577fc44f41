"""Communication per training step, per axis of a layout: what each collective sends, and how long it takes.

One table, :func:`step_collectives`, lists every collective one GPU takes part in during a step (each with
its axis, its group, the elements it carries and how many times it runs); :func:`communication_bytes` adds
up what one GPU *sends* per axis, :func:`communication_time` times the same collectives with chapter 01's
network model (:func:`coursekit.netsim.closed_form_time`). Bytes and seconds come from the same rows, so they
cannot disagree. With ``N`` elements and a group of ``G`` GPUs, one GPU sends:

============================  ==================  =====================================================
collective                    sent per GPU        time (chapter 01's ring / naive closed forms)
============================  ==================  =====================================================
all-reduce of ``N``           ``2(G−1)/G · N``    ``closed_form_time("ring", G, N)``: 2(G−1) steps
reduce-scatter / all-gather   ``(G−1)/G · N``     half of it: G−1 steps (``N``: the whole tensor)
all-to-all (``N`` its own)    ``(G−1)/G · N``     ``closed_form_time("naive", G, ⌈N/G⌉)``: one step
send to a neighbour           ``N``               one ring step of ``N``
============================  ==================  =====================================================

What each axis counts, per step (``b`` samples per micro-batch, ``m`` micro-batches, ``s`` tokens per
sample on this rank -- ``S/sp`` --, ``h`` hidden, ``L`` layers *of this stage* -- ``⌈L/pp⌉``, and with
``pp > 1`` the last stage, which holds the head and the loss --, ``V`` vocabulary, ``Ψ`` this rank's
parameters, taken as ``P/(tp·pp)``: exact without tp and pp, which leave LayerNorms and biases whole and put
the embedding on the end stages -- :mod:`coursekit.costmodel.params` has the exact per-rank count):

* **dp** -- the gradients, once per step (accumulated over micro-batches): a ring all-reduce of ``Ψ``,
  ``2(D−1)/D·Ψ``; ZeRO-1 a reduce-scatter + an all-gather (the same volume); ZeRO-2 reduce-scatters in every
  backward (``m`` times) and all-gathers once; ZeRO-3 all-gathers the parameters before every forward and
  backward and reduce-scatters every backward: ``3m(D−1)/D·Ψ``, the ZeRO paper's 3Ψ against 2Ψ
  (Rajbhandari et al. 2020, section 7) -- :func:`coursekit.measure.memory.comm_elements`, chapter 02.
* **tp** -- per micro-batch and layer, 2 all-reduces of ``b·s·h`` forward (after attention's and the MLP's
  row-parallel layers) and 2 backward (the column-parallel inputs' gradients): Megatron-LM's ``f``/``g``
  (Shoeybi et al. 2019, Figure 3); the vocabulary-parallel embedding 1 forward, the tied head 1 backward,
  the vocabulary-parallel cross-entropy 3 of ``b·s`` (max, sum of exponentials, target logit) -- what
  :func:`coursekit.parallel.tensor.expected_counts` counts (chapter 05). Full recomputation repeats the
  forward's. With ``sequence_parallel`` (Korthikanti et al. 2022, section 4.2.2) each all-reduce becomes a
  reduce-scatter + an all-gather (the same volume), and backward all-gathers each column-parallel input
  once more, as Megatron-LM does (:func:`coursekit.parallel.sequence.megatron_sp_traffic`: 4 + 6 per layer);
  the LayerNorms and row-parallel biases, now trained on each rank's tokens only, have their gradients
  all-reduced once a step (``(6L + 2)·h``; Megatron-LM's all-reduce of its ``sequence_parallel`` gradients).
* **pp** -- each micro-batch's activations ``b·s·h`` forward over every stage boundary and their gradient
  back; with ``v`` chunks per rank (interleaved) ``p·v − 1`` boundaries. Counted for the busiest stage (a
  middle one sends ``2v`` per micro-batch, the first and last ``2v − 1``), plus the tied embedding's gradient
  all-reduced between the first and the last stage (Megatron-LM's embedding group). Chapter 04. Each tp
  rank of a stage sends the whole ``b·s·h``, unless ``sequence_parallel`` has split it already (``b·s·h/t``)
  or ``scatter_gather`` is asked for (Narayanan et al. 2021's optimisation: ``b·s·h/t``, then a tp all-gather).
* **sp** -- ring attention (Liu et al. 2023): per layer each rank's K and V block (``b·s/G·h``; with
  grouped-query attention ``b·s/G·kv_width``, ``ModelConfig.kv_width``) makes
  ``G−1`` hops forward; backward ``G−1`` hops with their gradients beside them and one more for the
  gradients to reach their owner (:func:`coursekit.parallel.sequence.ring_traffic`); or DeepSpeed Ulysses
  (Jacobs et al. 2023): 4 all-to-alls forward (q, k, v in, the output back) and 4 backward, ``4(G−1)/G ·
  b·s·h/G`` each way per GPU -- the paper's ``4Nh/P`` (its "per link" is per GPU, as ``(G−1)/G → 1``).
  Then the gradients summed over the ``sp`` group (every rank saw its own tokens), and with
  ``gather_logits`` a gather of the logits along the sequence (what the course's strategies did before
  they took each rank's loss on its own tokens, chapter 06; off by default).
* **ep** -- an MoE's experts split over ``ep`` of the dp ranks (:mod:`.experts`): per MoE layer and
  micro-batch a *dispatch* all-to-all (each token's ``k`` rows to their experts' ranks) and a *combine* (the
  outputs back) forward, both again backward: ``4 · (ep−1)/ep · k·b·s·h`` per GPU for even routing (GShard's
  dispatch and combine, Lepikhin et al. 2020; what chapter 07's ``dispatch``/``combine`` count), the busiest
  rank ``imbalance`` times that, capped by a capacity factor (:func:`~.experts.expert_rows`); the counts
  they announce first are control, not counted. The gradients then go to two groups, both booked under
  **dp**: the dense parameters' over all ``dp`` ranks, the experts' over the ``dp/ep`` ranks that hold the
  same experts (``axes=("edp",)``, ``ep`` apart); ZeRO shards each over its own group.
* **dp × sp** -- with ``dp > 1`` and ``sp > 1`` (and no ZeRO) the two gradient all-reduces, a sum over
  ``sp`` and then an average over ``dp``, are **one** all-reduce of ``Ψ`` over the ``D·G`` ranks of the
  flattened group, as the course's ``"sequence_data"`` does
  (:func:`coursekit.parallel.sequence.sequence_data_traffic`), torchtitan's FSDP over ``dp_shard × cp`` and
  Megatron-LM's data-and-context-parallel group: ``2(DG−1)/(DG)·Ψ`` per GPU, booked under ``dp`` (it is the
  data-parallel gradient reduce; ``sp`` then books attention only). Its ``D·G`` ranks, ``tp`` apart, are
  timed on the network they span (:func:`group_network`): NVLink while ``tp·D·G`` GPUs fit in a node,
  both levels beyond -- where each of its ``2(DG−1)`` steps waits on a hop between nodes, so it can take
  longer than sp's ring inside a node and then dp's across (GPT-3 on 1,024 GPUs, dp 4 × sp 4 over tp 2:
  30 slow steps of Ψ/16 against 6 of Ψ/4). Assumption: with ZeRO the states stay sharded over ``dp``
  only (as :func:`coursekit.costmodel.memory_per_gpu` counts them), so there the ``sp`` sum stays its own
  all-reduce before ZeRO's collectives over ``dp``.

    >>> course = ModelConfig.course()                      # 104,832 parameters, fp32 as the course runs
    >>> communication_bytes(course, Layout(dp=4), micro_batch=8, bytes_per_element=4).dp
    628992.0
    >>> 2 * 3 / 4 * 104_832 * 4                             # 2(G−1)/G · Ψ · 4 bytes
    628992.0
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..netsim import Network, closed_form_time
from .params import num_params
from .config import Hardware, Layout, ModelConfig
from .experts import check_experts, expert_collectives
from .rows import AXES, OPS, Collective, PerAxis

__all__ = ["Collective", "PerAxis", "step_collectives", "communication_bytes", "axis_network", "group_network",
           "collective_seconds", "communication_time", "ATTENTIONS", "AXES", "OPS"]

ATTENTIONS = ("ring", "ulysses")          # how the sp axis attends across its ranks


def _data(psi: int, layout: Layout, group: int | None = None, axes: tuple[str, ...] = (),
          whose: str = "") -> list[Collective]:
    """dp's rows for ``psi`` parameters over ``group`` ranks (default all ``dp``; an MoE's experts: ``dp/ep``)."""
    D, m = layout.dp if group is None else group, layout.micro_batches
    if layout.sp > 1 and layout.zero == 0:          # one all-reduce over the flattened dp×sp group
        return [Collective("dp", "all_reduce", D * layout.sp, psi, 1, "gradients, once over dp×sp", ("sp", "dp"))]
    rows = {0: [("all_reduce", 1, "gradients")],
            1: [("reduce_scatter", 1, "gradients"), ("all_gather", 1, "updated parameters")],
            2: [("reduce_scatter", m, "gradients, every backward"), ("all_gather", 1, "updated parameters")],
            3: [("all_gather", 2 * m, "parameters, before every forward and backward"),
                ("reduce_scatter", m, "gradients, every backward")]}[layout.zero]
    return [Collective("dp", op, D, psi, count, what + whose, axes) for op, count, what in rows]


def _experts_data(config: ModelConfig, layout: Layout) -> list[Collective]:
    """With ``ep > 1`` two groups: the dense parameters over all ``dp`` (replicas on every rank), each rank's
    experts over the ``dp/ep`` ranks that hold the same ones (whose tokens reached them through the all-to-alls:
    chapter 07's ``"expert"``, torchtitan's ``dp_shard_in_ep``, Megatron Core's expert-data-parallel group)."""
    count = num_params(config)
    dense = -(-(count.total - count.experts) // layout.pp)
    experts = -(-count.experts // (layout.ep * layout.pp))
    rows = _data(dense, layout, whose=" (dense)")
    if layout.dp > layout.ep:
        rows += _data(experts, layout, layout.dp // layout.ep, ("edp",), " (experts, over their dp/ep copies)")
    return rows


def _tensor(config: ModelConfig, layout: Layout, b: int, s: float, vocab_parallel_loss: bool) -> list[Collective]:
    """``config.layers``: this stage's; with ``pp > 1`` the stage is the last (the head and the loss, no embedding)."""
    t, m, L, n = layout.tp, layout.micro_batches, config.layers, b * s * config.hidden
    e = 1 if layout.pp == 1 else 0                    # the embedding's collectives are on this stage
    again = L if layout.recompute == "full" else 0    # the recomputed forward issues the layers' forward ones again
    if layout.sequence_parallel:
        rows = [("all_gather", (2 * (L + again) + 1) * m, "layer inputs forward (+ the head's)"),
                ("reduce_scatter", (2 * (L + again) + e) * m, "row-parallel outputs forward (+ the embedding's)"),
                ("reduce_scatter", (2 * L + 1) * m, "column-parallel inputs' gradients (+ the head's)"),
                ("all_gather", (4 * L + e + 1) * m, "gradients of the row-parallel outputs (+ the embedding's) "
                                                   "and the inputs gathered again for the weight gradients")]
    else:
        rows = [("all_reduce", (2 * (L + again) + e) * m, "row-parallel outputs forward (+ the embedding)"),
                ("all_reduce", (2 * L + 1) * m, "column-parallel inputs' gradients (+ the head)")]
    out = [Collective("tp", op, t, n, count, what) for op, count, what in rows]
    if layout.sequence_parallel:  # trained on this rank's tokens only: 2 LayerNorms + 2 row-parallel biases a layer
        out.append(Collective("tp", "all_reduce", t, (6 * L + 2) * config.hidden, 1,
                              "gradients of the LayerNorms and row-parallel biases, summed"))
    if vocab_parallel_loss:
        out.append(Collective("tp", "all_reduce", t, b * s, 3 * m, "vocabulary-parallel cross-entropy"))
    else:
        out.append(Collective("tp", "all_gather", t, b * s * config.vocab, m, "the logits, gathered"))
    return out


def _pipeline(config: ModelConfig, layout: Layout, b: int, s: float, scatter_gather: bool) -> list[Collective]:
    p, v, m = layout.pp, layout.chunks, layout.micro_batches
    activation = b * s * config.hidden
    if layout.sequence_parallel or scatter_gather:    # each tp rank sends its 1/t of the boundary's activation
        activation /= layout.tp
    tied = config.vocab * config.hidden / layout.tp if config.tied else 0

    def load(r):  # (sends per micro-batch, tied elements) of stage r: forward unless last, backward unless first
        return 2 * v - (r == 0) - (r == p - 1), tied if r in (0, p - 1) else 0

    sends, embedding = max((load(r) for r in range(p)), key=lambda x: x[0] * m * activation + x[1])
    out = [Collective("pp", "send", p, activation, sends * m, "activations forward, their gradients back")]
    if scatter_gather and not layout.sequence_parallel and layout.tp > 1:   # made whole again inside the node
        out.append(Collective("tp", "all_gather", layout.tp, activation * layout.tp, sends * m,
                              "the pipeline's scattered activations (and gradients), gathered"))
    if embedding:
        out.append(Collective("pp", "all_reduce", 2, embedding, 1,
                              "the tied embedding's gradient, first and last stage"))
    return out


def _sequence(config: ModelConfig, layout: Layout, b: int, attention: str, gather_logits: bool) -> list[Collective]:
    G, m, L = layout.sp, layout.micro_batches, config.layers
    block = b * config.seq_len / G * config.hidden / layout.tp      # this rank's q (or out)
    kv = block * config.kv_width / config.hidden                     # its K (or V): kv_heads wide with GQA
    forwards = 2 if layout.recompute == "full" else 1
    if attention == "ring":
        rows = [("send", 2 * kv, (G - 1) * forwards * L * m, "K and V blocks around the ring, forward"),
                ("send", 4 * kv, (G - 1) * L * m, "K, V and their gradients around the ring, backward"),
                ("send", 2 * kv, L * m, "the K, V gradients' last hop to their owner")]
    else:
        rows = [("all_to_all", block + 2 * kv, (forwards + 1) * L * m, "q, k, v: sequence-split to head-split"),
                ("all_to_all", block, (forwards + 1) * L * m, "attention's output: head-split to sequence-split")]
    out = [Collective("sp", op, G, numel, count, what) for op, numel, count, what in rows]
    if gather_logits:
        out.append(Collective("sp", "all_gather", G, b * config.seq_len * config.vocab, m, "the logits, gathered"))
    return out


def step_collectives(config: ModelConfig, layout: Layout, micro_batch: int, seq_len: int | None = None,
                     attention: str = "ring", gather_logits: bool = False, vocab_parallel_loss: bool = True,
                     imbalance: float = 1.0, dp_calls: int = 1, scatter_gather: bool = False) -> tuple[Collective, ...]:
    """Every collective one GPU takes part in during one training step (the module docstring says which).

    ``micro_batch``: samples per micro-batch on one data-parallel rank (``layout.micro_batches`` of them a
    step); ``seq_len``: tokens per sample (default ``config.seq_len``, the model's positions); ``attention``:
    ``"ring"`` or ``"ulysses"`` along ``sp``; ``gather_logits``: the ``sp`` ranks gather the logits (the course's
    strategies no longer do: each rank's loss is on its own tokens); ``vocab_parallel_loss``: Megatron's loss on the vocabulary shards (else the
    logits are all-gathered over ``tp``); ``imbalance``: an MoE's busiest rank's rows over the mean
    (:func:`~.experts.expert_rows`), 1 for even routing; ``dp_calls``: the gradients' collectives issued in
    that many equal calls (1: one flat buffer, or buckets overlapped by the model's ``dp_overlap``; the course's
    ``"naive"`` all-reduces each parameter tensor: :func:`~.overhead.parameter_tensors`), the same bytes, ``dp_calls``
    times the latency; ``scatter_gather``: each tp rank of a stage sends 1/t of the boundary's activation and
    the next stage all-gathers it over tp (Narayanan et al. 2021, section 4.1, Megatron-LM's
    ``scatter_gather_tensors_in_pipeline``; with ``sequence_parallel`` the activation is split already). An axis
    of degree 1 has no rows.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS} (got {attention!r}).")
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 sample (got {micro_batch}).")
    check_experts(config, layout)
    tokens = config.seq_len if seq_len is None else seq_len
    stage = replace(config, seq_len=tokens, layers=-(-config.layers // layout.pp))  # a sample, the busiest stage
    psi = -(-num_params(config).total // (layout.tp * layout.pp))
    rows: list[Collective] = []
    if layout.dp > 1:
        rows += _data(psi, layout) if layout.ep == 1 else _experts_data(config, layout)
        if dp_calls != 1:
            rows = [replace(r, numel=r.numel / dp_calls, count=r.count * dp_calls) for r in rows]
    rows += expert_collectives(stage, layout, micro_batch, tokens, stage.layers, imbalance)
    if layout.tp > 1:
        rows += _tensor(stage, layout, micro_batch, tokens / layout.sp, vocab_parallel_loss)
    if layout.pp > 1:
        rows += _pipeline(stage, layout, micro_batch, tokens / layout.sp, scatter_gather)
    if layout.sp > 1:
        rows += _sequence(stage, layout, micro_batch, attention, gather_logits)
        if layout.dp == 1 or layout.zero:           # else _data's one all-reduce over dp×sp sums them
            rows.append(Collective("sp", "all_reduce", layout.sp, psi, 1, "gradients summed over the sequence ranks"))
    return tuple(rows)


def communication_bytes(config: ModelConfig, layout: Layout, micro_batch: int, bytes_per_element: int = 2,
                        **assumptions) -> PerAxis:
    """Bytes one GPU sends per training step, per axis: the sum of :func:`step_collectives`' rows.

    ``assumptions``: :func:`step_collectives`' named arguments (``seq_len``, ``attention``, ``gather_logits``,
    ``vocab_parallel_loss``). 16-bit gradients and activations by default (``bytes_per_element=4`` for fp32,
    as the course runs). For tp, 2 all-reduces per layer each way at ``t = 2`` send ``2·(2(t−1)/t)·b·s·h``:

        >>> gpt2 = ModelConfig.gpt2_small()
        >>> tp = communication_bytes(gpt2, Layout(tp=2), micro_batch=1).tp
        >>> int(tp), (4 * 12 + 2) * 1024 * 768 * 2 + 3 * 1024 * 2       # (4L + 2) b·s·h + 3 b·s, 2 bytes
        (78649344, 78649344)
    """
    sent = {axis: 0.0 for axis in AXES}
    for row in step_collectives(config, layout, micro_batch, **assumptions):
        sent[row.axis] += row.sent * bytes_per_element
    return PerAxis(**sent)


def axis_network(layout: Layout, hardware: Hardware, axis: str) -> tuple[Network, str]:
    """The network one group of ``axis`` sees, and which link it uses: ``"intra"``, ``"net"`` or ``"intra+net"``.

    Ranks are laid out ``pp, dp, sp, tp`` (tp innermost, as torchtitan's mesh): a group of ``G`` ranks
    ``stride`` apart (tp 1, sp tp, dp tp·sp, pp tp·sp·dp) stays inside a node when ``stride·G ≤
    gpus_per_node`` (NVLink), has every member on its own node when ``stride ≥ gpus_per_node``
    (InfiniBand), and otherwise spans nodes with ``gpus_per_node/stride`` members in each (both levels).

    A group that spans nodes is priced as one ring through one network link per node
    (``ring_channels=1``), not as NCCL's channels over every member's link (chapter 01's default): an
    assumption kept until chapter 08's numbers are re-derived with channels. It overprices such rings,
    up to ``gpus_per_node/stride`` times in their bandwidth term.

        >>> [axis_network(Layout(dp=4, tp=8), Hardware(), a)[1] for a in ("tp", "dp")]
        ['intra', 'net']
    """
    return group_network(layout, hardware, (axis,))


def group_network(layout: Layout, hardware: Hardware, axes: tuple[str, ...]) -> tuple[Network, str]:
    """:func:`axis_network` for a group flattened over neighbouring axes (``("sp", "dp")``: D·G ranks).

    The axes must be adjacent in the order ``tp, sp, dp, pp``; the group's members are then ``stride`` apart
    (the product of the axes inside them) and ``G`` is the product of their degrees, and the three cases of
    :func:`axis_network` apply. E.g. tp = 4, sp = 2, dp = 2 on nodes of 8: sp alone stays inside a node, dp
    alone crosses nodes, and the dp×sp group of 4 ranks 4 apart spans 2 nodes, 2 members in each:

        >>> [group_network(Layout(tp=4, sp=2, dp=2), Hardware(), a)[1] for a in (("sp",), ("dp",), ("sp", "dp"))]
        ['intra', 'net', 'intra+net']
    """
    # dp's ranks are ep's groups (ep innermost: neighbours) times dp/ep of them ("edp"), as torchtitan lays
    # out dp_shard_in_ep outside ep; without expert parallelism ep = 1 and edp is dp
    degrees = {"tp": layout.tp, "sp": layout.sp, "ep": layout.ep, "edp": layout.dp // layout.ep, "pp": layout.pp}
    order = ("tp", "sp", "ep", "edp", "pp")
    fine = tuple(b for a in axes for b in (("ep", "edp") if a == "dp" else (a,)))
    first = order.index(fine[0]) if fine and fine[0] in order else -1
    if first < 0 or fine != order[first:first + len(fine)]:
        raise ValueError(f"axes must be adjacent in the order tp, sp, dp, pp (dp being ep inside edp = dp/ep) "
                         f"(got {axes!r}).")
    stride = math.prod(degrees[a] for a in order[:first])
    G, k = math.prod(degrees[a] for a in fine), hardware.gpus_per_node
    # what a collective reaches of each link (Hardware.intra_efficiency, net_efficiency; 1 unless a preset says)
    intra_bandwidth = hardware.intra_bandwidth * hardware.intra_efficiency
    net_bandwidth = hardware.bandwidth * hardware.net_efficiency
    if stride * G <= k:
        return Network(intra_bandwidth, hardware.intra_latency), "intra"
    if stride >= k:
        return Network(net_bandwidth, hardware.latency), "net"
    return Network(net_bandwidth, hardware.latency, gpus_per_node=math.gcd(G, k // stride),
                   intra_bandwidth=intra_bandwidth, intra_latency=hardware.intra_latency,
                   ring_channels=1), "intra+net"     # one ring, one link per node: axis_network says why


def collective_seconds(row: Collective, network: Network, bytes_per_element: int = 2) -> float:
    """How long ``row`` takes on ``network``, all its ``count`` runs (the module docstring's closed forms)."""
    G, N, b = row.group, math.ceil(row.numel), bytes_per_element
    if row.op == "all_reduce":
        each = closed_form_time("ring", G, N, network, b)
    elif row.op in ("reduce_scatter", "all_gather"):
        each = closed_form_time("ring", G, N, network, b) / 2
    elif row.op == "all_to_all":
        each = closed_form_time("naive", G, -(-N // G), network, b)
    else:                                                        # one step of a ring: a segment of N each
        each = closed_form_time("ring", G, G * N, network, b) / (2 * (G - 1))
    return row.count * each


def communication_time(config: ModelConfig, layout: Layout, hardware: Hardware, micro_batch: int,
                       bytes_per_element: int = 2, **assumptions) -> PerAxis:
    """Seconds per step each axis spends communicating, nothing overlapped (:func:`step_collectives`' rows
    timed by :func:`collective_seconds` on :func:`axis_network`'s link for the axis).

    tp (innermost) stays on NVLink while ``tp ≤ gpus_per_node``; dp and pp, outer, cross nodes once the
    inner axes fill one. A pipeline send is one ring step on the pp group's network (its slowest link when
    the group spans nodes); the tied embedding's all-reduce between the first and the last stage is timed on
    that slowest link too. E.g. GPT-2 small, dp = 8 in one node: 2·7 steps of ``⌈Ψ/8⌉`` over NVLink:

        >>> t = communication_time(ModelConfig.gpt2_small(), Layout(dp=8), Hardware(), micro_batch=1).dp
        >>> round(t * 1e3, 3), round(14 * (5e-6 + 15_554_976 * 2 / 300e9) * 1e3, 3)
        (1.522, 1.522)
    """
    seconds = {axis: 0.0 for axis in AXES}
    for row in step_collectives(config, layout, micro_batch, **assumptions):
        if row.axes:                                            # a flattened group: the link it crosses
            seconds[row.axis] += collective_seconds(row, group_network(layout, hardware, row.axes)[0],
                                                    bytes_per_element)
            continue
        network, link = axis_network(layout, hardware, row.axis)
        if row.group != getattr(layout, row.axis):             # the tied embedding's pair: one link level
            network = network if link != "intra+net" else Network(hardware.bandwidth * hardware.net_efficiency,
                                                                    hardware.latency)
        seconds[row.axis] += collective_seconds(row, network, bytes_per_element)
    return PerAxis(**seconds)
