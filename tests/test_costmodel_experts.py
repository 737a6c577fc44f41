"""The cost model's mixture of experts, by formula: parameters (Mixtral's published figures), FLOPs, model states,
the ep rows, the imbalance and the capacity, what is refused, and the planner choosing expert parallelism or not.

What the course runs is held to the same formulas in tests/test_costmodel_experts_measured.py (traffic counted,
memory held, activations saved, on real ranks). Sources: Mixtral 8x7B, Jiang et al. 2024 (arXiv:2401.04088) and
Mistral AI's announcement (2023-12-11): 46.7 B parameters, 12.9 B used per token; its ``config.json`` for the
shape. GShard (Lepikhin et al. 2020) and Switch (Fedus et al. 2021) for the dispatch/combine and the capacity;
torchtitan's ``ParallelDims`` and Megatron Core's MoE for ep borrowing from dp.

Planted and seen failing (each undone): ``compute_flops`` counting all E experts a token, not k ->
test_flops_count_k_experts_not_e ("E = 64 costs 8.0 times E = 8's expert FLOPs, not the same"), and without ep the best
became tp = 4 × dp = 2; ``_eps`` offering ep to a dense model -> test_a_dense_model_is_never_given_ep ("assert {1, 2, 4, 8}
== {1}"); ``states_fit`` ignoring ep (the experts' states counted whole, pruning too much) -> plan differed from
brute force ("At index 3 diff: ...") and test_ep_is_chosen_when_the_experts_do_not_fit_otherwise chose "dp=4, pp=2,
ep=4" (the dp = 8 × ep = 8 group pruned).
"""

from __future__ import annotations

import doctest
import math
from dataclasses import replace

import pytest

from coursekit.costmodel import (Hardware, Layout, ModelConfig, Space, active_params, brute_force, communication_bytes,
                                 compute_flops, evaluate, expert_params, group_network, layer_params, layouts,
                                 lower_bound, memory_per_gpu, moe_activation_bytes, num_params, params_per_rank, plan,
                                 rank_state_bytes, step_collectives, step_time)
from coursekit.costmodel import config as costmodel_config
from coursekit.costmodel import experts as costmodel_experts
from coursekit.costmodel import gpu_memory as costmodel_gpu_memory
from coursekit.costmodel import params as costmodel_params

from moe_support import moe_config, moe_transformer

A100 = Hardware()
MEDIUM_MOE = ModelConfig(51200, 2048, 1024, 24, 16, name="GPT-3 Medium, 32 experts, top-2", experts=32, top_k=2)
SMALL_MOE = ModelConfig(51200, 2048, 768, 12, 12, name="GPT-3 125M, 4 experts, top-1", experts=4)


def test_the_config_counts_the_course_moe_transformer():
    """num_params and params_per_rank(ep) count tests/moe_support.py's model parameter by parameter: the dense ones
    (embeddings, attention, norms, routers) whole, ``E/ep`` experts of ``2hf`` a layer."""
    for experts, k in ((4, 1), (8, 2)):
        model, config = moe_transformer(experts, k), moe_config(experts, k)
        numel = sum(p.numel() for p in model.parameters())
        in_experts = sum(p.numel() for moe in model.moes for p in moe.experts.parameters())
        count = num_params(config)
        assert (count.total, count.experts) == (numel, in_experts), (experts, k, count)
        for ep in (2, 4):
            assert params_per_rank(config, ep=ep).total == numel - in_experts + in_experts // ep


def test_tp_splits_the_experts_and_keeps_the_router_whole():
    """Megatron Core's default ETP = TP: attention's matrices and every expert split t ways; the router, the norms and
    the projection's bias whole. (4h² + 3h)/t + E·2hf/t + 5h + E·h for GPT's qkv bias."""
    config = ModelConfig(50304, 1024, 768, 12, 12, experts=8, top_k=2)
    h, f = 768, 4 * 768
    assert layer_params(config, tp=4) == (4 * h * h + 3 * h) // 4 + 8 * 2 * h * f // 4 + 5 * h + 8 * h
    assert layer_params(config, tp=2, ep=4) == (4 * h * h + 3 * h) // 2 + 2 * 2 * h * f // 2 + 5 * h + 8 * h


