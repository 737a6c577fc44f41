"""Sequence parallelism (chapter 06): the sequence dim split over ranks, the whole model on each.

One module per concept:

* ``layout`` -- who holds which tokens, contiguous or zig-zag (:func:`chunk_bounds`, :func:`shard_sequence`);
* ``core`` -- ring attention (online softmax, zig-zag layout, blockwise backward): :func:`ring_attention`;
* ``work`` -- the attention each rank computes in it, counted from outside (:func:`attention_work`);
* ``kernels`` -- one block of ring attention, the textbook score matrix or torch's fused CPU flash kernel;
* ``exchange`` -- one tensor to every other rank (what the collectives below are made of), and
  :func:`agree_lengths`: every rank's token count, when ``seq_len=`` was not given;
* ``comm`` -- the collectives of the split from ``coursekit.comm`` point-to-point calls: Ulysses'
  :func:`all_to_all`, :func:`gather_sequence`;
* ``split`` -- chunk-local attention, DeepSpeed Ulysses, and the strategies ``"ring_attention"``,
  ``"ulysses"`` and ``"chunk_local"``;
* ``tensor`` -- Megatron-style sequence parallelism beside tensor parallelism (``"sequence_tensor"``);
* ``data`` -- ring attention along a mesh's ``sp`` axis, the batch split along ``dp`` (``"sequence_data"``);

The chapter's measured experiments (the ring's overlap, chunk-local attention's accuracy, the longest sequence
each method fits) are in :mod:`coursekit.experiments`.

PyTorch's counterpart (``torch.distributed.tensor.experimental.context_parallel``) is run side by side in
chapter 06 itself. Every name below is importable from here (``from coursekit.parallel.sequence import
ring_attention``).
"""

# In this order: the strategies register with the training loop in the order chapter 06 meets them.
from .layout import LAYOUTS, chunk_bounds, positions, shard_sequence, split_bounds
from .core import (Ring, RingAttention, block_attention, block_mask, chunk_pairs, chunk_pieces, full_attention, merge,
                   ring_attention, ring_traffic)
from .work import AttentionWork, attention_work
from .kernels import KERNELS, block_gradients, fused_block
from .exchange import agree_lengths, exchange
from .comm import all_to_all, gather_sequence
from .split import (ChunkLocalStrategy, RingAttentionStrategy, SavedBytes, SequenceParallel, UlyssesStrategy,
                    chunked_attention, saved_bytes, sequence_forward, ulysses_attention,
                    ulysses_traffic)
from .tensor import (SequenceLength, SequenceTensorParallel, SequenceTensorParallelBlock,
                     SequenceTensorParallelTransformer, all_gather_sequence, gather_linear, megatron_sp_saved_bytes,
                     megatron_sp_traffic, reduce_scatter_sequence, sequence_tensor_block, sequence_tensor_plan,
                     sequence_tensor_transformer)
from .data import SequenceDataParallel, sequence_data_traffic, traffic_per_axis

__all__ = ["LAYOUTS", "chunk_bounds", "positions", "shard_sequence", "split_bounds", "merge",
           "block_attention", "block_mask", "Ring", "chunk_pieces", "chunk_pairs", "AttentionWork", "attention_work",
           "RingAttention", "ring_attention", "ring_traffic", "full_attention",
           "KERNELS", "fused_block", "block_gradients", "exchange", "agree_lengths", "all_to_all", "gather_sequence",
           "ulysses_attention", "ulysses_traffic", "chunked_attention", "sequence_forward", "SavedBytes",
           "saved_bytes", "SequenceParallel", "RingAttentionStrategy", "UlyssesStrategy",
           "ChunkLocalStrategy",
           "all_gather_sequence", "reduce_scatter_sequence", "gather_linear", "SequenceLength", "sequence_tensor_plan",
           "sequence_tensor_block", "SequenceTensorParallelBlock", "sequence_tensor_transformer",
           "SequenceTensorParallelTransformer", "SequenceTensorParallel", "megatron_sp_traffic",
           "megatron_sp_saved_bytes",
           "SequenceDataParallel", "traffic_per_axis", "sequence_data_traffic"]
