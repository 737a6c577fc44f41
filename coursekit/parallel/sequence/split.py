"""Sequence parallelism: the sequence dim of the course transformer split over ranks, the whole model on each (P9).

Attention's score matrix is S×S: its memory and time grow quadratically with
the sequence length S. Sequence (context) parallelism gives each of G ranks
S/G of the tokens; every rank keeps a full copy of the model, as in data
parallelism, and everything but attention is token by token, so it runs on
the local tokens unchanged. Attention is the one place where tokens meet:

* **chunk-local** (:func:`chunked_attention`): each rank attends only within its own chunk. No
  communication, and *not* the same model: a token near the start of a chunk loses its context —
  what P9 means by "splitting a sequence may reduce accuracy" (:mod:`.accuracy` measures it).
* **ring attention** (:mod:`coursekit.parallel.sequence.core`; Liu et al. 2023): key/value blocks
  travel around the ring, merged by the online softmax. Exact.
* **all-to-all, DeepSpeed Ulysses** (:func:`ulysses_attention`; Jacobs et al. 2023): re-shard q, k, v
  from sequence-split to head-split, run ordinary attention on whole sequences of H/G heads, and
  re-shard the output back. Exact; needs the heads divisible by G.

Megatron-LM's sequence parallelism, which splits the *LayerNorm/dropout* regions of tensor parallelism
along the sequence (Korthikanti et al. 2022), is in :mod:`coursekit.parallel.sequence.tensor`; the
all-to-all and the gather along the sequence in :mod:`coursekit.parallel.sequence.comm`.

Per attention layer, elements sent over all ranks (``n = b·S·d_model``):

=============  ===================  =====================  ============================
method         forward              backward               per rank as S and G grow together
=============  ===================  =====================  ============================
ring           2(G−1)·n             (4G−2)·n               grows with G
all-to-all     4(G−1)/G·n           4(G−1)/G·n             constant
=============  ===================  =====================  ============================

Strategies for :func:`coursekit.train.train` (every rank takes the *whole* batch and its part of each
sequence, and the loss on its own tokens, no logits gathered; gradients are summed over the ranks, each
having seen its own tokens): ``"ring_attention"``
(option ``layout="zigzag"`` or ``"contiguous"``), ``"ulysses"``, and ``"chunk_local"`` (the naive one).
Combined: ``"sequence_data"`` (ring attention along a mesh's ``sp`` axis, the batch split along ``dp``:
:mod:`coursekit.parallel.sequence.data`) and ``"sequence_tensor"`` (Megatron-style, beside tensor parallelism).

    >>> def run(rank, world_size):
    ...     return train(rank, world_size, "ring_attention", model="transformer", steps=3)["losses"]
    >>> coursekit.launch(run, 2)                                    # doctest: +SKIP
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import collectives as _collectives
from ... import comm
from ...comm.mesh import rank_size
from ..data import all_reduce_flat
from ...strategy import Setup, Strategy, register
from ..plan import with_core, with_parts
from .core import ring_attention
from .layout import chunk_bounds, positions, shard_sequence
from .work import AttentionWork
from .comm import all_to_all, gather_sequence
from .exchange import agree_lengths, exchange

__all__ = ["all_to_all", "gather_sequence", "ulysses_attention", "ulysses_traffic", "chunked_attention",
           "sequence_forward", "SavedBytes", "saved_bytes", "SequenceParallel"]


# --------------------------------------------------------------------------
# Ulysses.
# --------------------------------------------------------------------------
def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                      seq_len: int | None = None, group=None) -> torch.Tensor:
    """DeepSpeed Ulysses: ``(b, H, S/G, d_head)`` sequence-split in, the same out, exact attention between.

    One all-to-all re-shards q, k, v (stacked) to ``(b, H/G, S, d_head)``: whole sequences of this
    rank's heads; attention is the ordinary one; a second all-to-all re-shards the output back.
    Chunks are contiguous (``shard_sequence(x, dim, rank, size)``), uneven ones too; without ``seq_len`` the
    ranks first tell each other their lengths (one counted exchange, as :func:`ring_attention` does).
    """
    rank, size = rank_size(group)
    heads = q.shape[1]
    if heads % size:
        raise ValueError(f"Ulysses gives each rank whole heads: {heads} heads cannot be split over {size} ranks "
                         f"(heads must be divisible by the sequence-parallel degree); use ring attention or "
                         f"a degree that divides {heads}.")
    held = agree_lengths(q.shape[2], group) if seq_len is None else None  # a guess is wrong when uneven
    seq_len = sum(held) if held is not None else seq_len
    lengths = [b - a for (a, b), in chunk_bounds(seq_len, size)]
    if held is not None and held != lengths:  # the same lists on every rank: all raise, none waits
        raise ValueError(f"the ranks hold {held} tokens, but {seq_len} tokens over {size} ranks give them "
                         f"{lengths}: shard with shard_sequence(x, dim, rank, size).")
    if lengths[rank] != q.shape[2]:
        raise ValueError(f"rank {rank} holds {q.shape[2]} tokens, but {seq_len} tokens over {size} ranks give it "
                         f"{lengths[rank]}; pass seq_len= the whole length.")
    per_rank = [heads // size] * size
    qkv = all_to_all(torch.stack([q, k, v]), 2, 3, per_rank, lengths, group, "ulysses qkv")
    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)
    return all_to_all(out, 2, 1, lengths, per_rank, group, "ulysses out")


def ulysses_traffic(batch: int, seq_len: int, d_model: int, size: int) -> dict[str, int]:
    """Elements sent over all ranks per Ulysses attention call: each all-to-all keeps 1/G and sends the rest."""
    each = (size - 1) * batch * seq_len * d_model // size  # exact: the heads divide by G
    return {"forward": 4 * each, "backward": 4 * each}


def chunked_attention(n_chunks: int, seq_len: int | None = None) -> Callable:
    """Attention within each of ``n_chunks`` contiguous chunks only: what a rank computes without communicating.

    In one process it is the block-diagonal causal mask; ``chunked_attention(1)`` is full attention.
    """
    def attend(q, k, v):
        length = q.shape[-2] if seq_len is None else seq_len
        bounds = [b for (b,) in chunk_bounds(length, n_chunks)]
        return torch.cat([F.scaled_dot_product_attention(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :],
                                                         is_causal=True) for a, b in bounds], dim=-2)
    return attend


# --------------------------------------------------------------------------
# The course transformer on this rank's tokens.
# --------------------------------------------------------------------------
def sequence_forward(model: nn.Module, idx: torch.Tensor, where: torch.Tensor,
                     attention: Callable | None = None) -> torch.Tensor:
    """``model`` (the course ``tiny_transformer``) on the tokens ``idx`` at global positions ``where``.

    Everything is token by token except ``attention(q, k, v)`` on ``(b, H, L, d_head)`` tensors
    (default: causal attention over these tokens alone), put in each block's ``attn.core`` slot of a copy of
    ``model`` that shares its parameters: gradients land on them, named as in the dense model, and the
    forward is ``model``'s own.
    """
    attention = attention or chunked_attention(1)
    blocks = nn.ModuleList(with_core(block, attention) for block in model.blocks)
    return with_parts(model, blocks=blocks)(idx, positions=where)


class SavedBytes:
    """Bytes of activations autograd saved for backward inside :func:`saved_bytes` (each storage once)."""

    def __init__(self, exclude=()):
        self.bytes, self._seen = 0, {t.untyped_storage().data_ptr() for t in exclude}


@contextmanager
def saved_bytes(exclude=()) -> Iterator[SavedBytes]:
    """Measure what a forward pass keeps for backward: ``with saved_bytes(model.parameters()) as s: loss = ...``.

    Parameters saved by their layers are excluded (they are held anyway); every other saved
    storage counts once — the activations, which is what sequence parallelism divides by G.
    """
    meter = SavedBytes(exclude)

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in meter._seen:
            meter._seen.add(storage.data_ptr())
            meter.bytes += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield meter


# --------------------------------------------------------------------------
# Strategies for coursekit.train.train.
# --------------------------------------------------------------------------
class SequenceParallel(Strategy):
    """Every rank takes the whole batch and its part of every sequence; gradients summed over the ``sp`` axis.

    Trained as in production (Megatron-LM's context parallelism, torch's ``context_parallel``): ``forward``
    returns this rank's logits only, ``(b, S/G, V)``, and :meth:`loss` takes the targets of the same tokens
    (:func:`shard_sequence`, the strategy's layout) — no rank ever holds the whole sequence's logits, so
    "each rank holds 1/G of the activations" holds for the loss too. Each rank's loss is its tokens' share
    of the micro-batch's mean (their summed cross-entropy over *all* ``b·S`` tokens): summed over the ranks
    it is the mean, so the gradients are summed by one all-reduce (option ``collectives``, default the ring).
    The reported loss (:meth:`global_loss`) reduces two numbers per rank: its summed loss and its token count.
    """

    options = {"collectives": "ring"}
    axes = ("sp",)  # the ranks that split each sequence
    layout = "contiguous"

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.all_reduce = _collectives.get_collectives(self.option("collectives")).all_reduce
        self.work = AttentionWork()
        self.sp_group = self.group  # the ranks that split each sequence (a subclass may set a mesh axis's)
        self.loss_group = self.sp_group  # the ranks that hold a part of the batch (sequence_data: all of dp × sp)
        self.seq_len = 0            # the whole length of the last micro-batch (for the record's gather)
        self._summed, self._tokens = [], 0  # this step's summed cross-entropy, per micro-batch, and its tokens

    @property
    def data_rank(self) -> int:
        return 0

    @property
    def data_size(self) -> int:
        return 1

    def attention(self, seq_len: int) -> Callable:
        """The attention this strategy runs on a rank's tokens; each subclass says how (ring, all-to-all, chunk)."""
        raise NotImplementedError(f"{type(self).__name__} is abstract: use 'ring_attention', 'ulysses' or "
                                  f"'chunk_local', or define attention(seq_len) in your subclass.")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """This rank's logits, ``(b, S_r, V)`` for its ``S_r`` tokens (its chunks in the strategy's layout)."""
        rank, size = rank_size(self.sp_group)
        self.seq_len = inputs.shape[1]
        local = shard_sequence(inputs, 1, rank, size, self.layout)
        return sequence_forward(self.model, local, positions(self.seq_len, rank, size, self.layout),
                                self.attention(self.seq_len))

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """This rank's share of the micro-batch's mean loss: its tokens' summed cross-entropy / ``b·S``.

        ``targets`` are the whole micro-batch's, ``(b, S)``; this rank's are cut as its inputs were. The
        divisor is every token of the micro-batch (known here: each rank sees the whole batch's shape), so the
        shares add up to the mean over the ranks with no communication before backward.
        """
        rank, size = rank_size(self.sp_group)
        mine = shard_sequence(targets, 1, rank, size, self.layout)
        if mine.shape != output.shape[:-1]:
            raise ValueError(f"rank {rank} has logits for {tuple(output.shape[:-1])} tokens but its targets are "
                             f"{tuple(mine.shape)}: pass the whole micro-batch's targets, (b, S).")
        summed = F.cross_entropy(output.reshape(-1, output.shape[-1]), mine.reshape(-1), reduction="sum")
        self._summed.append(summed.detach())
        self._tokens += mine.numel()
        return summed / targets.numel()

    def global_loss(self, local_loss: float) -> float:
        """Σ summed loss / Σ tokens over the ranks that hold the batch: two numbers per rank, exchanged.

        ``local_loss`` (this rank's share) is not used: the exact sums are. The exchange goes through
        ``coursekit.comm`` as control traffic (bookkeeping, not payload: the step's formula is unchanged), so
        it also runs in the simulator; every rank adds the same numbers in rank order, so all agree exactly.
        """
        summed = torch.stack(self._summed).sum().double() if self._summed else torch.zeros((), dtype=torch.float64)
        pair = torch.stack([summed, torch.tensor(float(self._tokens), dtype=torch.float64, device=summed.device)])
        self._summed, self._tokens = [], 0
        size = rank_size(self.loss_group)[1]
        with comm.control():
            parts = exchange([pair] * size, [[2]] * size, self.loss_group, "loss and token count")
        total = torch.stack(parts).sum(dim=0)
        return (total[0] / total[1]).item()

    def recorded_output(self, outputs: list[torch.Tensor]) -> torch.Tensor | None:
        """The whole logits, for the record only: gathered after the step, not counted, not trained on."""
        with torch.no_grad(), comm.using(recorders=()):
            return torch.cat([gather_sequence(out, 1, self.seq_len, self.layout, self.sp_group) for out in outputs])

    def synchronize(self) -> None:
        with self.span("comm", "all-reduce grads over sequence ranks"):
            all_reduce_flat([p.grad for p in self.model.parameters()], self.sp_group, self.all_reduce)

    def counters(self) -> dict:
        return {"attention_score_elements": self.work.score_elements, "attention_blocks_skipped": self.work.skipped}


@register("ring_attention")
class RingAttentionStrategy(SequenceParallel):
    """Ring attention (option ``layout``: ``"zigzag"``, balanced for the causal mask, or ``"contiguous"``;
    option ``kernel``: ``"textbook"`` or ``"fused"``, how each block is computed, see :mod:`.kernels`)."""

    options = {"collectives": "ring", "layout": "zigzag", "kernel": "textbook"}

    def __init__(self, setup: Setup):
        super().__init__(setup)
        self.layout = self.option("layout")

    def attention(self, seq_len: int) -> Callable:
        def attention(q, k, v):
            self.work.count_call(q, True, self.layout, seq_len, self.sp_group)
            return ring_attention(q, k, v, True, self.layout, seq_len, self.sp_group, self.option("kernel"))
        return attention


@register("ulysses")
class UlyssesStrategy(SequenceParallel):
    """DeepSpeed Ulysses: all-to-all to heads and back around ordinary attention."""

    def attention(self, seq_len: int) -> Callable:
        return lambda q, k, v: ulysses_attention(q, k, v, True, seq_len, self.sp_group)


@register("chunk_local")
class ChunkLocalStrategy(SequenceParallel):
    """The naive split: each rank attends only within its own chunk (no communication; not exact)."""

    def attention(self, seq_len: int) -> Callable:
        return chunked_attention(1)

