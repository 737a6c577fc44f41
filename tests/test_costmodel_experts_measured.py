"""The cost model prices expert parallelism as chapter 07's ``"expert"`` runs it: traffic counted, memory held.

``train(..., "expert", ep=..., count_traffic=True)`` on real ranks (``coursekit.launch``), one Adam step in fp32, on
the course transformer with MoE blocks (tests/moe_support.py: the shape :func:`moe_config` describes, routing
forced even so that the cost model's even-routing rows are exact). Per rank and per row of
:func:`~coursekit.costmodel.step_collectives`, in elements (``bytes_per_element=1``):

* ``ep``, all-to-all -- the dispatch and the combine, forward and backward (the phases ``dispatch``,
  ``dispatch (backward)``, ``combine``, ``combine (backward)`` of chapter 07's counted all-to-alls; the counts
  exchanged before are control and not counted);
* ``dp``, all-reduce -- the dense gradients over the world (the ring's steps between neighbours ``r -> r + 1``)
  and the experts' over the ``dp/ep`` ranks that hold the same experts (the ring's steps ``ep`` apart).

Cases: ep = 2 and 4, k = 1 and 2, E = 4 and 8, two micro-batches, a capacity factor that drops half the rows,
and dp = 4 × ep = 2 (dp/ep = 2: the experts' all-reduce). Memory: what a rank holds after the step -- parameters,
gradients, Adam's two moments -- is :func:`~coursekit.costmodel.memory_per_gpu`'s, exactly (plus Adam's 4-byte
step counter a tensor, which the 16Ψ of the ZeRO paper leaves out); and what chapter 07's MoE layer keeps for
backward (chapter 06's ``saved_bytes``) is :func:`~coursekit.costmodel.moe_activation_bytes`, exactly, plus
named terms it leaves out (the routing's indices, as Korthikanti et al. leave out LayerNorm's statistics).

Planted in the cost model and seen failing (each undone):
* the combine forgotten (``expert_collectives`` returning the dispatch row only) -> "ep2 E4 k1: ep: the combine's
  all-to-alls, rank 0 sent 2048 elements, the cost model says 0";
* the experts divided by E instead of ep on a rank (``params_per_rank``, ``layer_params``) -> "ep2 E4 k1, rank 0:
  params 45312 bytes held, memory_per_gpu says 28928" and "dp4×ep2 E4 k2: dp: the experts' all-reduce, rank 0
  sent 8192 elements, the cost model says 2048";
* the experts' gradients all-reduced over dp instead of dp/ep -> "dp4×ep2 E4 k2: dp: the experts' all-reduce,
  rank 0 sent 8192 elements, the cost model says 12288";
* the capacity ignored in ``expert_rows`` -> "ep2 E4 k2 C0.5: ep: the dispatch's all-to-alls, rank 0 sent 2048
  elements, the cost model says 4096".
"""

from __future__ import annotations

import pytest

import coursekit
import torch

from coursekit.comm.traffic import Traffic
from coursekit.costmodel import Layout, memory_per_gpu, moe_activation_bytes, step_collectives
from coursekit.models import LanguageData
from coursekit.parallel.expert import MoE, ExpertParallelMoE
from coursekit.parallel.sequence import saved_bytes
from coursekit.train import train

from moe_support import HIDDEN, TOKENS, EvenRouter, moe_config, moe_transformer

B = 2                                      # samples per rank and micro-batch: T = 64 tokens
# (world, ep, experts, k, micro-batches, capacity factor)
CASES = {2: [(2, 2, 4, 1, 1, None), (2, 2, 8, 2, 2, None), (2, 2, 4, 2, 1, 0.5)],
         4: [(4, 4, 8, 1, 1, None), (4, 4, 4, 2, 1, None), (4, 2, 4, 2, 1, None), (4, 2, 8, 1, 2, None)]}
PHASES = {"dispatch": ("dispatch", "dispatch (backward)"), "combine": ("combine", "combine (backward)")}


def _name(case):
    world, ep, experts, k, m, factor = case
    return (f"{'' if world == ep else f'dp{world}×'}ep{ep} E{experts} k{k}{f' m{m}' if m > 1 else ''}"
            f"{f' C{factor}' if factor else ''}")


