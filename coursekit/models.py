"""The course models and their data: small, deterministic, and quick on a CPU.

Every strategy chapter trains the same two models, so that "the parallel run
equals the single-process run" always means the same thing:

* :func:`tiny_mlp` -- a few ``Linear + GELU`` layers, for the simplest cases.
* :func:`tiny_transformer` -- a decoder-only transformer (nanoGPT-shaped:
  token + position embeddings, pre-norm blocks of causal self-attention and an
  MLP, a final norm and an output head tied to the token embedding).

Both are initialised from a ``seed`` with their own ``torch.Generator``, so
building a model never touches (or depends on) the global random state: every
rank that calls ``tiny_transformer(seed=0)`` gets bit-identical weights.

The data is generated, never downloaded:

* :class:`LanguageData` -- a tiny synthetic language in which every token is
  one of two successors of the two tokens before it. A model that reads its
  context (attention) drives the loss from ``ln(vocab)`` = 2.77 to about 1.1
  nats in 150 steps, a few seconds on one CPU core (floor
  :attr:`LanguageData.loss_floor` = 0.71).
* :class:`TeacherData` -- inputs ``x ~ N(0, 1)`` labelled by a fixed random
  "teacher" network, a classification task for the MLP.

Batches are a pure function of ``(seed, step, batch_size)``: ``data.batch(7, 32)``
is the same tensor on every rank and in every run, which is what lets a
data-parallel rank take *its slice* of the global batch of step 7.

    >>> model = tiny_transformer(seed=0)
    >>> data = LanguageData()
    >>> inputs, targets = data.batch(step=0, batch_size=8)
    >>> logits = model(inputs)                     # (8, 31, 16)
    >>> loss = loss_fn(logits, targets)            # about ln(16) = 2.77 before training
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MLP", "CausalAttention", "SelfAttention", "Block", "Transformer", "tiny_mlp", "tiny_transformer", "LanguageData", "TeacherData",
           "loss_fn", "count_parameters"]


def loss_fn(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position: ``(..., classes)`` logits against ``(...)`` labels."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of distinct parameter elements (a tied weight counts once): the Ψ of the ZeRO paper."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _init_(module: nn.Module, generator: torch.Generator, std: float = 0.02) -> None:
    """GPT-2 style init (normal(0, 0.02) weights, zero biases, unit norms), from ``generator`` only."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif param.dim() == 1:  # LayerNorm weight
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * std)


# --------------------------------------------------------------------------- MLP
class MLP(nn.Module):
    """``n_layers`` linear layers with GELU between them: ``d_in -> d_hidden -> ... -> d_out``."""

    def __init__(self, d_in: int = 16, d_hidden: int = 64, d_out: int = 4, n_layers: int = 3):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1 (got {n_layers}).")
        sizes = [d_in] + [d_hidden] * (n_layers - 1) + [d_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.gelu(x)
        return x


def tiny_mlp(seed: int = 0, d_in: int = 16, d_hidden: int = 64, d_out: int = 4, n_layers: int = 3) -> MLP:
    """A small MLP with weights drawn from ``seed`` (identical on every rank and every run).

        >>> tiny_mlp(seed=0)(torch.zeros(2, 16)).shape
        torch.Size([2, 4])
    """
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own init draws from the global RNG: undo that
        model = MLP(d_in, d_hidden, d_out, n_layers)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.layers:  # PyTorch's default fan-in scale, but from our generator
            bound = 1.0 / math.sqrt(layer.in_features)
            layer.weight.copy_((torch.rand(layer.weight.shape, generator=generator) * 2 - 1) * bound)
            layer.bias.copy_((torch.rand(layer.bias.shape, generator=generator) * 2 - 1) * bound)
    return model


# ------------------------------------------------------------------- Transformer
class CausalAttention(nn.Module):
    """Attention's core, ``o = softmax(QKᵀ/√d + causal mask)·V`` on ``(batch, heads, seq, head_dim)``: no weights.

    The slot ``attn.core`` of every block holds one; a plan swaps it (ring attention over a sequence split,
    the explicit core under recomputation) without touching the projections around it.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: ``proj(core(q, k, v))`` with ``q, k, v = qkv(x)``, heads of ``head_dim``.

    Its parts are slots: ``qkv`` and ``proj`` (tensor parallelism splits them by heads, and the forward reads
    as many heads as ``qkv`` returns), and ``core`` (:class:`CausalAttention`).
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads}).")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        # No bias on q, k, v: a key bias shifts every score of a row equally, which softmax
        # ignores, so its true gradient is zero and only rounding noise would train it.
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)
        self.core = CausalAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        batch, seq, _ = q.shape  # qkv's tokens: a sequence-parallel qkv gathers every rank's
        # (batch, seq, heads · head_dim) -> (batch, heads, seq, head_dim)
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = self.core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, -1))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``, the one block of the course.

    Its parts are slots a plan replaces in place (:func:`coursekit.parallel.plan.apply_plan`): ``attn`` and
    its ``qkv``, ``core`` and ``proj``; the MLP's ``fc`` and ``out`` (``out(gelu(fc(h)))``), or the whole MLP
    through ``mlp`` (None: this block's ``fc`` and ``out``). ``fc`` and ``out`` sit on the block itself, so
    the parameter names (``blocks.0.fc.weight``) are those of every checkpoint the course wrote.
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        self.mlp: nn.Module | None = None

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        """The MLP slot: ``out(gelu(fc(h)))``, or the module a plan put in ``mlp``."""
        return self.out(F.gelu(self.fc(h))) if self.mlp is None else self.mlp(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.feed_forward(self.ln2(x))


class Transformer(nn.Module):
    """A decoder-only language model: ``(batch, seq)`` token ids -> ``(batch, seq, vocab)`` logits.

    With ``tie_weights=True`` (the default, as in GPT-2) the output head *is* the
    token embedding matrix: one parameter used twice, whose gradient is the sum
    of both uses -- an edge case every parallel strategy must get right.

    Its ends are slots too: ``tok_emb`` and ``pos_emb`` (summed), ``ln_f`` and ``head`` (tensor parallelism
    puts the vocabulary-parallel embedding and its tied column-parallel head there).
    """

    def __init__(self, vocab_size: int = 16, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                 max_seq_len: int = 64, tie_weights: bool = True):
        super().__init__()
        if d_model > 128:
            raise ValueError(f"the course transformer is small on purpose: d_model <= 128 (got {d_model}).")
        self.max_seq_len = max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions``: where the tokens ``idx`` sit in their sequences (default ``0 .. seq-1``; a rank of
        sequence parallelism holds some of them)."""
        seq = idx.shape[1]
        if seq > self.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len={self.max_seq_len}; "
                             f"build the model with a larger max_seq_len.")
        where = torch.arange(seq, device=idx.device) if positions is None else positions.to(idx.device)
        x = self.tok_emb(idx) + self.pos_emb(where)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def tiny_transformer(seed: int = 0, vocab_size: int = 16, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                     max_seq_len: int = 64, tie_weights: bool = True) -> Transformer:
    """A small decoder-only transformer with weights drawn from ``seed``.

    The default has 104,832 parameters (vocabulary 16, d_model 64, 4 heads, 2 layers, tied head).

        >>> tiny_transformer(seed=0)(torch.zeros(2, 10, dtype=torch.long)).shape
        torch.Size([2, 10, 16])
    """
    with torch.random.fork_rng(devices=[]):  # leave the global RNG as it was (we overwrite every weight)
        model = Transformer(vocab_size, d_model, n_heads, n_layers, max_seq_len, tie_weights)
    _init_(model, torch.Generator().manual_seed(seed))
    return model


