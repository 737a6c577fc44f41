"""What a step of small operations costs beyond its FLOPs: a fixed cost per operation, and memory-bound bytes.

    seconds = ops × op_overhead + bytes / memory_bandwidth        (the matmuls' FLOPs / flops: :mod:`.compute`)

The FLOPs count the matmuls. On a layer thousands wide they are the step; on the course transformer (64 wide,
hundreds of tokens a rank) each matmul takes microseconds, and the step is made of everything around them:

* **ops** -- every operation a step dispatches (PyTorch's ATen ops: forward, backward and the optimizer's),
  each paying a fixed cost whatever its size -- Python, the module call, the autograd graph, the dispatcher,
  on a GPU a kernel launch. Counted **from the model's shape**, per kind of module (:data:`OPS_PER_MODULE`: a linear
  layer is 4 ops forward on a ``(b, s, h)`` input ...; a transformer layer is 4 linears, 2 layer norms, an
  attention core, a GELU and 2 residual adds), not counted at run time: so that the model prices a model it
  cannot run (another shape, GPT-3 for the planner), and so that a PyTorch whose decompositions change
  fails tests/test_costmodel_overhead.py, which counts the course block's ops under a
  ``TorchDispatchMode`` and names the kind that moved, instead of silently moving the fit.
* **bytes** -- what the memory-bound ops must move, each tensor read or written once (the roofline's count,
  :mod:`coursekit.measure.roofline`): per token and layer forward, the layer norms (``2h`` each), the
  residual adds (``3h`` each), GELU (``2·4h/t``), attention's probabilities (``2·(a/t)·s``: softmax reads and
  writes the scores) and the heads' re-layout (``2h/t``); backward twice the forward (each op's gradient in
  and out, beside its saved input); the optimizer's passes over every parameter (:data:`OPTIMIZER_PASSES`);
  and two more, which the matmuls' FLOPs leave out:

  - **weights streamed**: a matmul reads its weight from memory each time it runs, twice a micro-batch
    (forward, and the input's gradient): ``2·W`` a micro-batch, ``W`` the rank's matmul weights. On a core, a
    matmul of few rows costs its FLOPs *plus* these bytes (measured here, one thread: 64 rows × 1,024² took
    0.96 ms, 0.64 ms of FLOPs at the probe's rate + 0.30 ms for the 4 MB weight at its bandwidth; at 256 rows
    the weight's share is a tenth);
  - **gradient accumulation**: each micro-batch after the first adds its gradients into ``.grad`` (autograd's
    ``AccumulateGrad``: read both, write one), ``3·P`` a micro-batch for the rank's ``P`` parameters.

:class:`Work` holds the three counts of one rank's step, :meth:`Work.seconds` prices them on a
:class:`~.config.Hardware`. ``op_overhead`` and ``memory_bandwidth`` are fitted once by a probe, as α and β
are for the network (``python -m coursekit.bench costmodel``); a GPU preset has them off (``Hardware``'s
docstring says why), and then :func:`~.compute.compute_time` is what it was, to the bit.

    >>> hw = Hardware(flops=100e9, efficiency=1.0, op_overhead=10e-6, memory_bandwidth=10e9)
    >>> Work(flops=1e9, ops=500, bytes=2e7).seconds(hw)          # 10 ms + 5 ms + 2 ms
    0.017
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Hardware, Layout, ModelConfig
from .params import params_per_rank, stage_layers

__all__ = ["Work", "StepOverhead", "OPS_PER_MODULE", "OPTIMIZER_OPS", "OPTIMIZER_STEP_OPS", "OPTIMIZER_PASSES", "layer_modules",
           "ends_modules", "ops_of", "layer_ops", "ends_ops", "parameter_tensors", "optimizer_ops",
           "layer_bytes_per_token", "ends_bytes_per_token", "streamed_and_accumulated", "transformer_overhead", "mlp_work"]


@dataclass(frozen=True)
class Work:
    """One rank's step: matmul ``flops``, dispatched ``ops``, ``bytes`` moved by the memory-bound ops."""

    flops: float = 0.0
    ops: float = 0.0
    bytes: float = 0.0

    def overhead_seconds(self, hardware: Hardware) -> float:
        """``ops × op_overhead + bytes / memory_bandwidth`` (0 on a GPU preset)."""
        return self.ops * hardware.op_overhead + self.bytes / hardware.memory_bandwidth

    def seconds(self, hardware: Hardware, efficiency: float | None = None) -> float:
        """All three: the overhead, and the FLOPs at ``flops × efficiency`` (default ``hardware.efficiency``)."""
        reached = hardware.flops * (hardware.efficiency if efficiency is None else efficiency)
        return self.flops / reached + self.overhead_seconds(hardware)

    def __add__(self, other: "Work") -> "Work":
        return Work(self.flops + other.flops, self.ops + other.ops, self.bytes + other.bytes)

    def scaled(self, k: float) -> "Work":
        return Work(self.flops * k, self.ops * k, self.bytes * k)


