"""What ``coursekit train`` refuses of its numbers, and when its loss has diverged.

* :func:`sizes_problem` -- the model's sizes, the data's, the run's numbers: each of its kind and in its range;
* :func:`log_problem` -- a ``--log-json`` that cannot be written, found before the first step;
* :func:`diverged` -- the sentence that stops a run whose loss is not finite or far above a uniform guess's
  (:func:`divergence_bound`), raised as :class:`Diverged` on every rank after the same step.

Each returns a :class:`~coursekit.parallel.hybrid.Refusal` or a sentence; :func:`coursekit.capstone.run.check`
turns a refusal into one sentence that names the setting and a change. ``config`` is a
:class:`~coursekit.capstone.run.Config`.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from ..parallel.hybrid import Refusal, nearest

__all__ = ["sizes_problem", "log_problem", "whole", "real", "divisors", "Diverged", "DIVERGED_NATS",
           "divergence_bound", "diverged", "MAX_D_MODEL", "MAX_SEED", "MAX_TIMEOUT_S"]


#: The widest model: the course transformer is small on purpose (:class:`coursekit.models.Transformer` refuses more).
MAX_D_MODEL = 128

#: The largest ``|seed|``: each step's batch comes from a generator seeded with ``seed × 1,000,003 + step``
#: (:class:`~coursekit.models.LanguageData`), which torch takes in 64 bits -- ``|seed|`` up to about 9.2e12 runs,
#: one more overflows ("Overflow when unpacking long long"); 10**12 leaves the steps their room.
MAX_SEED = 10**12

#: The longest ``timeout`` in seconds: torch counts a wait in 64-bit nanoseconds, so init_process_group fails
#: from about 2**63 ns = 9.2e9 s on (gloo's "Invalid timeout"; tried: 9.2e9 runs, 9.23e9 fails); a billion
#: seconds (31 years) is as good as forever and leaves coursekit.launch its grace.
MAX_TIMEOUT_S = 1e9


def sizes_problem(config) -> Refusal | None:
    """The model's sizes, the data's, the run's numbers: each one of its kind and in its range (the lower bounds
    are where the model, the data or torch fails: see each sentence)."""
    for name, value, least, why in (
            ("layers", config.layers, 1, "the transformer needs at least one block"),
            ("heads", config.heads, 1, "each block needs at least one attention head"),
            ("d_model", config.d_model, 1, "each head needs at least one feature"),
            ("vocab", config.vocab, 2, "the synthetic language needs at least 2 tokens to have anything to predict "
                                       "(with one, the loss is 0 from the start)"),
            ("seq_len", config.seq_len, 3, "the synthetic language draws each token from the two before it, so a "
                                           "sample needs 3 tokens at least"),
            ("global_batch", config.batch, 1, "each step needs a sequence at least"),
            ("steps", config.steps, 1, "train at least one step")):
        if not whole(value) or value < least:
            return Refusal(f"{name} = {value!r}: {why}; use a whole number >= {least}", ({name: least},),
                           example=False)
    if config.d_model > MAX_D_MODEL:
        return Refusal(f"d_model = {config.d_model}: the course transformer is small on purpose; use d_model <= "
                       f"{MAX_D_MODEL}", nearest("d_model", config.d_model, range(config.heads, MAX_D_MODEL + 1,
                                                                                    config.heads))[:1])
    if not real(config.lr) or config.lr <= 0:
        return Refusal(f"lr = {config.lr!r}: use a finite learning rate above 0", ({"lr": type(config).lr},))
    if not whole(config.seed) or abs(config.seed) > MAX_SEED:
        return Refusal(f"seed = {config.seed!r}: use a whole number from -10**12 to 10**12 (each step's data is drawn "
                       f"from seed × 1,000,003 + step, which torch takes in 64 bits)", ({"seed": type(config).seed},),
                       example=False)
    if not real(config.timeout) or not 0 < config.timeout <= MAX_TIMEOUT_S:
        return Refusal(f"timeout = {config.timeout!r}: use a number of seconds above 0 and at most 1e9 (how long a "
                       f"rank waits for another; torch counts it in 64-bit nanoseconds)",
                       ({"timeout": type(config).timeout},))
    return None


def whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def real(value) -> bool:
    """A finite number (not a bool, not nan or inf)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def log_problem(log: str | None) -> Refusal | None:
    """Why ``log`` (rank 0 writes the loss curve there after the last step) cannot be written, found before the
    first step: a folder, a path under a file, a place this process cannot create files in. An existing file is
    fine: the command line names it to be written (and it is replaced whole, only once the curve is complete)."""
    if not log:
        return None
    path = Path(log)
    if path.is_dir():
        return Refusal(f"log = {log!r} is a folder: name a file to write the loss curve to, e.g. log = "
                       f"{str(path / 'log.json')!r}", None)
    if path.exists():
        return None if os.access(path, os.W_OK) else Refusal(f"log = {log!r} cannot be written (no permission): "
                                                                 f"name a file this job can write", None)
    folder = path.parent
    while not folder.exists():  # the folders missing are made after the last step
        folder = folder.parent
    if not folder.is_dir():
        return Refusal(f"log = {log!r}: {str(folder)!r} is a file, not a folder, so nothing can be written under it; "
                       f"name a file in a folder", None)
    try:  # the one sure test of a folder (root passes os.access, /proc does not take files): a file made and removed
        handle, probe = tempfile.mkstemp(prefix=".coursekit-log-", dir=folder)
    except OSError as error:
        return Refusal(f"log = {log!r} cannot be written: no file can be made in {str(folder)!r} "
                       f"({error.strerror or error}); name a file in a folder this job can write to", None)
    os.close(handle)
    os.unlink(probe)
    return None