def test_mixtral_8x7b_is_its_published_46_7b_and_12_9b():
    """Mixtral 8x7B in the GPT-shaped config: 47.64 B. Less four named differences -- grouped-query attention (K and V
    are h × h/4: 2·h·(3h/4) fewer a layer), no learned positions (RoPE: s·h), RMSNorm (no bias: h fewer per norm,
    2 a layer and the final one), no bias on the attention's projection (h a layer) -- 46,702,792,704 in all and
    12,879,925,248 active (2 of 8 experts): Mistral AI's 46.7 B and 12.9 B to their three digits (tolerance ±0.05 B,
    their rounding). The SwiGLU experts are exact: three h × 14,336 matrices = two of 21,504."""
    mixtral = ModelConfig.mixtral_8x7b()
    h, L = 4096, 32
    assert expert_params(mixtral) == 3 * h * 14336
    named = 2 * h * (h - h // 4) * L + mixtral.seq_len * h + (2 * L + 1) * h + h * L
    total, active = num_params(mixtral).total - named, active_params(mixtral) - named
    assert (total, active) == (46_702_792_704, 12_879_925_248)
    assert abs(total - 46.7e9) < 0.05e9 and abs(active - 12.9e9) < 0.05e9
    assert named / num_params(mixtral).total == pytest.approx(0.0197, abs=5e-4)       # the docstring's 2.0%


def test_flops_count_k_experts_not_e():
    """6·P·T counts the parameters a token uses: with 8 or 64 experts (top-2) the experts' FLOPs are the same, 6 ·
    L·k·2hf a token, and only the router (6·E·h a token a layer) grows; the whole is 6 · active_params · T plus
    attention's 12·L·s·h. Full recomputation adds one forward of the experts too (8 in place of 6)."""
    T, h, L, s = 4096, 1024, 24, 2048
    eight, sixty_four = (replace(MEDIUM_MOE, experts=E) for E in (8, 64))
    f8, f64 = compute_flops(eight, T), compute_flops(sixty_four, T)
    assert f8.experts == f64.experts == 6 * L * 2 * (2 * h * 4 * h) * T, \
        f"E = 64 costs {f64.experts / f8.experts:.1f} times E = 8's expert FLOPs, not the same"
    assert f64.dense - f8.dense == 6 * (64 - 8) * h * L * T
    assert f8.total == 6 * active_params(eight) * T + 12 * L * s * h * T
    assert compute_flops(eight, T, "full").experts == f8.experts * 8 / 6


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_states_divide_the_experts_by_ep_and_shard_them_over_dp_over_ep(zero):
    """Mixed precision (2 + 2 + 12 bytes), dp = 8, ep = 4: the dense parameters as before (ZeRO over 8), the rank's
    E/4 experts sharded by ZeRO over the dp/ep = 2 ranks that hold them (torchtitan's dp_shard_in_ep)."""
    count = num_params(MEDIUM_MOE)
    dense, experts = count.total - count.experts, count.experts // 4

    def share(n, bytes_, sharded, group):
        return n * bytes_ / (group if sharded else 1)

    expected = [share(dense, b, zero >= stage, 8) + share(experts, b, zero >= stage, 2)
                for b, stage in ((2, 3), (2, 2), (12, 1))]
    got = rank_state_bytes(MEDIUM_MOE, Layout(dp=8, ep=4, zero=zero))
    assert [got.params, got.grads, got.optimizer] == pytest.approx(expected, rel=1e-12)
    if zero == 0:
        assert got.total < rank_state_bytes(MEDIUM_MOE, Layout(dp=8, zero=0)).total / 3


def test_the_moe_layers_activations_use_k_experts_hidden_the_imbalance_and_the_capacity():
    """moe_activation_bytes (2 bytes, dropout masks): T·h·3 + 2·T·E + 2·R·h + 4·R·f/t + 2·K·(h + 1), R the busiest
    rank's rows, K its own assignments. k = 2 of 32 experts: R = K = 2T. With ep = 4 and imbalance 1.5 the busiest
    rank computes 1.5 times the rows; with a capacity factor 1.25, an expert takes at most C = ceil(1.25·2T/32)
    rows from a rank: R ≤ 32·C whatever the imbalance. With ep = 1 the imbalance changes nothing (one rank holds
    every expert). memory_per_gpu swaps Table 2's MLP share (19·s·b·h at 2 bytes, tp = 1) for it, per layer."""
    T, h, f, E = 2048, 1024, 4096, 32

    def by_hand(R, K):
        return 3 * T * h + 2 * T * E + 2 * R * h + 4 * R * f + 2 * K * (h + 1)

    assert moe_activation_bytes(MEDIUM_MOE, T) == by_hand(2 * T, 2 * T)
    assert moe_activation_bytes(MEDIUM_MOE, T, ep=4, imbalance=1.5) == by_hand(3 * T, 2 * T)
    assert moe_activation_bytes(MEDIUM_MOE, T, ep=1, imbalance=1.5) == by_hand(2 * T, 2 * T)
    capped = replace(MEDIUM_MOE, capacity_factor=1.25)
    C = math.ceil(1.25 * 2 * T / E)
    assert moe_activation_bytes(capped, T, ep=4, imbalance=3.0) == by_hand(E * C, 2 * T)
    dense = replace(MEDIUM_MOE, experts=0)
    per_layer = (memory_per_gpu(MEDIUM_MOE, Layout(), 1).activations - memory_per_gpu(dense, Layout(), 1).activations)
    assert per_layer == 24 * (by_hand(2 * T, 2 * T) - 19 * T * h)


def test_ep_sends_four_all_to_alls_a_layer_and_the_busiest_rank_imbalance_times_more():
    """Per MoE layer and micro-batch: dispatch and combine, forward and backward, each (ep−1)/ep · k·b·s·h per rank
    (GShard's even routing); the imbalance multiplies the busiest rank's all-to-all bytes and its experts' compute
    time, the capacity caps both (an expert takes at most C rows of a rank); the gradients: dense over dp, experts
    over dp/ep. Time: one naive all-to-all step on the ep group's link, as Ulysses' (chapter 01's closed form): twice
the bytes, twice the time less one latency a call."""
    b, s, h, L, m, ep = 2, 2048, 1024, 24, 2, 4
    layout = Layout(dp=8, ep=ep, micro_batches=m)
    ep_bytes = communication_bytes(MEDIUM_MOE, layout, b, 1).ep
    assert ep_bytes == 4 * (ep - 1) / ep * 2 * b * s * h * L * m
    assert communication_bytes(MEDIUM_MOE, layout, b, 1, imbalance=1.5).ep == 1.5 * ep_bytes
    capped = replace(MEDIUM_MOE, capacity_factor=1.25)
    assert communication_bytes(capped, layout, b, 1, imbalance=3.0).ep == 1.25 * ep_bytes
    rows = step_collectives(MEDIUM_MOE, layout, b)
    reduces = [(r.group, r.axes) for r in rows if r.op == "all_reduce"]
    assert reduces == [(8, ()), (2, ("edp",))], reduces
    even, skewed = (step_time(MEDIUM_MOE, layout, A100, 8 * m * b, imbalance=x) for x in (1.0, 2.0))
    experts = compute_flops(MEDIUM_MOE, 8 * m * b * s).experts
    assert skewed.compute - even.compute == pytest.approx(experts / 8 / (A100.flops * A100.efficiency), rel=1e-9)
    calls = 2 * 2 * L * m                     # dispatch and combine, forward and backward, each layer and micro-batch
    assert skewed.communication.ep == pytest.approx(2 * even.communication.ep - calls * A100.intra_latency, rel=1e-9)


def test_the_ep_group_is_neighbours_and_the_experts_dp_group_ep_apart():
    """ep is the inner part of dp (torchtitan: dp_shard_in_ep outside ep): dp = 16 as 4 × ep = 4 on nodes of 8 -- the
    ep groups stay inside a node, the experts' gradient groups (dp/ep = 4 ranks, 4 apart) span two nodes, and the
    dense dp group of 16 spans two."""
    layout = Layout(dp=16, ep=4)
    links = [group_network(layout, A100, axes)[1] for axes in (("ep",), ("edp",), ("dp",))]
    assert links == ["intra", "intra+net", "intra+net"]
    assert group_network(Layout(dp=64, ep=8), A100, ("edp",))[1] == "net"


@pytest.mark.parametrize("build, says", [
    (lambda: Layout(dp=2, ep=4), "ep = 4 must divide dp = 2"),
    (lambda: Layout(dp=4, tp=2, ep=2), "expert parallelism is modelled with dp and pp only"),
    (lambda: evaluate(ModelConfig.gpt2_small(), Layout(dp=4, ep=2), A100, 8),
     "ep = 2 needs an MoE model (ModelConfig.experts > 0)"),
    (lambda: evaluate(replace(SMALL_MOE, experts=6), Layout(dp=4, ep=4), A100, 8),
     "experts 6 over ep 4: ep must divide the expert count"),
    (lambda: evaluate(SMALL_MOE, Layout(tp=2, sequence_parallel=True), A100, 8),
     "sequence parallelism of an MoE layer is not modelled"),
    (lambda: ModelConfig(16, 32, 16, 2, 2, experts=4, top_k=5), "top_k = 5 experts per token, but only 4 experts"),
    (lambda: ModelConfig(16, 32, 16, 2, 2, experts=1), "ModelConfig.experts is 0 (a dense MLP) or"),
])
def test_what_cannot_run_is_refused_with_what_to_change(build, says):
    with pytest.raises(ValueError) as error:
        build()
    assert says in str(error.value)


def test_a_dense_model_is_never_given_ep():
    """layouts() offers ep only to a model with experts, and then every ep that divides dp and the experts (tp = sp = 1)."""
    dense = list(layouts(ModelConfig.gpt2_small(), A100, 8, 32))
    assert {layout.ep for layout in dense} == {1}
    moe = list(layouts(SMALL_MOE, A100, 8, 32))
    assert {layout.ep for layout in moe} == {1, 2, 4}
    for layout in moe:
        if layout.ep > 1:
            assert layout.dp % layout.ep == 0 and layout.tp == layout.sp == 1 and 4 % layout.ep == 0, layout
    assert {layout.ep for layout in layouts(SMALL_MOE, A100, 8, 32, Space.megatron_2021())} == {1}


MOE_SPACES = [(MEDIUM_MOE, Hardware(memory=40e9), 8, 16, Space(zero=(0, 1), recompute=("none", "full"))),
              (replace(SMALL_MOE, experts=8, top_k=2, capacity_factor=1.0, name="GPT-3 125M, 8 experts, top-2, C 1.0"),
               Hardware(memory=8e9, gpus_per_node=4), 8, 32, Space(zero=(0, 3), recompute=("none",),
                                                                   schedules=("1f1b",)))]


@pytest.mark.parametrize("config,hardware,gpus,batch,space", MOE_SPACES, ids=[s[0].name for s in MOE_SPACES])
def test_plan_ranks_an_moe_as_brute_force(config, hardware, gpus, batch, space):
    """plan's pruned search returns brute force's fitting head for an MoE (ep layouts in the space, some not
    fitting), and its bound holds for every layout of every group (ep included)."""
    everything = brute_force(config, hardware, gpus, batch, space, imbalance=1.2)
    assert any(c.layout.ep > 1 for c in everything) and any(not c.fits for c in everything)
    for top in (1, 10):
        assert plan(config, hardware, gpus, batch, top, space, imbalance=1.2) == [c for c in everything if c.fits][:top]
    for c in everything:
        group = Layout(dp=c.layout.dp, tp=c.layout.tp, pp=c.layout.pp, sp=c.layout.sp, zero=c.layout.zero,
                       ep=c.layout.ep)
        assert lower_bound(config, group, hardware, batch, space, imbalance=1.2) <= c.seconds * (1 + 1e-12), c.layout


def test_ep_is_chosen_when_the_experts_do_not_fit_otherwise():
    """GPT-3 Medium with 32 experts, top-2 (6.6 B parameters, 6.4 B of them experts) on 8 A100s, 16 sequences, no ZeRO:
    at dp alone the model states are 16 bytes × 6.6 B = 106 GB > 80 GB. ep = 8 keeps 4 experts a GPU (15 GB of
    states) and the plan takes it; its reason says so. Without ep the best is a pipeline of 8 stages, whose bubble
    (16 micro-batches) makes it slower; the all-to-alls cost less (5 ms) than that bubble (15 ms)."""
    space = Space(zero=(0,))
    best = plan(MEDIUM_MOE, A100, 8, 16, top=1, space=space)[0]
    assert (best.layout.dp, best.layout.ep, best.layout.pp) == (8, 8, 1), best.layout
    assert rank_state_bytes(MEDIUM_MOE, Layout(dp=8)).total > A100.memory
    line = [r for r in best.reasons if r.startswith("ep = 8")][0]
    assert "each GPU keeps 4 of 32 experts" in line and "it would not fit" in line, line
    without = plan(MEDIUM_MOE, A100, 8, 16, top=1, space=replace(space, max_ep=1))[0]
    assert without.layout.ep == 1 and without.layout.pp > 1 and without.seconds > best.seconds
    assert best.time.communication.ep < without.time.bubble


def test_ep_is_not_chosen_when_the_all_to_alls_cost_more_than_they_save():
    """GPT-3 125M with 4 experts, top-1 (0.35 B parameters) on 8 A100s, 64 sequences: everything fits at dp alone.
    ep would only trade the experts' share of the gradient reduction (2·(dp/ep − 1)/(dp/ep) of Ψ_experts/ep in place
    of 2·(dp − 1)/dp of Ψ_experts) for the all-to-alls of every token's activations (4·(ep−1)/ep · k·T·h a layer):
    more bytes, so the plan keeps ep = 1, and every ep layout is slower."""
    best = plan(SMALL_MOE, A100, 8, 64, top=1)[0]
    assert best.layout.ep == 1 and best.layout.dp == 8, best.layout
    layout = replace(best.layout, zero=0)
    with_ep = communication_bytes(SMALL_MOE, replace(layout, ep=2), 64 // (8 * layout.micro_batches))
    without = communication_bytes(SMALL_MOE, layout, 64 // (8 * layout.micro_batches))
    assert with_ep.ep + with_ep.dp > without.dp
    assert all(c.seconds > best.seconds for c in brute_force(SMALL_MOE, A100, 8, 64, Space(zero=(best.layout.zero,)))
               if c.layout.ep > 1)


def test_the_worked_examples_in_the_docstrings_hold():
    for module in (costmodel_config, costmodel_experts, costmodel_gpu_memory, costmodel_params):
        failures, tried = doctest.testmod(module)
        assert tried and not failures, f"{module.__name__}: {failures} of {tried} examples fail"
