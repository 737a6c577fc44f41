"""The grader's judgment, tested: each committed wrong attempt (tests/submissions/) gets its expected score,
each check loses exactly the points its file says with the feedback it names, every other check earns full
marks, and nothing gloo or C++ prints (an abort, a reset connection) reaches the learner.

Each attempt is what a learner wrote (issue 9's table, and more typical mistakes); see
tests/submissions/README.md for the format. Three of them are the negative controls of checks that
could be switched off unnoticed (issue 10, item 4):

* ``ring_float16_copies``: replicas that differ in the last bits. Planted bug: ``all_reduce_bit_identical``
  switched off (its body replaced by ``return``) -> this attempt scores 12, not 11.
* ``ring_parameter_server``: a correct result where one rank sends everything. Planted bug: the per-rank
  load part of ``ring_traffic_pattern`` deleted -> its feedback lacks "per-rank load". (It cannot fail that
  part alone: with neighbours only and exactly 2·(G−1)·N elements the load is forced to the ring's, so an
  unbalanced load always comes with a non-neighbour, which the correctness checks reject too.)
* ``ring_calls_dist_all_reduce``: a ring that calls ``dist.all_reduce``. Planted bug: ``only_point_to_point``
  switched off -> it earns its point. (Every check that runs the forbidden call fails with the same
  sentence: a check that credited such code would credit a cheat, so it cannot fail that check alone.)

``dp_accumulation_overwrites`` (issue 12, item 8) is right with one backward per step and fails only
``hooks_gradient_accumulation``. Planted bug: that check's body replaced by ``return 1.0`` -> seen failing
("hooks_gradient_accumulation earned 2.0, not 0").
"""

import importlib
import sys
import time
from pathlib import Path

import pytest

from coursekit import grading

SUBMISSIONS = Path(__file__).resolve().parent / "submissions"
ATTEMPTS = sorted(p.stem for p in SUBMISSIONS.glob("*.py") if not p.name.startswith("_"))
FUNCTIONS = ("reduce_scatter", "all_gather", "attach_gradient_averaging", "reduce_scatter_gradients", "first_stage",
             "second_stage")
NOISE = ("terminate called", "EnforceNotMet", "Connection reset by peer", "Connection closed by peer", "pair.cc")


def _load(name: str):
    if str(SUBMISSIONS) not in sys.path:
        sys.path.insert(0, str(SUBMISSIONS))  # the attempts import the part they get right from _solutions
    return importlib.import_module(name)


def test_every_row_of_the_issue_has_an_attempt():
    assert {"ring_parameter_server", "ring_off_by_one_receive", "ring_wrong_owned_segment", "ring_send_before_recv",
            "dp_average_weights", "dp_sum_not_mean", "dp_zero2_frozen", "dp_dist_all_reduce",
            "dp_accumulation_overwrites"} <= set(ATTEMPTS)


@pytest.mark.parametrize("name", ATTEMPTS)
def test_attempt_gets_its_score_and_feedback(name, capfd):
    attempt = _load(name)
    start = time.perf_counter()
    report = grading.grade(attempt.EXERCISE, verbose=False,
                           **{f: getattr(attempt, f) for f in FUNCTIONS if hasattr(attempt, f)})
    seconds = time.perf_counter() - start
    with capfd.disabled():  # reported (pytest -s), never asserted: it depends on the machine
        print(f"\n{name}: graded in {seconds:.1f} s")
    table = report.table()
    by_name = {r.name: r for r in report.results}
    assert set(attempt.LOSES) <= set(by_name), f"{name}: unknown checks {set(attempt.LOSES) - set(by_name)}"
    for check, result in by_name.items():
        if check in attempt.LOSES:
            earned, phrases = attempt.LOSES[check]
            assert result.earned == pytest.approx(earned), f"{name}: {check} earned {result.earned}, not {earned}\n{table}"
            for phrase in [phrases] if isinstance(phrases, str) else phrases:
                assert phrase in result.feedback, f"{name}: {check}'s feedback lacks {phrase!r}\n{table}"
        else:
            assert result.earned == result.points, f"{name}: {check} should earn full marks\n{table}"
    assert report.score == pytest.approx(attempt.SCORE), table
    leaked = capfd.readouterr()
    for text in NOISE:
        assert text not in table, f"{name}: {text!r} reached the feedback\n{table}"
        assert text not in leaked.out + leaked.err, f"{name}: {text!r} was printed"