# -------------------------------------------------------------------------- data
class LanguageData:
    """A tiny synthetic language: each token is one of two successors of the *two* tokens before it.

    A fixed random table (drawn from ``seed``) gives, for every pair of tokens
    ``(a, b)``, two allowed next tokens; each sequence starts with two random
    tokens and then picks one of the two successors at random at every step.
    Predicting well needs the token two positions back, so the model must learn
    to use attention, not just a bigram table. A fresh tiny transformer goes
    from ``ln(vocab)`` (2.77 nats) to about 1.1 nats in 150 steps (Adam, lr
    5e-3, 32 sequences a step; a few seconds on one CPU core), towards the
    floor :attr:`loss_floor` (0.71).

    ``batch(step, batch_size)`` returns ``(inputs, targets)`` of shape
    ``(batch_size, seq_len - 1)``, targets shifted by one as in language
    modelling. The same ``(seed, step, batch_size)`` always gives the same batch.

        >>> data = LanguageData(seq_len=16)
        >>> x, y = data.batch(step=0, batch_size=2)
        >>> bool((x[:, 1:] == y[:, :-1]).all())
        True
    """

    def __init__(self, vocab_size: int = 16, seq_len: int = 32, seed: int = 0):
        if seq_len < 3:
            raise ValueError(f"seq_len must be at least 3 (got {seq_len}).")
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        generator = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(vocab_size, (vocab_size, vocab_size, 2), generator=generator)

    @property
    def loss_floor(self) -> float:
        """The best possible mean loss: ln V for the first target, then the successors' entropy.

        Exact up to the assumption that every pair of previous tokens is equally
        likely (true to within a few percent here).
        """
        same = (self.successors[..., 0] == self.successors[..., 1]).double().mean().item()
        successor_entropy = (1 - same) * math.log(2)
        n = self.seq_len - 1
        return (math.log(self.vocab_size) + (n - 1) * successor_entropy) / n

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        tokens = torch.randint(self.vocab_size, (batch_size, self.seq_len), generator=generator)
        choice = torch.randint(2, (batch_size, self.seq_len), generator=generator)
        for i in range(2, self.seq_len):
            tokens[:, i] = self.successors[tokens[:, i - 2], tokens[:, i - 1], choice[:, i]]
        return tokens[:, :-1], tokens[:, 1:]


class TeacherData:
    """Classification by a fixed random teacher: ``x ~ N(0, 1)``, label = argmax of ``teacher(x)``.

        >>> x, y = TeacherData().batch(step=0, batch_size=4)
        >>> x.shape, y.shape
        (torch.Size([4, 16]), torch.Size([4]))
    """

    def __init__(self, d_in: int = 16, n_classes: int = 4, seed: int = 0):
        self.d_in, self.n_classes, self.seed = d_in, n_classes, seed
        self.teacher = tiny_mlp(seed=seed + 12345, d_in=d_in, d_hidden=32, d_out=n_classes, n_layers=2)

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        x = torch.randn(batch_size, self.d_in, generator=generator)
        with torch.no_grad():
            y = self.teacher(x).argmax(dim=-1)
        return x, y