def _run(rank, world_size, cases):
    out = []
    for _, ep, experts, k, m, factor in cases:
        result = train(rank, world_size, "expert", ep=ep, steps=1, global_batch=world_size * m * B, micro_batches=m,
                       model=lambda: moe_transformer(experts, k, capacity_factor=factor),
                       data=LanguageData(vocab_size=16, seq_len=TOKENS + 1), count_traffic=True, record=False)
        out.append((result["traffic"], result["memory"]))
    return out


@pytest.fixture(scope="module")
def runs():
    """One launch per world size, every case one step (about 20 s on 2 busy cores)."""
    return {world: coursekit.launch(_run, world, cases, timeout=240) for world, cases in CASES.items()}


def _counted(traffic: Traffic, world: int) -> dict[str, dict[int, int]]:
    """Payload elements each rank sent, by what carried them (the rows' names below)."""
    out = {name: dict.fromkeys(range(world), 0) for name in ("dispatch", "combine", "dense", "experts")}
    for t in traffic.payload:
        if t.phase in ("reduce-scatter", "all-gather"):   # the ring all-reduces: neighbours, or ep apart
            name = "dense" if t.dst == (t.src + 1) % world else "experts"
        else:
            name = next(n for n, phases in PHASES.items() if t.phase in phases)
        out[name][t.src] += t.numel
    return out


def _predicted(case) -> dict[str, float]:
    world, ep, experts, k, m, factor = case
    rows = step_collectives(moe_config(experts, k, capacity_factor=factor), Layout(dp=world, ep=ep, micro_batches=m),
                            B, seq_len=TOKENS)
    out = dict.fromkeys(("dispatch", "combine", "dense", "experts"), 0.0)
    for row in rows:
        if row.axis == "ep":
            assert row.op == "all_to_all", row
            out[row.what.split(":")[0]] += row.sent
        else:
            assert (row.axis, row.op) == ("dp", "all_reduce"), row
            out["experts" if row.axes == ("edp",) else "dense"] += row.sent
    return out


WHAT = {"dispatch": "ep: the dispatch's all-to-alls", "combine": "ep: the combine's all-to-alls",
        "dense": "dp: the dense gradients' all-reduce", "experts": "dp: the experts' all-reduce"}


@pytest.mark.parametrize("world", sorted(CASES))
def test_counted_traffic_equals_the_cost_models_rows(runs, world):
    """Every rank sends exactly what each row of step_collectives says one GPU sends: the all-to-alls
    ``4 · (ep−1)/ep · k·b·s·h`` per MoE layer and micro-batch (dispatch and combine, each twice), the dense
    gradients ``2(dp−1)/dp · Ψ_dense``, the experts' ``2(dp/ep − 1)/(dp/ep) · Ψ_experts/ep`` (none when dp = ep)."""
    for index, case in enumerate(CASES[world]):
        counted = _counted(Traffic.merge([runs[world][r][index][0] for r in range(world)]), world)
        predicted = _predicted(case)
        assert predicted["dispatch"] and predicted["dense"] and bool(predicted["experts"]) == (world > case[1])
        for name, per_rank in counted.items():
            for rank, sent in per_rank.items():
                assert sent == predicted[name], (f"{_name(case)}: {WHAT[name]}, rank {rank} sent {sent} elements, "
                                                 f"the cost model says {predicted[name]:.0f}")


