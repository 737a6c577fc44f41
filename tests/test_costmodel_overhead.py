"""The cost model's per-op and memory-bound term: its arithmetic by hand, its op count against PyTorch's, and the GPU
presets left as they were.

* by hand, on a 1-layer model of width 4 (v = 4, s = 2, 1 head, 264 parameters, one sequence of 2 tokens, Adam):
  FLOPs 6·264·2 + 12·1·2·4·2 = 3,360; ops 97 (the layer) + 37 (the ends) + 15·9 + 2 (Adam over 15 tensors) = 271;
  bytes 2·3·(10·4 + 10·4 + 2·1·2)·4 + 2·3·(5·4 + 2·4)·4 + 264·19·4 = 2,016 + 672 + 20,064 = 22,752, and the
  weights streamed, each matmul's read forward and for its input's gradient: 2·(12·4² + 4·4)·4 = 1,664 (one
  micro-batch: nothing accumulated) -- at 1 GFLOP/s, 1 µs an op and 1 GB/s: 3.36 + 271 + 24.416 = 298.776 µs;
* the ops :mod:`coursekit.costmodel.overhead` counts from the shape equal those PyTorch dispatches (a
  ``TorchDispatchMode`` around forward, loss and backward of the course transformer, and around an optimizer step),
  kind by kind first -- each kind's signature op (``native_layer_norm`` for a norm, ``addmm`` for a linear with a
  bias, ``gelu``, the attention kernel, ``embedding``) against how many modules of that kind the formula holds -- so
  that a kind left out is named;
* GPU presets: ``Hardware()`` has neither term, and a step's compute is the FLOPs' alone, to the bit.

Planted and seen failing (each undone):

* GELU left out of :func:`~coursekit.costmodel.overhead.layer_modules` -> "gelu: the formula holds 0 modules a
  layer and 0 in the ends (0 in all), the step dispatched 2 gelu: a kind left out of layer_modules or
  ends_modules, or OPS_PER_MODULE stale for this PyTorch (2.13.0+cpu)" (and by hand: 95 == 97 ops a layer);
* the final norm left out of ``ends_modules`` -> "layer_norm: the formula holds 2 modules a layer and 0 in the
  ends (4 in all), the step dispatched 5 native_layer_norm: ..." (by hand: 33 == 37 ops in the ends);
* Adam's ops per tensor 8 in place of 9 -> "adam over 26 tensors: the formula 210 ops, the step dispatched 236:
  [('_local_scalar_dense', 26), ...]" (by hand: 282.112 µs against 297.112);
* the weights read once a micro-batch, not twice (``2 * weights`` -> ``weights`` in ``streamed_and_accumulated``)
  -> test_the_term_by_hand_on_a_tiny_model: 297.944 µs against the hand count's 298.776 (and the pipeline's
  bubble);
* gradients accumulated on every micro-batch (``micro_batches - 1`` -> ``micro_batches``): 301.944 µs against
  298.776 (one micro-batch accumulates nothing), and the pipeline's bubble against the hand count;
* the optimizer's time inside what the bubble stretches (``(compute + pipelined + step) * f / (1 - f)``) ->
  the pipeline's bubble 203.584 µs against the hand count's 129.856.
"""

import math

import pytest
import torch

from coursekit.measure.op_cost import CountOps
from coursekit.costmodel import (Hardware, Layout, ModelConfig, compute_flops, compute_time, communication_bytes,
                                 communication_time, optimizer_ops, parameter_tensors, step_time)
from coursekit.costmodel.overhead import OPS_PER_MODULE, ends_modules, ends_ops, layer_modules, layer_ops
from coursekit.models import loss_fn, tiny_transformer

TINY = ModelConfig.course(vocab=4, d_model=4, n_heads=1, n_layers=1, max_seq_len=2)
PROBED = Hardware(memory=math.inf, flops=1e9, efficiency=1.0, op_overhead=1e-6, memory_bandwidth=1e9)
# each kind's signature op: dispatched once per module of the kind, forward
SIGNATURE = {"layer_norm": "native_layer_norm", "linear": "addmm", "gelu": "gelu",
             "attention": "_scaled_dot_product_flash_attention_for_cpu", "embedding": "embedding"}


def test_the_term_by_hand_on_a_tiny_model():
    assert compute_flops(TINY, 2).total == 6 * 264 * 2 + 12 * 1 * 2 * 4 * 2 == 3360
    assert layer_ops(TINY) == 97 and ends_ops() == 37 and parameter_tensors(TINY) == 15
    t = compute_time(TINY, Layout(), PROBED, global_batch=1, itemsize=4)
    ops = 97 + 37 + 15 * 9 + 2
    streamed = 2 * (12 * 4**2 + 4 * 4) * 4                   # the layer's 12h² and the tied head's v·h, read twice
    moved = 2 * 3 * (10 * 4 + 10 * 4 + 2 * 1 * 2) * 4 + 2 * 3 * (5 * 4 + 2 * 4) * 4 + 264 * 19 * 4 + streamed
    assert (ops, moved) == (271, 24416)
    assert t.compute == pytest.approx(3360 / 1e9 + ops * 1e-6 + moved / 1e9, rel=1e-12)
    assert t.compute == pytest.approx(298.776e-6, rel=1e-12) and t.bubble == 0


