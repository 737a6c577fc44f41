"""parallel: one package per parallelism; importing it registers every strategy with the loop.

Each package has the same shape -- the algorithm, its communication, and PyTorch's counterpart side by
side -- and registers its :class:`coursekit.strategy.Strategy` subclasses for :func:`coursekit.train.train`:

* ``data`` -- chapter 02: replicas, gradients averaged ("naive", "bucketed"), ZeRO stages 1–3 ("zero1",
  "zero2", "zero3"), ZeRO-3 one unit at a time ("zero3_units"), ZeRO-1 as a ``torch.optim.Optimizer``
  ("sharded_optimizer"), one bucket rule for all of them (``buckets``); PyTorch's DDP, ZeroRedundancyOptimizer and FSDP2 ("torch_ddp", "torch_zero1",
  "torch_fsdp");
* ``pipeline`` -- chapters 03 and 04: layers cut into stages ("model"), pipeline schedules as data, their
  validator and plan, one executor ("pipeline"); ``torch.distributed.pipelining`` ("torch_pipeline");
* ``tensor`` -- chapter 05: Megatron-LM's column and row splits, the vocabulary-parallel loss ("tensor",
  "dp_tp"); DTensor's ``parallelize_module`` beside them;
* ``sequence`` -- chapter 06: chunk-local attention, ring attention, Ulysses ("chunk_local",
  "ring_attention", "ulysses"); Megatron-style beside tensor parallelism ("sequence_tensor"); sequence x
  data on a mesh ("sequence_data");
* ``expert`` -- mixture-of-experts layers: routing, balance, capacity, experts over ranks with all-to-all
  dispatch and combine (the layer and its parallel form; no strategy yet).

The course transformer is written once (:mod:`coursekit.models`); a parallelism that splits it is a plan, a
table from module path to what replaces the module there (:mod:`coursekit.parallel.plan`; tensor's:
:data:`coursekit.parallel.tensor.plan.TRANSFORMER_PLAN`).
"""

from . import data, pipeline, tensor, sequence  # noqa: F401  (in this order: chapters 02, 03-04, 05, 06)
from . import expert  # noqa: F401,E402  (expert parallelism: a mixture of experts over ranks)
from . import hybrid  # noqa: F401,E402  (the capstone: all of them on one mesh)
