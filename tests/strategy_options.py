"""One configuration, many strategies: each strategy gets the options it reads (``train`` refuses the others).

    train(rank, world_size, s, **config_for(s, common))    # common: train's arguments and strategies' options

The library stays strict; a test that compares strategies side by side says once what they share. An option
that no strategy reads is a typo, and stays an error.
"""

from __future__ import annotations

import inspect

import coursekit.parallel  # noqa: F401  (registers every strategy)
from coursekit.strategy import STRATEGIES, get_strategy
from coursekit.train import train

TRAIN_ARGUMENTS = set(inspect.signature(train).parameters) - {"options"}


def config_for(strategy: str, config: dict) -> dict:
    """``config`` without the options that ``strategy`` does not read."""
    unread = sorted(k for k in config if k not in TRAIN_ARGUMENTS
                    and not any(k in cls.options for cls in STRATEGIES.values()))
    if unread:
        raise KeyError(f"no strategy reads {unread}: a typo?")
    reads = get_strategy(strategy).options
    return {k: v for k, v in config.items() if k in TRAIN_ARGUMENTS or k in reads}
