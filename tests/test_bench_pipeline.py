"""python -m coursekit.bench pipeline: the bubble it measures is right on a run whose answer is known, and a quick
run prints every schedule against its formula and the targets against PyTorch."""

from fractions import Fraction
from types import SimpleNamespace

from coursekit.bench.pipeline import analyse, main, winners, zb_targets
from coursekit.bench.pipeline_sweep import sweep_table, sweep_targets, why_missed
from coursekit.experiments import SweepResult
from coursekit.parallel.pipeline import bubble_formula, make_schedule, plan
from coursekit.measure.trace import Span

MS = 1e-3


def _perfect_run(schedule, times):
    """The spans an executor with no overhead would record: compute at the plan's times (in ms), each RECV
    covering the wait before the next compute, each SEND taking no time."""
    spans = []
    for rank, actions in enumerate(schedule.actions):
        planned = {action: (start, end) for action, start, end in plan(schedule, times).spans[rank]}
        cursor, compute = Fraction(0), iter(a for a in actions if a in planned)
        upcoming = next(compute, None)
        for action in actions:
            if action in planned:
                start, end = planned[action]
                kind = {"F": "forward", "B": "backward", "W": "weight"}[action.op]
                upcoming = next(compute, None)
            elif action.op.startswith("RECV"):
                start = cursor
                end = max(cursor, planned[upcoming][0]) if upcoming is not None else cursor
                kind = "idle"
            else:
                start, end, kind = cursor, cursor, "comm"
            spans.append(Span(rank, kind, str(action), float(start) * MS, float(end) * MS))
            cursor = end
    return spans


def test_the_measured_bubble_of_a_run_without_overhead_is_the_plans():
    """Planted bug seen failing: the busy time divided by one rank's step instead of p ranks' (``gpipe p=2 m=3``:
    bubble -0.5 for 0.25)."""
    for name, p, m, v in (("gpipe", 2, 3, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2), ("zb_h1", 3, 5, 1)):
        schedule = make_schedule(name, p, m, v)
        times = {"F": 1, "B": 1, "W": 1} if schedule.split_backward else {"F": 1, "B": 2, "W": 0}
        expected = float(plan(schedule, times).bubble_fraction)
        result = analyse(_perfect_run(schedule, times), schedule, warmup=0)
        label = f"{name} p={p} m={m}"
        assert abs(result["bubble"] - expected) < 1e-9, (label, result["bubble"], expected)
        assert abs(result["plan"] - expected) < 1e-9, (label, result["plan"], expected)
        assert abs(result["overhead"]) < 1e-12, (label, result["overhead"])
        if name in ("gpipe", "1f1b", "interleaved"):
            assert abs(expected - float(bubble_formula(name, p, m, v))) < 1e-9, label


def test_a_quick_run_prints_every_schedule_and_the_targets(capsys):
    """``--quick``: p = 2, m = 2, a small model. Timings are noise here; what is checked is what is printed.

    Planted bug seen failing: ZB-H1 left out of the table (its generator's name misspelt in SCHEDULES)."""
    targets = main(["--quick"])
    out = capsys.readouterr().out
    for name, v, m in (("gpipe", 1, 2), ("1f1b", 1, 2), ("interleaved", 2, 2), ("zb_h1", 1, 2)):
        formula = f"{float(bubble_formula(name, 2, m, v)):.0%}"
        assert any(line.startswith(f"| 2 | {name} | {v} | {m} |") and f"| {formula} |" in line
                   for line in out.splitlines()), (name, out)
    assert [t[0] for t in targets] == [f"coursekit {n} ≤ 1.2× torch (p = 2, m = 2)"
                                       for n in ("gpipe", "1f1b", "interleaved")]
    assert all(t[1].endswith("×") for t in targets)
    assert "receiver already waiting" in out
    assert "| m | 1F1B | GPipe | one process, same m |" in out  # the m-sweep, at m = 1, 2, 4, 64 wide
    assert "m-sweep's targets are measured on layers at least 1024 wide" in out


def test_the_winner_is_named_by_step_time_beside_the_smallest_bubble(capsys):
    """A table where the faster schedule has the larger bubble: both are named, each for what it is.

    Planted bug seen failing: the winner picked by bubble (``winner by step time 1f1b``)."""
    winners({(2, 8): {"1f1b": (0.070, 0.20), "zb_h1": (0.060, 0.30)}, (4, 1): {"gpipe": (0.1, 0.5)}})
    out = capsys.readouterr().out
    assert "p = 2, m = 8: winner by step time zb_h1 (fastest first: zb_h1 60.0 ms, 1f1b 70.0 ms)" in out
    assert "smallest measured bubble 1f1b (20%)" in out
    assert "p = 4" not in out  # one schedule: nothing to compare


