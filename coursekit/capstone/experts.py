"""The capstone's mixture of experts: ``coursekit train --experts E --ep N``.

With ``experts > 0`` the trainer trains the course transformer whose blocks' MLPs are ``E`` experts
(:func:`~coursekit.parallel.expert.moe_transformer`) with chapter 07's ``"expert"`` strategy, instead of the
composed one. **ep borrows from dp**, as torchtitan's ``ParallelDims`` and the cost model's ``Layout(dp, ep)`` do:
``--dp 4 --ep 2`` is 4 ranks, every one with its own slice of the batch, in groups of 2 neighbours that split the
experts (2 of 4 each) -- the strategy's mesh is ``dp = 2 × ep = 2``. ``ep`` must divide ``dp`` and ``E``.

What this module holds: :func:`expert_problem` (what the trainer refuses, and why), :func:`moe_model` and
:func:`one_process_moe_losses`, the one-process curve every ``--ep`` must reproduce.
"""

from __future__ import annotations

import math

import torch

from ..models import LanguageData, loss_fn
from ..parallel.expert import moe_transformer, nudge_bias
from ..parallel.hybrid import Refusal, nearest
from ..train import train

__all__ = ["expert_problem", "expert_mesh", "moe_model", "one_process_moe_losses"]


def expert_problem(config) -> Refusal | None:
    """The first reason the expert settings of ``config`` (a :class:`~coursekit.capstone.run.Config`) cannot run."""
    ep, experts, k = config.ep, config.experts, config.top_k
    for name, value, least in (("ep", ep, 1), ("experts", experts, 0), ("top_k", k, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            return Refusal(f"{name} = {value!r}: use a whole number >= {least}", ({name: least},), example=False)
    for name in ("aux_weight", "bias_rate"):  # nan or inf would train to nan; below 0, towards imbalance
        value = getattr(config, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
            return Refusal(f"{name} = {value!r}: use a finite number >= 0 (0: off)", ({name: 0.0},), example=False)
    if experts == 0:
        return _dense_problem(config)
    if k > experts:
        return Refusal(f"top_k = {k} with experts = {experts}: each token picks top_k of the experts; use a top_k "
                       f"of at most {experts}", nearest("top_k", k, range(1, experts + 1)))
    if (config.pp, config.sp, config.tp) != (1, 1, 1):
        return Refusal(f"experts = {experts} with pp = {config.pp}, sp = {config.sp}, tp = {config.tp}: this trainer "
                       f"runs a mixture of experts on data and expert parallelism only (chapter 07's 'expert' "
                       f"strategy keeps whole blocks on every rank); use pp = sp = tp = 1",
                       ({"pp": 1, "sp": 1, "tp": 1},))
    if config.dp % ep:
        return Refusal(f"ep = {ep} does not divide dp = {config.dp}: expert parallelism borrows its ranks from dp "
                       f"(groups of ep data-parallel ranks split the experts); use an ep that divides dp",
                       nearest("ep", ep, _divisors(config.dp)) + ({"dp": ep * -(-config.dp // ep)},))
    if experts % ep:
        return Refusal(f"ep = {ep} does not divide experts = {experts}: each of the ep ranks holds experts / ep whole "
                       f"experts; use an ep that divides experts",
                       nearest("ep", ep, _divisors(experts)) + ({"experts": ep * -(-experts // ep)},))
    return _expert_combinations(config)


def _dense_problem(config) -> Refusal | None:
    """Expert settings given to the dense transformer (experts = 0): refused, not ignored."""
    if config.ep > 1:
        return Refusal(f"ep = {config.ep} spreads the experts of a mixture of experts, but experts = 0 trains the "
                       f"dense transformer: give experts, a multiple of ep",
                       ({"experts": 2 * config.ep, "dp": config.ep * -(-config.dp // config.ep)},))
    for name in ("aux_weight", "bias_rate"):
        if getattr(config, name):
            return Refusal(f"{name} = {getattr(config, name)!r} balances the load of experts, but experts = 0 trains "
                           f"the dense transformer: give experts, or leave {name} out",
                           ({"experts": 4}, {name: 0.0}))
    return None


def _expert_combinations(config) -> Refusal | None:
    """What the ``"expert"`` strategy does not do beside its experts, each with what works instead."""
    experts = config.experts
    if config.zero:
        return Refusal(f"zero = {config.zero} with experts = {experts}: ZeRO shards one dense model's state over dp, "
                       f"and the 'expert' strategy keeps each rank's experts and its copy of the rest whole, with "
                       f"their Adam state; use zero = 0", ({"zero": 0},), example=False)
    if config.precision != "fp32":
        return Refusal(f"precision = {config.precision!r} with experts = {experts}: the 'expert' strategy computes "
                       f"in fp32 (16-bit compute is the composed strategy's, on the dense transformer); use "
                       f"precision = 'fp32'", ({"precision": "fp32"},), example=False)
    if config.microbatches > 1:
        return Refusal(f"micro_batches = {config.microbatches} with experts = {experts}: the 'expert' strategy "
                       f"nudges its routers by the tokens of a rank's last forward, so it routes each rank's slice in "
                       f"one; use micro_batches = 1", ({"micro_batches": 1},), example=False)
    if config.checkpoint_dir:
        return Refusal(f"checkpoint_dir with experts = {experts}: the trainer's checkpoints describe the composed "
                       f"strategy's shards (tp's, pp's stages), not experts spread over ep; train without "
                       f"checkpoint_dir", ({"checkpoint_dir": None, "resume": False},), example=False)
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_mesh(config) -> dict[str, int]:
    """The ``"expert"`` strategy's mesh: ``dp / ep`` copies × ``ep`` ranks that split the experts (ep innermost:
    its all-to-alls, twice per MoE layer and direction, go between neighbours)."""
    return {"dp": config.dp // config.ep, "ep": config.ep}


def moe_model(config):
    """A function building ``config``'s mixture-of-experts transformer: the same weights on every rank."""
    return lambda: moe_transformer(seed=config.seed, vocab_size=config.vocab, d_model=config.d_model,
                                   n_heads=config.heads, n_layers=config.layers, max_seq_len=config.seq_len,
                                   experts=config.experts, top_k=config.top_k)


def one_process_moe_losses(config, data: LanguageData) -> list[float]:
    """The curve of ``config``'s mixture of experts on one process, whatever its ``ep``.

    Without balancing it is chapter 02's one-process loop (``"single"``) on the whole global batch: routing is
    per token, so splitting the batch over ranks changes nothing but rounding. The balance loss is each rank's
    own (``E · Σ f_i · P_i`` of its tokens, as GShard and Switch compute it), so with ``aux_weight`` the
    reference takes the batch in the slices the ranks take, one forward each, weighted by its share of the
    samples; with ``bias_rate`` it nudges the routers after each step by the tokens each expert got in the whole
    batch (counted here from the routers' own choices). It shares no code with the strategy but the model and
    :func:`~coursekit.parallel.expert.nudge_bias`.
    """
    if not config.aux_weight and not config.bias_rate:
        return train(0, 1, "single", model=moe_model(config), data=data, steps=config.steps,
                     global_batch=config.batch, lr=config.lr, seed=config.seed, record=False)["losses"]
    model = moe_model(config)()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    counts = [torch.zeros(config.experts, dtype=torch.long) for _ in model.moes]

    def count(i):  # a hook on router i: add up the experts its tokens chose (returns None: the output stays)
        def hook(router, inputs, output) -> None:
            counts[i].add_(torch.bincount(output[1].flatten(), minlength=config.experts))
        return hook

    for i, moe in enumerate(model.moes):
        moe.router.register_forward_hook(count(i))
    losses = []
    for step in range(config.steps):
        inputs, targets = data.batch(step, config.batch)
        total = 0.0
        for x, y in zip(inputs.tensor_split(config.dp), targets.tensor_split(config.dp)):  # the ranks' slices
            loss = (loss_fn(model(x), y) + config.aux_weight * model.aux) * (x.shape[0] / config.batch)
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        for moe, tokens in zip(model.moes, counts):
            if config.bias_rate:
                nudge_bias(moe.router, tokens, config.bias_rate)
            tokens.zero_()
        losses.append(total)
    return losses
