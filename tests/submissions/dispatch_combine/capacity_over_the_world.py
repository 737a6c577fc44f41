"""dispatch counts the capacity on the tokens of every rank of the group: it asks each rank for its token count
(as control traffic) and uses their sum as T. The one-process MoE counts it on each rank's own batch, so every
expert takes up to ep times too many of a rank's rows. Right at ep = 1 and wherever nothing overflows."""

import math

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import Kept, exchanged, overflow_loses
from _dc_solution import combine  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 5.83  # dispatch_rows is dropless; each case where an expert overflows is wrong
_SAID = "the capacity was counted on the tokens of every rank: each rank counts it on its own T tokens"
LOSES = overflow_loses(_SAID)


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    ep = comm.get_world_size(group)
    tokens, k = chosen.shape
    with comm.control():                                    # every rank's token count
        everyone = all_to_all(torch.tensor([tokens] * ep), 0, 0, [1] * ep, [1] * ep, group)
    world = int(everyone.sum())                             # the mistake: T over the group, not this rank's
    capacity = None if capacity_factor is None else math.ceil(capacity_factor * k * world / n_experts)
    return exchanged(x, Kept(chosen, gates, n_experts, capacity_factor, capacity=capacity), group)
