"""A pipeline's point-to-point traffic, counted from its action list, against a hand formula and a real run.

Planted bugs (in coursekit/parallel/pipeline/traffic.py), each seen failing, named in the test's docstring.
"""

from __future__ import annotations

import pytest

import coursekit
from coursekit.models import TeacherData, count_parameters, tiny_mlp
from coursekit.parallel.pipeline import (all_reduce_bytes, make_schedule, pipeline_traffic, pipeline_traffic_formula,
                                         one_f_one_b)
from coursekit.train import train

CASES = [("gpipe", 2, 4, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3),
         ("zb_h1", 3, 5, 1), ("1f1b", 1, 3, 1)]


@pytest.mark.parametrize("name, p, m, v", CASES, ids=lambda c: str(c))
def test_counted_traffic_is_two_messages_per_boundary_per_micro_batch(name, p, m, v):
    """By hand: p·v stages have p·v − 1 boundaries, each crossed by a micro-batch's activations forward and their
    gradient back: 2·(p·v − 1)·m messages of E elements × 4 bytes a step (none on one rank). Planted bugs seen
    failing: only the forward sends counted (SEND_F): 1f1b p = 4, m = 8 '24 != 48 messages'; interleaving's
    extra boundaries not counted (the sends of a rank's first chunk only): interleaved p = 4, v = 2 '56 != 112'."""
    elements = 7 * 64  # a micro-batch of 7 rows, 64 wide
    traffic = pipeline_traffic(make_schedule(name, p, m, v), elements)
    boundaries = p * v - 1 if p > 1 else 0
    assert traffic.messages == 2 * boundaries * m, f"{traffic.messages} != {2 * boundaries * m} messages"
    assert traffic.boundaries == boundaries
    assert traffic.bytes_per_step == 2 * boundaries * m * elements * 4
    assert traffic.bytes_per_step == pipeline_traffic_formula(p, m, elements, v)
    assert traffic.bytes_per_micro_batch == 2 * boundaries * elements * 4


def test_a_fixed_global_batch_costs_the_same_bytes_whatever_m():
    """b = 32 rows of width 64 on 4 ranks: m = 1, 2, 4, 8 micro-batches of 32/m rows move 2·3·32·64·4 bytes a
    step each time (more, smaller messages). Planted bug seen failing: bytes per message taken as the global
    batch's (E·m): '[49152, 98304, 196608, 393216]'."""
    steps = [pipeline_traffic(one_f_one_b(4, m), 32 // m * 64).bytes_per_step for m in (1, 2, 4, 8)]
    assert steps == [2 * 3 * 32 * 64 * 4] * 4, steps


def test_interleaved_sends_between_the_last_and_the_first_rank():
    """Interleaved p = 2, v = 2: stages 0, 1, 2, 3 on ranks 0, 1, 0, 1 -- the boundary 1 → 2 goes from rank 1
    back to rank 0, so both links carry 3 boundaries' worth: 3·m messages each way (m = 4: 12 and 12)."""
    traffic = pipeline_traffic(make_schedule("interleaved", 2, 4, 2), 10)
    assert traffic.links == {(0, 1): 12, (1, 0): 12}


def test_all_reduce_volume_beside_it():
    """Chapter 02's ring: 2(G − 1)Ψ elements; Ψ = 1,000 on 2 ranks: 2,000 elements = 8,000 bytes."""
    assert all_reduce_bytes(1000, 2) == 8000


def _counted(rank, world_size, runs):
    model = lambda: tiny_mlp(n_layers=4, seed=0)  # noqa: E731  every boundary is 64 wide
    out = []
    for name, v, m in runs:
        result = train(rank, world_size, "pipeline", model=model, data=TeacherData(), steps=2, global_batch=16,
                       schedule=name, stages_per_rank=v, micro_batches=m, count_traffic=True, record=False)
        out.append(result["traffic"])
    return out


def test_the_count_equals_what_coursekit_comm_records_in_a_real_run():
    """Two ranks, a 4-layer MLP 64 wide (every boundary 64 wide), global batch 16, 2 steps: the bytes
    ``coursekit.comm``'s counters record (payload: the shape headers are control traffic) equal the count from
    the action list, per link. Planted bug seen failing: only SEND_F counted: '1f1b: 16384 != 8192' (recorded != counted)."""
    runs = [("1f1b", 1, 4), ("gpipe", 1, 2), ("interleaved", 2, 4), ("zb_h1", 1, 2)]
    per_rank = coursekit.launch(_counted, 2, runs, timeout=120)
    for k, (name, v, m) in enumerate(runs):
        recorded = coursekit.comm.Traffic.merge([per_rank[r][k] for r in range(2)])
        counted = pipeline_traffic(make_schedule(name, 2, m, v), 16 // m * 64)
        assert recorded.total_bytes == 2 * counted.bytes_per_step, \
            f"{name}: {recorded.total_bytes} != {2 * counted.bytes_per_step}"
        assert {link: n * 4 for link, n in recorded.links.items()} == \
            {link: 2 * n * counted.bytes_per_message for link, n in counted.links.items()}, name


def test_tiny_mlp_all_reduce_against_its_pipeline_traffic():
    """The 4-layer MLP 64 wide: Ψ = 16·64+64 + 2·(64·64+64) + 64·4+4 = 9,668; its all-reduce on 2 ranks
    2·Ψ·4 bytes, against 1F1B's 2·1·16·64·4 for a global batch of 16."""
    psi = count_parameters(tiny_mlp(n_layers=4))
    assert psi == 16 * 64 + 64 + 2 * (64 * 64 + 64) + 64 * 4 + 4
    assert all_reduce_bytes(psi, 2) == 2 * psi * 4
    assert pipeline_traffic(one_f_one_b(2, 4), 4 * 64).bytes_per_step == 2 * 16 * 64 * 4
