"""Data parallelism (chapter 02): every rank a full replica, gradients averaged -- then ZeRO's shards of it.

One module per step, PyTorch's counterpart last:

* ``core`` -- the algorithm alone, to read top to bottom: the same start (:func:`broadcast_parameters`), each
  rank its slice of the batch
  (:func:`shard_batch`), gradients averaged after backward (:func:`average_gradients`, ``"naive"``) or
  bucket by bucket during it (:class:`DataParallel`, ``"bucketed"``); ``replicated`` -- both in the
  training loop, with mixed precision under ``torch.autocast`` and fp16's loss scale;
* ``zero`` -- :class:`ZeRO` stages 1-3: optimiser state, gradients, then parameters sharded;
  ``zero_strategy`` -- it measured from outside (:class:`MeasuredZeRO`) and in the training loop
  (``"zero1"``, ``"zero2"``, ``"zero3"``);
* ``units``, ``fsdp`` and ``fsdp_strategy`` -- ZeRO-3 one unit at a time (:class:`ShardedUnits`,
  ``"zero3_units"``): the units and the thread that gathers the next one; the wrapper that runs them; it in
  the training loop;
* ``buckets`` -- how big a bucket is: one rule for all of them, DDP's ``bucket_cap_mb``;
* ``flat`` -- ZeRO's flat buffer: the parameters laid end to end, cut into buckets and segments;
* ``precision`` -- mixed precision (:class:`MixedPrecision`, FSDP2's policy names): compute in bf16/fp16,
  fp32 master weights, gradients reduced in a chosen dtype;
* ``sharded_optimizer`` -- ZeRO-1 as a ``torch.optim.Optimizer`` (:class:`ShardedOptimizer`,
  ``"sharded_optimizer"``);
* ``torch`` -- PyTorch's own on the same loop: DDP, ``ZeroRedundancyOptimizer``, FSDP2 (``"torch_ddp"``,
  ``"torch_zero1"``, ``"torch_fsdp"``).

Every name below is importable from here (``from coursekit.parallel.data import DataParallel, ZeRO``).
"""

# In this order: the strategies register with the training loop in the order chapter 02 meets them.
from .buckets import DDP_BUCKET_CAP_MB, bucket_capacity, megabytes
from .precision import LossScaler, MixedPrecision, as_policy, autocast, cast_inputs, loss_scaler_for, scaler_counters
from .flat import Bucket, lay_flat, make_buckets
from .core import DataParallel, all_reduce_flat, average_gradients, broadcast_parameters, shard_batch
from .replicated import Bucketed, MeasuredDataParallel, Naive, Replicated
from .torch import (FSDP2ParameterBytes, GradScaling, TorchDDP, TorchFSDP, TorchZeRO1, grad_scaler,
                    optimizer_class_and_defaults)
from .zero import ZeRO
from .zero_strategy import MeasuredZeRO, ZeroStrategy
from .units import (CommThread, Job, Unit, average_whole, default_units, gather_whole, kept_whole, layer_units,
                    plan_units)
from .fsdp import ShardedUnits
from .fsdp_strategy import Zero3Units
from .sharded_optimizer import ELEMENTWISE, ShardedOptimizer, ShardedOptimizerStrategy
from .clip import clip_grad_norm_

__all__ = ["clip_grad_norm_", "DDP_BUCKET_CAP_MB", "bucket_capacity", "megabytes", "MixedPrecision", "as_policy", "autocast", "cast_inputs", "LossScaler", "loss_scaler_for", "scaler_counters",
           "Bucket", "lay_flat", "make_buckets", "broadcast_parameters", "average_gradients", "all_reduce_flat", "shard_batch", "DataParallel", "MeasuredDataParallel", "Replicated", "Naive", "Bucketed",
           "ZeRO", "MeasuredZeRO", "ZeroStrategy",
           "default_units", "layer_units", "plan_units", "Unit", "Job", "CommThread", "gather_whole", "kept_whole", "average_whole", "ShardedUnits", "Zero3Units",
           "ShardedOptimizer", "ShardedOptimizerStrategy", "ELEMENTWISE",
           "TorchDDP", "TorchZeRO1", "TorchFSDP", "FSDP2ParameterBytes", "optimizer_class_and_defaults",
           "grad_scaler", "GradScaling"]
