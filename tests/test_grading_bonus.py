"""Bonus checks (issue 58, item 1: an optional stretch per exercise): what a check registered with ``bonus=True``
earns adds to the score and never to the maximum; a stretch not written is "not attempted", costs nothing and is
said on the report's bonus line; a wrong one gets feedback naming its mistake, and a property of it (``requires=``)
scores only while it is right, as everywhere else.

A made-up exercise: ``double(x)`` is the required part (2 points); the stretch ``triple(x)`` is a bonus answer
(2 points) with a bonus property (1 point). Expected values are written from the rule, not read from the code.

Planted bugs, each seen failing (in coursekit/grading):

* ``Report.max_score`` summing the bonus points too -> every test fails (max 5, not 2);
* the grader keeping "not done" for an unwritten stretch -> both cases of test_an_unwritten_stretch_costs_nothing;
* ``Report.full_marks`` counting the bonus checks -> the same two (not full marks);
* ``bonus_line`` saying "bonus 0/3" for an unwritten stretch -> the same two (no "bonus: not attempted" line);
* ``credited`` dropping ``Result.bonus`` when it withholds a property's points -> test_a_wrong_stretch_... fails
  (the withheld property counts toward the maximum: max 3).
"""

from __future__ import annotations

import json

import pytest

from coursekit import grading
from coursekit.grading.report import REPORT_ENV

EXERCISE = "99_bonus_test"


@pytest.fixture(autouse=True)
def exercise():
    @grading.check(EXERCISE, points=2)
    def doubles(submission, ctx):
        if submission.double(3) != 6:
            raise grading.CheckFailed(f"double(3) is {submission.double(3)}, not 6")

    @grading.check(EXERCISE, points=2, bonus=True)
    def triples(submission, ctx):
        if getattr(submission, "triple", None) is None:
            raise grading.NotDone("triple not passed")
        got = submission.triple(3)
        if got == 6:
            raise grading.CheckFailed("triple(3) is 6, double's value: multiply by 3, not 2")
        if got != 9:
            raise grading.CheckFailed(f"triple(3) is {got}, not 9")

    @grading.check(EXERCISE, points=1, bonus=True, requires=("triples",))
    def triples_fast(submission, ctx):
        submission.triple(1)  # not written: NotImplementedError, not attempted

    yield
    grading.forget(EXERCISE)


def double(x):
    return 2 * x


def unwritten(x):
    raise NotImplementedError


def summary(report) -> tuple:
    return report.score, report.max_score, report.full_marks, [(r.name, r.earned, r.status) for r in report.results]


def test_a_right_stretch_adds_to_the_score_only():
    report = grading.grade(EXERCISE, verbose=False, double=double, triple=lambda x: 3 * x)
    score, most, full, _ = summary(report)
    assert (score, most, full) == (5, 2, True), f"score {score}, max {most}, full marks {full}\n{report.table()}"
    lines = report.table().splitlines()
    assert lines[0] == f"{EXERCISE}: 5 / 2 points" and lines[1] == "bonus 3/3", report.table()
    assert "triples (bonus)" in report.table()


@pytest.mark.parametrize("triple", [unwritten, None], ids=["raises NotImplementedError", "not passed"])
def test_an_unwritten_stretch_costs_nothing(triple):
    stretch = {} if triple is None else {"triple": triple}
    report = grading.grade(EXERCISE, verbose=False, double=double, **stretch)
    assert summary(report) == (2, 2, True, [("doubles", 2, "pass"), ("triples", 0, "not attempted"),
                                            ("triples_fast", 0, "not attempted")]), report.table()
    assert report.table().splitlines()[:2] == [f"{EXERCISE}: 2 / 2 points",
                                               "bonus: not attempted (optional: it can only add points)"], report.table()
    assert "fail" not in report.table()


def test_a_wrong_stretch_is_told_its_mistake_and_its_property_is_not_scored():
    report = grading.grade(EXERCISE, verbose=False, double=double, triple=double)
    by_name = {r.name: r for r in report.results}
    assert (report.score, report.max_score) == (2, 2), report.table()
    assert by_name["triples"].status == "fail" and "multiply by 3, not 2" in by_name["triples"].feedback
    assert (by_name["triples_fast"].earned, by_name["triples_fast"].status) == (0, "not scored"), report.table()
    assert "bonus 0/3" in report.table().splitlines()[1]


def test_a_wrong_required_part_still_leaves_the_bonus_out_of_the_maximum():
    report = grading.grade(EXERCISE, verbose=False, double=lambda x: x, triple=unwritten)
    assert (report.score, report.max_score, report.full_marks) == (0, 2, False), report.table()


def test_the_saved_report_keeps_the_bonus_apart(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    monkeypatch.setenv(REPORT_ENV, str(path))
    grading.grade(EXERCISE, verbose=False, double=double, triple=lambda x: 3 * x)
    assert json.loads(path.read_text())[EXERCISE]["triples"]["bonus"] is True
    report = grading.saved_report(EXERCISE, path)
    assert (report.score, report.max_score, report.full_marks) == (5, 2, True), report.table()
    assert report.table().splitlines()[1] == "bonus 3/3"
