"""What chunk-local attention costs (P9: "splitting a sequence into sub-sequences may reduce accuracy").

Chunk-local attention (:func:`~coursekit.parallel.sequence.chunked_attention`) lets each rank attend only
inside its own chunk. Whether that costs accuracy depends on the task: on the course's
:class:`~coursekit.models.LanguageData` each token needs only the two before it, so only the first two
positions of each chunk lose anything (:func:`chunk_local_losses`: a small effect, easily hidden by how far
training still is from the floor). :class:`CopyData` is built so the effect cannot hide: the second half of
every sequence repeats the first, so a prediction there needs a token half a sequence back -- in another
chunk as soon as there are two. Full attention (and ring attention, and Ulysses: the same function) learns
to copy, to almost zero loss; chunk-local attention cannot see the source, and no model can beat ``ln V`` on
a uniformly random token it cannot see.

* :class:`CopyData` -- the task; :meth:`CopyData.sources` says where each target's copy comes from.
* :func:`needs_other_chunk` -- the positions whose source lies in another chunk, for ``n`` chunks.
* :func:`train_one_process` -- the course transformer trained with attention cut into ``n`` chunks.
* :func:`per_position_loss` -- the loss at every position on fresh sequences, where the boundary shows.
* :func:`copy_task_losses` -- all of it, per chunk count and seed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..parallel.sequence.layout import chunk_bounds
from ..parallel.sequence.split import chunked_attention, sequence_forward

__all__ = ["CopyData", "needs_other_chunk", "train_one_process", "per_position_loss", "copy_task_losses",
           "chunk_local_losses", "EVAL_STEP"]

EVAL_STEP = 10**6  # fresh sequences for evaluation: a step number no training run reaches


class CopyData:
    """Sequences whose second half repeats the first: ``r_0 … r_{n-1} r_0 … r_{n-1}``, ``r_i`` uniform in V.

    ``batch(step, batch_size)`` returns ``(inputs, targets)`` of shape ``(batch_size, seq_len - 1)``,
    targets shifted by one, as :class:`~coursekit.models.LanguageData` does (``n = ⌈seq_len / 2⌉``; an odd
    ``seq_len`` repeats the first ``n - 1`` tokens). The first ``n - 1`` targets are random (the best
    possible loss is ``ln V``); every later one is a copy of the input token at :meth:`sources`, which a
    model that can look back far enough predicts exactly (loss 0).

        >>> x, y = CopyData(seq_len=8).batch(step=0, batch_size=1)
        >>> bool((y[0, 3:] == x[0, :4]).all())
        True
    """

    def __init__(self, vocab_size: int = 16, seq_len: int = 32, seed: int = 0):
        if seq_len < 4:
            raise ValueError(f"seq_len must be at least 4, so that something is copied (got {seq_len}).")
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.half = (seq_len + 1) // 2  # the tokens drawn; the rest repeat them

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        first = torch.randint(self.vocab_size, (batch_size, self.half), generator=generator)
        tokens = torch.cat([first, first[:, :self.seq_len - self.half]], dim=1)
        return tokens[:, :-1], tokens[:, 1:]

    def sources(self) -> torch.Tensor:
        """For each input position p, the input position whose token is p's target; -1 where it is random."""
        p = torch.arange(self.seq_len - 1)
        return torch.where(p + 1 >= self.half, p + 1 - self.half, -1)

    @property
    def chance(self) -> float:
        """``ln V``: the loss of a uniform guess, the best possible on a target one cannot see."""
        return math.log(self.vocab_size)


def needs_other_chunk(data: CopyData, n_chunks: int) -> torch.Tensor:
    """Boolean per input position: its target is a copy whose source lies in another of ``n_chunks`` chunks.

    Chunks as over ``n_chunks`` ranks (:func:`chunk_bounds`, contiguous; uneven lengths too).
    """
    length = data.seq_len - 1
    chunk_of = torch.empty(length, dtype=torch.long)
    for i, ((a, b),) in enumerate(chunk_bounds(length, n_chunks)):
        chunk_of[a:b] = i
    sources = data.sources()
    copied = sources >= 0
    return copied & (chunk_of[sources.clamp(min=0)] != chunk_of)


def train_one_process(data, n_chunks: int, steps: int = 150, batch: int = 32, lr: float = 5e-3, seed: int = 0,
                      max_seq_len: int = 64):
    """The course transformer trained with Adam on ``data``, attention cut into ``n_chunks`` chunks (1: full).

    Returns ``(model, losses)``: the model, and the training loss of every step.
    """
    from ..models import loss_fn, tiny_transformer

    model = tiny_transformer(seed=seed, vocab_size=data.vocab_size, max_seq_len=max_seq_len)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    attention, losses = chunked_attention(n_chunks), []
    for step in range(steps):
        x, y = data.batch(step, batch)
        loss = loss_fn(sequence_forward(model, x, torch.arange(x.shape[1]), attention), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def per_position_loss(model, data, n_chunks: int, batch: int = 256) -> torch.Tensor:
    """Mean cross-entropy at each input position, on ``batch`` sequences no training step has seen."""
    x, y = data.batch(EVAL_STEP, batch)
    with torch.no_grad():
        logits = sequence_forward(model, x, torch.arange(x.shape[1]), chunked_attention(n_chunks))
    return F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(0)


def copy_task_losses(chunks=(1, 2, 4), seeds=(0, 1, 2), steps: int = 150, seq_len: int = 32,
                     progress=None) -> dict[int, torch.Tensor]:
    """Per-position loss after training on :class:`CopyData`: ``{n_chunks: tensor (len(seeds), seq_len - 1)}``.

    Seed ``s`` draws both the weights and the data. ``progress``: a callable run after each model (a bar's update).
    """
    out = {}
    for n in chunks:
        rows = []
        for seed in seeds:
            data = CopyData(seq_len=seq_len, seed=seed)
            model, _ = train_one_process(data, n, steps=steps, seed=seed, max_seq_len=max(64, seq_len))
            rows.append(per_position_loss(model, data, n))
            if progress is not None:
                progress()
        out[n] = torch.stack(rows)
    return out


def chunk_local_losses(chunks=(1, 2, 4, 8), steps: int = 150, batch: int = 32, lr: float = 5e-3,
                       seq_len: int = 32, seed: int = 0) -> dict[int, float]:
    """Final training loss (mean of the last 10 steps) on :class:`~coursekit.models.LanguageData`, per chunk count.

    One process, the same model, data and optimiser for each; ``chunks=1`` is full attention.
    Each sequence is cut into chunks exactly as over that many ranks: the block-diagonal mask.
    """
    from ..models import LanguageData

    data, out = LanguageData(seq_len=seq_len, seed=seed), {}
    for n in chunks:
        _, losses = train_one_process(data, n, steps=steps, batch=batch, lr=lr, seed=seed)
        out[n] = sum(losses[-10:]) / len(losses[-10:])
    return out