def test_the_zb_h1_targets_pair_the_steps_and_compare_b_plus_w_with_one_backward(capsys):
    """A small run (hidden 32, 2 rounds): the step ratio is over 2 rounds × 1 step of each schedule; B + W against
    1F1B's B comes from the table's means given here: (1 + 1.1) / 2 = 1.05× (met), and 1.5 + 1.1 over 2 = 1.30×
    (missed).

    Planted bug seen failing: B + W divided by 1F1B's F + B (``0.70×`` for ``1.05×``)."""
    options = SimpleNamespace(hidden=32, batch=16, pairs=2)
    base = {"F": 1e-3, "B": 2e-3}
    targets = zb_targets(options, {(2, "zb_h1", 8): {"times": {"F": 1e-3, "B": 1e-3, "W": 1.1e-3}},
                                   (2, "1f1b", 8): {"times": base}})
    out = capsys.readouterr().out
    assert [t[0] for t in targets] == ["ZB-H1's step ≤ 1F1B's (p = 2, m = 8, paired)",
                                       "ZB-H1's B + W ≤ 1.1× 1F1B's backward (p = 2, m = 8)"]
    assert "over 2 steps" in out and targets[0][1].endswith("]")
    assert targets[1][1:] == ("1.05×", True)
    missed = zb_targets(options, {(2, "zb_h1", 8): {"times": {"F": 1e-3, "B": 1.5e-3, "W": 1.1e-3}},
                                  (2, "1f1b", 8): {"times": base}})
    assert missed[1][1:] == ("1.30×", False)


def _sweep(ms, speedup_share=1.0, bubble_offset=None):
    """A sweep whose every number follows from the formulas: speed-up = share × ideal, bubble = formula (+ offset)."""
    rows = []
    for m in ms:
        ideal, formula = 2 * m / (m + 1), 1 / (m + 1)
        speedup = (speedup_share * ideal, 0.9 * speedup_share * ideal, 1.1 * speedup_share * ideal)
        step = {v: 0.1 for v in ("1f1b", "1f1b_ahead", "gpipe", "gpipe_recompute", "same_work", "whole_batch",
                                 "both_cores")}
        rows.append({"m": m, "step": step, "speedup_1f1b": speedup, "speedup_gpipe": speedup, "ideal": ideal,
                     "bubble": formula + (bubble_offset or {}).get(m, 0.0), "bubble_formula": formula,
                     "accumulation_cost": (1.0, 1.0, 1.0), "both_cores": (1.0, 1.0, 1.0),
                     "compute_inflation": (1.0, 1.0, 1.0), "window_share": (1.0, 1.0, 1.0),
                     "post_ahead_gain": (1.0, 1.0, 1.0), "in_flight": 0.0,
                     "quietest": {"both_cores": 1.0, "speedup_1f1b": speedup_share * ideal},
                     "peak_activation_bytes": {"1f1b": [2 ** 20, 2 ** 19], "gpipe": [m * 2 ** 19] * 2,
                                               "gpipe_recompute": [0, 2 ** 19]}})
    return SweepResult(rows)


def test_the_sweeps_targets_are_met_on_the_formulas_and_missed_off_them():
    """A sweep exactly on the formulas meets every target; 84% of the ideal, a bubble that rises, or one 11 points
    off the formula each misses its own. Planted bugs, seen failing: the 85% compared with the ideal's
    complement (``≥ 0.85 * (1 - ideal)``: 84% met); the monotonic check as ``>=`` on (a, a) pairs (a flat bubble
    met); the distance checked at m ≥ 8 only (m = 4 eleven points off met). No timing: every number is made up."""
    ms = (1, 2, 4, 8, 16)
    assert all(met for _, _, met in sweep_targets(_sweep(ms))), sweep_targets(_sweep(ms))
    slow = {t[0]: t[2] for t in sweep_targets(_sweep(ms, speedup_share=0.84))}
    assert [met for name, met in slow.items() if name.startswith("1F1B")] == [False, False], slow
    flat = sweep_targets(_sweep(ms, bubble_offset={8: 1 / 5 - 1 / 9}))  # m = 8's bubble as m = 4's
    assert [met for name, _, met in flat if name.startswith("measured bubble falls")] == [False], flat
    off = sweep_targets(_sweep(ms, bubble_offset={4: 0.11}))
    assert [met for name, _, met in off if "within 10 points" in name] == [False], off
    assert [met for name, _, met in off if "falls" in name] == [True], off


def test_the_sweeps_table_has_a_row_per_m_with_its_ideal_and_formula():
    """Planted bug, seen failing: the ideal column printed as m/(m+1) (half the ideal): '1.00×' not in m = 1's row."""
    table = sweep_table(_sweep((1, 4, 8))).splitlines()
    assert len(table) == 2 + 3
    for line, m in zip(table[2:], (1, 4, 8)):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == str(m)
        assert f"{2 * m / (m + 1):.2f}×" in cells, (m, cells)
        assert f"{1 / (m + 1):.1%}" in cells, (m, cells)


def test_a_missed_sweep_target_says_why_and_a_met_one_says_nothing(capsys):
    """Planted bug, seen failing: the explanation printed for met targets (``>=`` for ``<``): 'printed for a
    sweep on the formulas'."""
    why_missed(_sweep((1, 2, 4, 8, 16)))
    assert capsys.readouterr().out == "", "printed for a sweep on the formulas"
    why_missed(_sweep((1, 2, 4, 8, 16), speedup_share=0.84, bubble_offset={8: 0.12}))
    out = capsys.readouterr().out
    assert "m = 4, 1F1B below 85% of its ideal" in out and "m = 8, 1F1B below 85% of its ideal" in out, out
    assert "m = 8, bubble 23.1% against the formula's 11.1%" in out, out