def test_a_pipeline_stretches_the_micro_batches_not_the_optimizer():
    """p = 2, m = 2 on 2 layers: the bubble is (p − 1)/m = 1/2 of the FLOPs and the micro-batches' ops and bytes
    (the weights streamed each micro-batch and the second micro-batch's gradients accumulated included), none of
    the optimizer's (it runs once, after the flush)."""
    config = ModelConfig.course(vocab=4, d_model=4, n_heads=1, n_layers=2, max_seq_len=2)
    t = compute_time(config, Layout(pp=2, micro_batches=2), PROBED, global_batch=2, itemsize=4)
    flops = compute_flops(config, 2 * 2).total / 2 / 1e9
    # the busier stage: the last -- 1 layer (97), the final norm (1 + 3), the head (4 + 9), the loss (5 + 5)
    micro_ops = 97 + (1 + 3) + (4 + 9) + (5 + 5)
    micro_bytes = 2 * 3 * (10 * 4 + 10 * 4 + 2 * 1 * 2) * 4 + 2 * 3 * (5 * 4 + 2 * 4) * 4   # 2 tokens a micro-batch
    streamed = 2 * 2 * (12 * 4**2 + 4 * 4) * 4                 # 2 micro-batches: the layer and the head, read twice
    accumulated = 3 * (232 + 8 + 16) * 4                         # once: the stage's layer, final norm, head copy
    pipelined = 2 * micro_ops * 1e-6 + (2 * micro_bytes + streamed + accumulated) / 1e9
    f = 1 / 3                                                            # 1F1B: (p − 1)/(m + p − 1)
    assert t.bubble == pytest.approx((flops + pipelined) * f / (1 - f), rel=1e-12)
    optimizer = (parameter_tensors(config, 1, first=False, last=True) * 9 + 2) * 1e-6
    assert parameter_tensors(config, 1, first=False, last=True) == 11 + 2 + 1    # the tied head's copy
    assert t.compute > flops + pipelined + optimizer                  # and the optimizer's bytes on top, once


def test_gpu_presets_are_unchanged():
    a100 = Hardware()
    assert a100.op_overhead == 0 and a100.memory_bandwidth == math.inf
    gpt2 = ModelConfig.gpt2_small()
    for layout in (Layout(dp=8), Layout(tp=4, pp=2, micro_batches=8), Layout(dp=2, sp=2, recompute="full")):
        t = compute_time(gpt2, layout, a100, 64)
        flops = compute_flops(gpt2, 64 * gpt2.seq_len, layout.recompute).total / layout.gpus / (312e12 * 0.5)
        assert t.compute == flops                                        # to the bit: no term added
    assert round(step_time(gpt2, Layout(dp=8), a100, 64).compute * 1e3, 1) == 45.2     # step.py's doctest


def _count_step(model, optimizer=None):
    idx = torch.randint(0, model.tok_emb.num_embeddings, (2, 7), generator=torch.Generator().manual_seed(0))
    with CountOps() as counted:
        loss_fn(model(idx), idx).backward()
    if optimizer is None:
        return counted
    optimizer.step()                                     # the first step makes the state: count a later one
    with CountOps() as stepped:
        optimizer.step()
    return counted, stepped


@pytest.mark.parametrize("layers,tied", [(2, True), (3, False)])
def test_the_ops_counted_from_the_shape_are_pytorchs(layers, tied):
    """The course transformer's forward, loss and backward, kind by kind and in all (231 at 2 layers, tied)."""
    model = tiny_transformer(n_layers=layers, tie_weights=tied)
    config = ModelConfig.course(n_layers=layers, tie_weights=tied)
    counted = _count_step(model)
    modules = {kind: layers * n for kind, n in layer_modules(config).items()}
    for kind, n in ends_modules().items():
        modules[kind] = modules.get(kind, 0) + n
    modules["embedding"] = modules.get("embedding", 0) + modules.get("positions", 0)   # positions: an embedding too
    for kind, op in SIGNATURE.items():
        assert modules.get(kind, 0) == counted.counts.get(op, 0), (
            f"{kind}: the formula holds {layer_modules(config).get(kind, 0)} modules a layer and "
            f"{ends_modules().get(kind, 0)} in the ends ({modules.get(kind, 0)} in all), the step dispatched "
            f"{counted.counts.get(op, 0)} {op}: a kind left out of layer_modules or ends_modules, or OPS_PER_MODULE "
            f"stale for this PyTorch ({torch.__version__})")
    formula = layers * layer_ops(config) + ends_ops()
    assert formula == counted.total, (f"the formula counts {formula} ops, the step dispatched {counted.total}: "
                                      f"{sorted(counted.counts.items())}; per kind {OPS_PER_MODULE}")


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_the_optimizers_ops_are_pytorchs(name):
    model = tiny_transformer()
    make = {"adam": lambda p: torch.optim.Adam(p), "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)}[name]
    _, stepped = _count_step(model, make(model.parameters()))
    tensors = parameter_tensors(ModelConfig.course())
    assert tensors == len(list(model.parameters())) == 26
    assert optimizer_ops(tensors, name) == stepped.total, (
        f"{name} over {tensors} tensors: the formula {optimizer_ops(tensors, name)} ops, the step dispatched "
        f"{stepped.total}: {sorted(stepped.counts.items())}")


def test_gradients_in_many_calls_cost_latencies_not_bytes():
    course, layout = ModelConfig.course(), Layout(dp=2)
    one = communication_time(course, layout, PROBED, 8, 4)
    many = communication_time(course, layout, PROBED, 8, 4, dp_calls=26)
    assert communication_bytes(course, layout, 8, 4, dp_calls=26).dp == communication_bytes(course, layout, 8, 4).dp
    assert many.dp > one.dp
