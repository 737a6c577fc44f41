"""parallel: one module per parallelism strategy; importing it registers every strategy with the loop.

``data`` (replicas, gradients averaged) and ``zero`` (ZeRO stages 1–3) so far;
each defines its classes and registers its :class:`coursekit.strategy.Strategy`
subclasses for :func:`coursekit.train.train`.
"""

from . import data, zero  # noqa: F401