class Diverged(RuntimeError):
    """The loss diverged: :func:`run`'s ``on_step`` raises it on every rank after the same step."""


#: How many nats above a uniform guess's loss, ``ln(vocab)``, a loss may go before the run counts as diverged.
#: ``exp(-25)`` is 1.4e-11: the model gives the right tokens, on geometric average, eleven orders of magnitude
#: less probability than knowing nothing would. Measured on the course transformer (one process, 60 steps,
#: vocabularies 2, 4, 16 and 64, seeds 0-2): at lr 0.3 (300 times the default) the loss spikes to at most 17 nats
#: above ln(vocab) and comes back; at lr 0.5 it reaches 44-51 nats above and is still worse than a uniform guess at
#: step 60; at lr 1 and more it stays 70 nats above and more (lr 1e6: nan from step 2). The margin does not shrink
#: with the vocabulary, as ten times ln(vocab) would: with 2 tokens that is 6.9, and lr 0.1 spikes to 9.6 at step 3,
#: then learns (0.25 at step 4).
DIVERGED_NATS = 25.0


def divergence_bound(config) -> float:
    """The loss above which a run has diverged: a uniform guess's, ``ln(vocab)``, plus :data:`DIVERGED_NATS`, plus,
    with the balance loss, its most: ``aux_weight`` times ``experts / top_k`` per block (``f_i`` is at most
    ``1 / top_k`` of the assignments, and the router's probabilities add up to 1), so that a large legal aux_weight
    is not taken for a divergence."""
    bound = math.log(config.vocab) + DIVERGED_NATS
    if config.experts:
        bound += config.aux_weight * config.layers * config.experts / config.top_k
    return bound


def diverged(config, step: int, loss: float, last_step: int | None, last_loss: float | None) -> str | None:
    """The sentence that stops the run if ``loss`` (of step ``step``, from 0) is not finite or above
    :func:`divergence_bound`, else None; ``last_step``/``last_loss``: the last step that was neither."""
    bound = divergence_bound(config)
    if loss <= bound:  # False for nan
        return None
    balanced = bool(config.experts and config.aux_weight)
    what = f"{loss:.4g}" if math.isnan(loss) or math.isinf(loss) else (
        f"{loss:.4g}, above {bound:.4g} (a uniform guess's loss, ln {config.vocab} = {math.log(config.vocab):.2f}, "
        f"plus {DIVERGED_NATS:g}{', plus aux_weight times the balance loss at its most' if balanced else ''})")
    before = (f"after {last_loss:.4f} at step {last_step + 1}" if last_step is not None
              else "at this run's first step")
    smaller = f"{type(config).lr:g} (the default)" if config.lr > type(config).lr else f"{config.lr / 10:g}"
    aux = f", or a smaller aux_weight than aux_weight = {config.aux_weight:g}" if balanced else ""
    return (f"the loss diverged at step {step + 1} of {config.steps}: {what}, {before}; training stopped there on "
            f"every rank; use a smaller learning rate, e.g. lr = {smaller} instead of lr = {config.lr:g}{aux}.")
