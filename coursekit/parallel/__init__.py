"""parallel: one module per parallelism strategy; importing it registers every strategy with the loop.

Each module defines its classes and registers its :class:`coursekit.strategy.Strategy`
subclasses for :func:`coursekit.train.train`:

* ``data`` (replicas, gradients averaged: "naive", "bucketed") and ``zero`` (ZeRO stages 1–3),
  ``fsdp`` (ZeRO-3 one unit at a time: "zero3_units"), ``sharded_optimizer`` (ZeRO-1 as a
  ``torch.optim.Optimizer``), ``buckets`` (how big a bucket is, one rule for all of them) -- chapter 02;
* ``model`` (layers cut into stages: "model") -- chapter 03; ``schedules`` (pipeline schedules as
  data) and ``pipeline`` (their executor: "pipeline") -- chapter 04;
* ``tensor`` and ``tensor_model`` (Megatron-LM's column and row splits: "tensor", "dp_tp") -- chapter 05;
* ``sequence``, ``ring_attention``, ``sequence_comm``, ``sequence_tensor``, ``sequence_data`` (the
  sequence split: "chunk_local", "ring_attention", "ulysses"; Megatron-style beside tensor parallelism:
  "sequence_tensor"; sequence x data on a mesh: "sequence_data") -- chapter 06;
* PyTorch's own, to run side by side: ``production`` (DDP, ZeroRedundancyOptimizer, FSDP2),
  ``pipelining_torch`` (``torch.distributed.pipelining``: "torch_pipeline").
"""

from . import data, production, zero  # noqa: F401
from . import fsdp  # noqa: F401  (ZeRO-3 one unit at a time: "zero3_units")
from . import sharded_optimizer  # noqa: F401  (ZeRO-1 as a torch.optim.Optimizer: "sharded_optimizer")
from . import model, pipeline, pipelining_torch  # noqa: F401  (chapters 03 and 04)
from . import tensor, tensor_model  # noqa: F401  (chapter 05)
from . import ring_attention, sequence, sequence_comm, sequence_tensor  # noqa: F401  (chapter 06)
from . import sequence_data  # noqa: F401  (chapter 06: sequence x data on a mesh, "sequence_data")