# ------------------------------------------------------------------------------------------------- ops, by kind
# (forward, backward) ATen ops of one module of each kind on a (b, s, h) input, PyTorch 2.x on a CPU, each
# parameter's gradient accumulation included (a ``detach``); tests/test_costmodel_overhead.py counts them.
OPS_PER_MODULE = {
    "linear": (4, 12),           # t, view, addmm, view | 2 views, 4 t, 2 mm, the bias's sum, 2 accumulations, 1 view
    "linear_no_bias": (4, 9),    # t, view, mm, _unsafe_view | 2 views, 4 t, 2 mm, 1 accumulation
    "layer_norm": (1, 3),        # native_layer_norm | its backward, 2 accumulations
    "attention": (11, 11),       # split, 4 views, 4 transposes, the fused kernel, a detach | the same, backward
    "gelu": (1, 1),
    "residual": (1, 1),          # add | the two branches' gradients summed
    "embedding": (1, 2),         # embedding | embedding_dense_backward, 1 accumulation
    "positions": (3, 4),         # arange, embedding, add | sum over the batch, view, the embedding's backward, 1
    "loss": (5, 5),              # cross-entropy: 2 views, log_softmax, nll_loss, a detach | backwards, ones_like
    "linear_2d": (2, 10),        # on a (rows, h) input: t, addmm | 4 t, 2 mm, the bias's sum, a view, 2 accumulations
}
# ATen ops per parameter tensor of one optimizer step (torch.optim's for-loop implementation, a CPU's default):
# Adam's step counter add_, lerp_, mul_, addcmul_, the counter's item(), sqrt, div, add_, addcdiv_; SGD's mul_,
# add_, add_ -- and 2 more a step (the step's record_function)
OPTIMIZER_OPS = {"adam": 9, "sgd": 3}
OPTIMIZER_STEP_OPS = 2
# elements read + written per parameter by one optimizer step (the same passes: Adam's 8 passes over p, g, m, v)
OPTIMIZER_PASSES = {"adam": 19, "sgd": 8}


def layer_modules(config: ModelConfig) -> dict[str, int]:
    """One transformer layer by kind: 4 linears (q, k, v in one), 2 norms, attention, GELU, 2 residual adds."""
    with_bias = 3 + config.qkv_bias
    return {"linear": with_bias, "linear_no_bias": 4 - with_bias, "layer_norm": 2, "attention": 1, "gelu": 1,
            "residual": 2}


def ends_modules(first: bool = True, last: bool = True) -> dict[str, int]:
    """The first stage's token embedding and positions, the last stage's final norm, head and loss."""
    return {**({"embedding": 1, "positions": 1} if first else {}),
            **({"layer_norm": 1, "linear_no_bias": 1, "loss": 1} if last else {})}


def ops_of(modules: dict[str, int]) -> int:
    """Forward + backward ATen ops of ``modules`` (kind -> how many), by :data:`OPS_PER_MODULE`."""
    return sum(n * sum(OPS_PER_MODULE[kind]) for kind, n in modules.items())


def layer_ops(config: ModelConfig) -> int:
    """Forward + backward ops of one layer on one micro-batch: 97 for the course block (32 + 65)."""
    return ops_of(layer_modules(config))


def ends_ops(first: bool = True, last: bool = True) -> int:
    """Forward + backward ops of the ends on one micro-batch: 37 for the course model's (14 + 23)."""
    return ops_of(ends_modules(first, last))


def parameter_tensors(config: ModelConfig, layers: int | None = None, first: bool = True, last: bool = True) -> int:
    """Parameter tensors of ``layers`` layers (default all) and the ends: 11 a course layer (weights, biases,
    norms' two), token embedding, positions, final norm's 2, the head's unless tied on one stage: 26 in all."""
    layers = config.layers if layers is None else layers
    head = last and (not config.tied or not first)      # tied on a pipeline: the last stage's copy
    return layers * (11 + config.qkv_bias) + (2 if first else 0) + (2 if last else 0) + head


def optimizer_ops(tensors: int, optimizer: str = "adam") -> int:
    """Ops of one optimizer step over ``tensors`` parameter tensors: 236 = 26 · 9 + 2, Adam on the course model."""
    if optimizer not in OPTIMIZER_OPS:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_OPS)} (got {optimizer!r}).")
    return tensors * OPTIMIZER_OPS[optimizer] + OPTIMIZER_STEP_OPS


