"""Receives posted ahead (``Channel(post_ahead=True)``, the executor's post_ahead): every receive a schedule
allows is posted before the compute in front of it, none by default, and one collected out of order is refused.

Each test names the bug planted by hand (in coursekit/parallel/pipeline/executor.py or comm.py) to see it fail.
"""

import pytest
import torch
import torch.nn.functional as F

import coursekit
from coursekit.models import TeacherData, tiny_mlp
from coursekit.parallel.pipeline import Channel, execute, make_schedule, split

M, STEPS = 4, 2


def _steps(rank, world_size, name, channel=None):
    stages = split(tiny_mlp(n_layers=4), world_size)
    x, y = TeacherData().batch(0, 8)
    micro = list(zip(x.tensor_split(M), y.tensor_split(M)))
    channel, counts = channel or Channel(post_ahead=True), []
    for _ in range(STEPS):
        before = channel.received_ahead
        execute(make_schedule(name, world_size, M), rank, {rank: stages[rank]}, micro,
                lambda out, xs, ys: F.cross_entropy(out, ys) * len(xs) / 8, channel)
        counts.append(channel.received_ahead - before)
    return counts


def _default(rank, world_size):
    return _steps(rank, world_size, "1f1b", Channel())


def test_by_default_every_receive_is_posted_when_it_is_needed():
    """Planted bug, seen failing: ``post_ahead=True`` as the default: '[[4, 4], [3, 3]]'."""
    counts = coursekit.launch(_default, 2, timeout=120)
    assert counts == [[0] * STEPS, [0] * STEPS], counts


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
def test_every_receive_but_the_first_action_is_posted_ahead(name):
    """On 2 ranks, rank 0's receives are the gradients RECV_B(i): each can be posted once F(i) has made the
    activation it has the shape of, before B's compute -- all m. Rank 1's first action is its first receive
    (nothing to post it behind); each later RECV_F is posted as the one before is collected: m - 1.

    Planted bugs, seen failing: ``post_ahead`` returning at once: '[[0, 0], [0, 0]]'; gradients never posted
    (``posted = False`` for RECV_B): '[[0, 0], [3, 3]]'."""
    counts = coursekit.launch(_steps, 2, name, timeout=120)
    assert counts == [[M] * STEPS, [M - 1] * STEPS], counts


def _out_of_order(rank, world_size):
    channel = Channel(post_ahead=True)
    if rank == 0:
        channel.isend(torch.ones(3), 1)
        return None
    channel.post(0, None, like=torch.empty(3))
    channel.recv(0, ("another key",), like=torch.empty(3))


def test_a_receive_collected_out_of_order_is_refused():
    """Planted bug, seen failing: the key check left out of ``recv`` (the buffer handed to the wrong receive):
    no error raised, the launch timed out instead."""
    with pytest.raises(coursekit.RankError, match="posted ahead from rank 0 was for key None"):
        coursekit.launch(_out_of_order, 2, timeout=60)
