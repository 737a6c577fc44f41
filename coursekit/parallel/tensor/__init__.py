"""Tensor parallelism (chapter 05, Megatron-LM): one matrix multiplication split over the ranks of an axis.

* ``core`` -- the algorithm, to read top to bottom: the conjugate operators f and g,
  :class:`ColumnParallelLinear` and :class:`RowParallelLinear`, the MLP and attention blocks, the
  vocabulary-parallel embedding and cross-entropy, and how every size is cut (:func:`shard_sizes`);
* ``plan`` -- which slots of the one course transformer they replace (:data:`TRANSFORMER_PLAN`, a table from
  module path to a style, applied by :func:`coursekit.parallel.plan.parallelize_module`);
* ``strategy`` -- the course transformer split by that plan (:func:`parallelize_transformer`) and gathered back
  (:func:`gather_dense`); the strategies ``"tensor"`` and ``"dp_tp"``; what a step issues, counted
  (:func:`count_communication`) and as a formula (:func:`expected_counts`);
* ``activations`` -- what one block keeps for backward per rank (:func:`tensor_parallel_saved_bytes`), beside
  Korthikanti et al.'s Table 2 (:func:`korthikanti_table2_bytes`);
* ``torch`` -- the same blocks under DTensor's ``parallelize_module``, to run side by side.

P10 measured (tensor against model parallelism on a wide MLP) is an experiment:
:mod:`coursekit.experiments.tensor_versus_model`. Every name below is importable from here (``from coursekit.parallel.tensor import ColumnParallelLinear``).
"""

from .core import (ColumnParallelLinear, ParallelMLP, ParallelSelfAttention, RowParallelLinear, ShardedLinear,
                   VocabParallelEmbedding, copy_to_parallel_region, gather_from_parallel_region, parallel_lm_logits,
                   reduce_from_parallel_region, shard_bounds, shard_sizes, split_to_parallel_region,
                   vocab_parallel_cross_entropy)
from .plan import BLOCK_PLAN, TRANSFORMER_PLAN, VocabParallelHead
from .strategy import (DataTensorParallel, ParallelBlock, TensorParallel, TensorParallelTransformer,
                       count_communication, dense_name, expected_counts, gather_dense, parallelize_block,
                       parallelize_transformer, shard_dim)
from .activations import korthikanti_table2_bytes, tensor_parallel_saved_bytes
from .torch import (TorchMLP, TorchSelfAttention, comm_counts, dense_qkv, qkv_rank_order, torch_parallel_attention,
                    torch_parallel_mlp, torch_parallelize_transformer)

__all__ = ["shard_sizes", "shard_bounds",
           "copy_to_parallel_region", "reduce_from_parallel_region", "gather_from_parallel_region",
           "split_to_parallel_region", "ShardedLinear", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "ParallelSelfAttention",
           "VocabParallelEmbedding", "parallel_lm_logits", "vocab_parallel_cross_entropy",
           "BLOCK_PLAN", "TRANSFORMER_PLAN", "VocabParallelHead", "parallelize_block",
           "ParallelBlock", "TensorParallelTransformer", "parallelize_transformer", "gather_dense", "dense_name", "shard_dim",
           "count_communication", "expected_counts",
           "TensorParallel", "DataTensorParallel", "tensor_parallel_saved_bytes", "korthikanti_table2_bytes",
           "TorchMLP", "TorchSelfAttention", "torch_parallel_mlp", "torch_parallel_attention", "qkv_rank_order",
           "dense_qkv", "torch_parallelize_transformer", "comm_counts"]