def layer_bytes_per_token(config: ModelConfig, tp: int = 1, itemsize: int = 4) -> float:
    """Bytes the memory-bound ops of one layer move per token, forward + backward (module docstring):
    ``3 · (10h + 10h/t + 2·(a/t)·s) · itemsize``."""
    h, a, s = config.hidden, config.heads, config.seq_len
    return 3 * (10 * h + 10 * h / tp + 2 * a / tp * s) * itemsize


def ends_bytes_per_token(config: ModelConfig, tp: int = 1, itemsize: int = 4) -> float:
    """The ends' per token, forward + backward: the embedding's add (3h), the final norm (2h), log-softmax (2V/t)."""
    return 3 * (5 * config.hidden + 2 * config.vocab / tp) * itemsize


@dataclass(frozen=True)
class StepOverhead:
    """One rank's step beyond its FLOPs: ``pipelined`` (the micro-batches' forward and backward, what a pipeline's
    bubble stretches) and ``optimizer`` (once a step, after the flush)."""

    pipelined: Work
    optimizer: Work

    def seconds(self, hardware: Hardware) -> tuple[float, float]:
        return self.pipelined.overhead_seconds(hardware), self.optimizer.overhead_seconds(hardware)


def streamed_and_accumulated(weights: float, params: float, micro_batches: int, itemsize: int = 4) -> float:
    """Bytes of one step beyond the ops' own: ``2·weights`` a micro-batch (each matmul's weight read forward and
    for the input's gradient) and ``3·params`` for each micro-batch after the first (``.grad += new``)."""
    return (2 * weights * micro_batches + 3 * params * (micro_batches - 1)) * itemsize


def transformer_overhead(config: ModelConfig, layout: Layout, global_batch: int, itemsize: int = 4,
                         optimizer: str = "adam") -> StepOverhead:
    """The busiest rank's ops and bytes of one step: ``m`` micro-batches through its layers and ends, then one
    optimizer step over its parameters. Tensor parallelism splits the widths, not the ops; pipeline parallelism
    the layers (the busiest stage: the most ops, the ends included). The weights streamed: the layers'
    ``12h²/t`` and, on the last stage, the head's ``v·h/t``."""
    m, pp = layout.micro_batches, layout.pp
    tokens = global_batch / (layout.dp * m) * config.seq_len / layout.sp     # one micro-batch, one rank
    best = None
    for stage in range(pp):
        first, last, layers = stage == 0, stage == pp - 1, stage_layers(config.layers, pp, stage)
        ops = m * (layers * layer_ops(config) + ends_ops(first, last))
        moved = m * tokens * (layers * layer_bytes_per_token(config, layout.tp, itemsize)
                              + (ends_bytes_per_token(config, layout.tp, itemsize) if first or last else 0))
        params = params_per_rank(config, layout.tp, pp, stage).total
        weights = (layers * 12 * config.hidden ** 2 + (config.vocab * config.hidden if last else 0)) / layout.tp
        moved += streamed_and_accumulated(weights, params, m, itemsize)
        step = Work(ops=optimizer_ops(parameter_tensors(config, layers, first, last), optimizer),
                    bytes=params * OPTIMIZER_PASSES[optimizer] * itemsize)
        candidate = StepOverhead(Work(ops=ops, bytes=moved), step)
        if best is None or candidate.pipelined.ops + step.ops > best.pipelined.ops + best.optimizer.ops:
            best = candidate
    return best


def mlp_work(rows: float, width: int, hidden: int, blocks: int, tp: int = 1, itemsize: int = 4) -> Work:
    """Forward + backward of ``blocks`` residual MLP blocks ``x + W₂ gelu(W₁ x)`` (``width -> hidden -> width``,
    biases; :mod:`coursekit.experiments.tensor_versus_model`) on ``rows`` rows, ``hidden`` split over ``tp``:
    FLOPs ``6 · 2·width·hidden/t · rows`` a block, 2 linears + GELU + the add in ops, GELU's and the add's bytes,
    and the two weights streamed twice (one micro-batch: nothing accumulated).

        >>> mlp_work(rows=256, width=1024, hidden=4096, blocks=4).flops / 1e9     # 4 · 6 · 2 · 1024 · 4096 · 256
        51.539607552
    """
    per_row = 3 * (2 * hidden / tp + 3 * width) * itemsize
    weights = blocks * 2 * width * hidden / tp
    return Work(flops=blocks * 6 * 2 * width * hidden / tp * rows,
                ops=blocks * ops_of({"linear_2d": 2, "gelu": 1, "residual": 1}),
                bytes=blocks * rows * per_row + streamed_and_accumulated(weights, 0, 1, itemsize))