@pytest.mark.parametrize("world", sorted(CASES))
def test_held_model_states_equal_memory_per_gpu(runs, world):
    """After the step a rank holds the dense parameters whole and ``E/ep`` of each layer's experts, fp32: 4 bytes a
    parameter, 4 a gradient, 8 of Adam's moments (+ 4 a tensor for its step counter) -- memory_per_gpu's
    params_per_rank(ep=...) at precision="fp32", no ZeRO (the strategy shards no state)."""
    for index, case in enumerate(CASES[world]):
        _, ep, experts, k, m, factor = case
        model = moe_transformer(experts, k, capacity_factor=factor)
        tensors = len(list(model.parameters()))                     # the experts' w1, w2 stay 2 tensors a layer
        predicted = memory_per_gpu(moe_config(experts, k, capacity_factor=factor),
                                   Layout(dp=world, ep=ep, micro_batches=m), B, "fp32")
        for rank in range(world):
            held = runs[world][rank][index][1]
            where = f"{_name(case)}, rank {rank}"
            assert held["params"] == predicted.params, \
                f"{where}: params {held['params']} bytes held, memory_per_gpu says {predicted.params}"
            assert held["grads"] == predicted.grads, \
                f"{where}: grads {held['grads']} bytes held, memory_per_gpu says {predicted.grads}"
            assert held["optimizer"] == predicted.optimizer + 4 * tensors, \
                f"{where}: optimizer {held['optimizer']} bytes held, memory_per_gpu says {predicted.optimizer} " \
                f"+ Adam's step counters {4 * tensors}"


# ----------------------------------------------------------------------------- activations, counted in autograd
def _layer_saved_bytes(rank, world_size, experts, k, factor, tokens):
    """What one MoE layer keeps for backward on this rank (the whole layer on 1 rank, its experts over the others)."""
    moe = MoE(HIDDEN, 4 * HIDDEN, experts, k, factor, seed=1)
    moe.router = EvenRouter(HIDDEN, experts, k)
    layer = moe if world_size == 1 else ExpertParallelMoE(moe, group=None)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(rank), requires_grad=True)
    with saved_bytes(layer.parameters()) as meter:
        layer(x)
    return meter.bytes


@pytest.mark.parametrize("ep", [1, 2])
@pytest.mark.parametrize("experts, k, factor", [(4, 1, None), (4, 2, None), (8, 2, None), (4, 2, 0.5)],
                         ids=["E4-k1", "E4-k2", "E8-k2", "E4-k2-C0.5"])
def test_the_moe_layers_activations_equal_what_autograd_saves(ep, experts, k, factor):
    """Chapter 07's layer, T = 64 tokens a rank, h = 16, f = 64, fp32, routing even: what autograd saves (chapter 06's
    meter: every storage once, the parameters excluded) = moe_activation_bytes(bytes_per_element=4, dropout=False)
    -- the router's input T·h and probabilities T·E, the experts' input rows R·h, each expert's GELU input and output
    2·R·f, the outputs back and the gates K·h + K -- plus, exactly, what it leaves out: the int64 indices (each
    token's chosen experts T·k, the sort by expert K, the token of each row K; with ep > 1 the received rows' order
    R), the capacity mask (T·k bools), the balance loss's f (E floats), and two copies PyTorch's index_add and
    index_copy keep of their source only for its shape (K·h; with ep > 1 R·h more) -- a fused combine (Megatron
    Core's unpermute) keeps neither.

    Planted in moe_activation_bytes and seen failing: E experts' hidden a token in place of k's (``2·E·T·f``) ->
    "ep 1, E4-k1, rank 0: saved 52048 bytes, the model 144640 + the named extras 5712"; the capacity ignored (``k·T``
    rows whatever the factor) -> "ep 1, E4-k2-C0.5, rank 0: saved 52624 bytes, the model 87552 + the named extras
    6288".
    """
    tokens = 64
    config = moe_config(experts, k, capacity_factor=factor)
    model = moe_activation_bytes(config, tokens, ep=ep, bytes_per_element=4, dropout=False)
    kept = min(k * tokens, experts * -(-int((factor or experts) * k * tokens) // experts))   # K = R: even routing
    extras = 8 * (tokens * k + 2 * kept) + tokens * k + 4 * experts + 4 * kept * HIDDEN
    if ep > 1:
        extras += 8 * kept + 4 * kept * HIDDEN
    held = coursekit.launch(_layer_saved_bytes, ep, experts, k, factor, tokens, timeout=60) if ep > 1 else \
        [_layer_saved_bytes(0, 1, experts, k, factor, tokens)]
    for rank, measured in enumerate(held):
        assert measured == model + extras, (f"ep {ep}, E{experts}-k{k}{f'-C{factor}' if factor else ''}, rank {rank}: "
                                            f"saved {measured} bytes, the model {model:.0f} + the named extras {extras}")
