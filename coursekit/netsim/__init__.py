"""A network model: how long a recorded collective would take on a cluster of ``G`` GPUs.

The collectives of :mod:`coursekit.collectives` label every transfer with its
``(phase, step)``; :func:`coursekit.comm.simulate` records them (who sends how
many bytes to whom, in which step). This module *replays that trace* on a
modeled network. Nothing about an algorithm is written here: change the
collective and the model's times change with it.

    >>> net = Network(bandwidth=50e9, latency=10e-6)           # 50 GB/s each way, 10 µs
    >>> t = collective_time("ring", 8, 2**20, net)              # 1 Mi float32 on 8 GPUs
    >>> round(t.total * 1e6, 2), len(t.steps)                   # 2·7·(10 µs + 512 KiB/8 / 50 GB/s)
    (286.8, 14)

Assumptions, stated once
------------------------
* Each GPU has one full-duplex link to a non-blocking switch: ``B`` bytes/s
  out and, independently, ``B`` bytes/s in, with latency ``α``. With
  ``gpus_per_node=k``, GPUs ``r // k`` equal share a node and each GPU has a
  second link (``B_intra``, ``α_intra``, e.g. NVLink) used for every transfer
  to a GPU of its own node; transfers between nodes use the first link.
* A *side* is one direction of one link of one GPU (its send side, its
  receive side). A side carries one byte stream at a time: what goes over it
  is serialised.
* Steps run one after another: a ``(phase, step)`` group of the trace is one
  step, and the next starts when the last transfer of this one has arrived.
* Control messages (the length check) are ignored: only payload is timed.
* A flat ring that crosses nodes runs as ``c`` rings at once, NCCL's
  *channels* (below); the other collectives run as coded.

The timing rule
---------------
In one step, a side that carries ``L`` bytes (summed over all its transfers)
is busy for ``α + L/B`` (its link's ``α`` and ``B``): latency is paid once
per side per step, since the messages queued on a side stream back to back
and their latencies overlap. The step takes the longest busy time over all
sides::

    T_step = max over sides (α_side + L_side / B_side),    T = Σ T_step

That the busiest side is also *enough* is the open-shop theorem: with a
non-blocking switch, transfers that may be cut into pieces can be scheduled
so that no side idles while it has bytes left. :class:`Timing` splits
``T`` into its latency part (Σ α of each step's busiest side) and bandwidth
part (Σ L/B).

The closed forms (``N`` elements of ``b`` bytes, one link level)
----------------------------------------------------------------
* **master** (receives every gradient, then sends the sum back): step
  "gather" puts ``(G−1)·N·b`` bytes through the root's receive side, step
  "broadcast" as many through its send side (the others carry ``N·b``)::

      T_master = 2·α + 2·(G−1)·N·b/B          (grows linearly in G)

* **naive** (everyone sends everything to everyone, one step): every side
  carries ``(G−1)·N·b``::

      T_naive = α + (G−1)·N·b/B

* **ring**: ``2·(G−1)`` steps, in each every GPU sends one segment to its
  right neighbour; segments hold ``⌈N/G⌉`` or ``⌊N/G⌋`` elements and the
  largest is sent in every step, so::

      T_ring = 2·(G−1)·(α + ⌈N/G⌉·b/B)       (bandwidth term ≈ 2·N·b/B, flat in G)

* **hierarchical** (:mod:`coursekit.collectives.hierarchical`, ``k`` GPUs per node, ``n = G/k`` nodes): the
  inner ring's ``2(k−1)`` steps over the node links, each set by the largest
  segment ``⌈N/k⌉``; the ``k`` outer rings (one per local rank, at the same
  time) take ``2(n−1)`` steps over the network, set by the largest shard's
  largest segment::

      T_hier = 2·(k−1)·(α_intra + ⌈N/k⌉·b/B_intra) + 2·(n−1)·(α + ⌈⌈N/k⌉/n⌉·b/B)

  268 latencies instead of the flat ring's 2,046 at 1,024 GPUs in nodes of 8,
  and ``1/k`` of the bytes per GPU over the network, as the channelled ring
  (below). Its stages are labelled apart ("inner reduce-scatter", "outer
  reduce-scatter", ...): steps with one label are run as one step, so
  colliding labels would overlap two stages.

With nodes, apply the rule per link: e.g. *one* ring of ``G = 8`` in nodes
of 4 sends ``3→4`` and ``7→0`` between nodes and the rest inside, so each
step is ``max(α + s·b/B, α_intra + s·b/B_intra)`` with ``s = ⌈N/G⌉``: every
byte crosses each node boundary through one GPU's link, while the node's
other ``k − 1`` network links stay idle.

Channels
--------
NCCL does not run one ring. It runs several at once, its *channels*, cuts
the data into one chunk per channel, and lays the channels so that they
enter and leave a node through different GPUs and so different network
cards ("concurrent data movement channels", the data "partitioned into
pieces": NVIDIA/nccl#299; performance "should add up as you add" NICs, with
8 or 16 channels: #652; two channels per NIC: #438; it builds only flat
rings, no 2-D ring: #471). The model does the same with the course's ring
(:func:`channel_trace`): ``c = Network.channels(G)`` rings, ``gpus_per_node``
by default (one per GPU, each GPU having its own network link), channel
``j`` on chunk ``j`` of ``N`` with its positions rotated by ``j·k/c`` inside
every node, so it leaves each node from local GPU ``(k−1+j·k/c) mod k``. In a
step every channel's exit GPU sends one segment ``s = ⌈⌈N/c⌉/G⌉`` over its
network link and the other GPUs over NVLink; with ``c = k`` each GPU is one
channel's exit and sends ``k − 1`` segments inside its node::

    T_ring,c=k = 2·(G−1)·max(α + s·b/B, α_intra + (k−1)·s·b/B_intra),   s = N/(k·G)

The bandwidth term is about ``2·N·b/(k·B)``: the node's ``k`` links share the
bytes, as the hierarchical all-reduce's outer rings do. What the
hierarchical all-reduce still saves is latency, ``2(k−1) + 2(n−1)`` steps
against ``2(G−1)``; it pays its NVLink stages *before and after* the network
one, where the channels keep NVLink and the network busy in the same step,
so on large messages the channelled ring is the faster. Channels change
nothing inside one node or on one level (every GPU's link is already in
use): there ``c = 1``. ``Network(..., ring_channels=1)`` prices the ring as
the course's ``ring_all_reduce`` is coded, one ring through one network
link per node (about ``k`` times the bandwidth term).

Recording large ``G``
---------------------
Every message of these collectives has an *affine* size in ``q = ⌊N/G⌋``
for a fixed remainder ``N mod G`` (whole tensors: ``G·q + r``; segments:
``q`` or ``q + 1``). So :func:`collective_trace` records the pattern twice,
at ``q = 1`` and ``q = 2`` (tiny tensors), checks both have the same
transfers, and extrapolates each message's size to the requested ``N``:
exact, not an approximation (tested against direct recordings). The
recording is a *dry run* of the same collective code: every rank in turn in
this thread, sends complete at once (the threaded simulator's waits cost
about ``G`` times more per message, too slow at ``G = 1,024``); it is tested
equal to :func:`coursekit.comm.simulate`'s trace. Groups are :class:`RankGroup`
rank lists (:func:`node_groups` gives a rank's node and its cross-node ring).

What it costs: the trace holds every message, ``2G(G−1)`` for the ring, and
Python spends tens of µs on each, so recording the flat ring at ``G = 1,024``
(2·10⁶ messages, four runs of every rank) takes minutes, not seconds; ``G ≤
64`` takes about a second. The busiest side per link kind and step is cached
(:func:`collective_time`), so a recorded trace is timed on a new network in
``O(steps)``. Beyond the recorded sizes use :func:`closed_form_time`, tested
equal to the model wherever both run.
"""

from .calibration import calibrate, fit_alpha_beta
from .model import COLLECTIVES, Network, StepTime, Timing, closed_form_time, simulate_time
from .replay import RankGroup, channel_trace, collective_time, collective_trace, crossover, node_groups

__all__ = ["Network", "StepTime", "Timing", "RankGroup", "node_groups", "simulate_time", "collective_trace", "channel_trace",
           "collective_time", "closed_form_time", "crossover", "calibrate", "fit_alpha_beta", "COLLECTIVES"]
