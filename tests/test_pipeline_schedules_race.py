"""Chapter 04's race of the four schedules (coursekit.experiments.pipeline_schedules) at a tiny size: what it runs
and what it prints, not how fast -- no timing is asserted. The planned column is checked against the papers'
formulas, written here; the printed rows are read back with the pattern a test on the notebook's output uses.

Each test names the bug planted by hand to see it fail.
"""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from coursekit.experiments import balanced_mlp
from coursekit.experiments.pipeline_schedules import RACE_CONFIGS, RACE_LINE, RaceRow, format_race, schedule_race
from coursekit.parallel.pipeline import COMPUTE, compute_op, make_schedule, split

P, M = 2, 4


@pytest.fixture(scope="module")
def rows() -> list[RaceRow]:
    return schedule_race(m=M, batch=16, width=32, n_layers=8, iterations=3)


def test_each_schedule_ran_its_own_actions_once(rows):
    """One row per schedule, in the race's order; the spans kept for a row are one step of that schedule: each of
    its compute actions once, on the rank that holds the stage.

    Planted bug seen failing: the tracer's spans not cleared before each step ('gpipe: 264 compute spans, the
    schedule has 16')."""
    assert [(r.schedule, r.v) for r in rows] == list(RACE_CONFIGS)
    for row in rows:
        schedule = make_schedule(row.schedule, P, M, row.v)
        want = sorted((rank, str(a)) for rank, actions in enumerate(schedule.actions) for a in actions
                      if a.op in COMPUTE)
        got = sorted((s.rank, s.name) for s in row.spans if compute_op(s) is not None)
        assert len(got) == len(want), f"{row.schedule}: {len(got)} compute spans, the schedule has {len(want)}"
        assert got == want, row.schedule


def test_the_planned_column_is_the_papers_and_in_the_taught_order(rows):
    """GPipe and 1F1B (p−1)/(m+p−1), interleaved (p−1)/(v·m+p−1), ZB-H1 (p−1)/(3m+p−1) with F, B and W one unit
    each (Qi et al.: (p−1) units idle beside 3m of work): so GPipe = 1F1B > interleaved > ZB-H1.

    Planted bug seen failing: ZB-H1 with W right after every B (``if k >= 0`` in ``zb_h1``): 'zb_h1: 0.142... != 1/13'."""
    formula = {"gpipe": Fraction(P - 1, M + P - 1), "1f1b": Fraction(P - 1, M + P - 1),
               "interleaved": Fraction(P - 1, 2 * M + P - 1), "zb_h1": Fraction(P - 1, 3 * M + P - 1)}
    planned = {r.schedule: r.planned for r in rows}
    for name, want in formula.items():
        assert planned[name] == pytest.approx(float(want)), f"{name}: {planned[name]} != {want}"
    assert planned["gpipe"] == planned["1f1b"] > planned["interleaved"] > planned["zb_h1"]


def test_rows_are_medians_within_their_range_and_1f1b_is_its_own_unit(rows):
    """Each (median, lowest, highest) is ordered; a bubble is a share; 1F1B against itself is 1 in every repeat.

    Planted bug seen failing: ``_spread`` returning (min, median, max): 'gpipe bubble (0.890, 0.929, 0.931)'."""
    for row in rows:
        for what, (median, low, high) in (("bubble", row.bubble), ("step", row.step)):
            assert low <= median <= high, f"{row.schedule} {what} {(median, low, high)}"
        assert 0 <= row.bubble[1] and row.bubble[2] < 1, f"{row.schedule} bubble {row.bubble}"
        assert row.step[1] > 0
    assert next(r for r in rows if r.schedule == "1f1b").versus_1f1b == (1.0, 1.0, 1.0)


def test_the_printed_rows_read_back_with_race_line():
    """What ``format_race`` prints, parsed with :data:`RACE_LINE`: the planned and measured bubbles in percent,
    the step in milliseconds, the ratio to 1F1B.

    Planted bug seen failing: the step printed in seconds ('0.1' != '123.4')."""
    row = RaceRow("zb_h1", 1, 1 / 13, (0.15, 0.101, 0.2), (0.1234, 0.1, 0.2), (0.9, 0.8, 1.0), [])
    text = format_race([row, RaceRow("1f1b", 1, 0.2, (0.25, 0.2, 0.3), (0.137, 0.13, 0.15), (1, 1, 1), [])])
    lines = text.splitlines()
    assert len(lines) == 2
    first = re.match(RACE_LINE, lines[0])
    assert first is not None, lines[0]
    want = {"schedule": "zb_h1", "planned": "7.7", "bubble": "15.0", "bubble_lo": "10.1", "bubble_hi": "20.0",
            "step": "123.4", "step_lo": "100.0", "step_hi": "200.0", "ratio": "0.90"}
    for key, value in want.items():
        assert first[key] == value, f"{key}: {first[key]!r} != {value!r}"
    assert re.match(RACE_LINE, lines[1])["schedule"] == "1f1b"


def test_the_balanced_mlps_four_chunks_do_the_same_arithmetic():
    """Interleaving cuts the race's MLP in four chunks of two layers: counted, each chunk's forward + backward does
    the same FLOPs, the first from the data (no input gradient), the others from an activation that needs one.

    Planted bug seen failing: the first layer as wide as the others (``d_in=width``): 'chunk 0 does 0.833 of
    chunk 1's' (two layers: 3·2 − 1 units against 3·2)."""
    width, rows = 32, 4
    model = balanced_mlp(width, n_layers=8)
    chunks = split(model, 4, layers_per_stage=[2, 2, 2, 2])
    flops = []
    for k, chunk in enumerate(chunks):
        x = torch.randn(rows, model.layers[0].in_features) if k == 0 else torch.randn(rows, width, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            chunk(x).sum().backward()
        flops.append(counter.get_total_flops())
    for k in range(1, 4):
        assert flops[0] == flops[k], f"chunk 0 does {flops[0] / flops[k]:.3f} of chunk {k}'s"
