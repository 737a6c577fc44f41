"""The grader's judgment, tested: each committed wrong attempt (tests/submissions/) gets its expected score,
each check loses exactly the points its file says with the feedback it names, every other check earns full
marks, and nothing gloo or C++ prints (an abort, a reset connection) reaches the learner.

Each attempt is what a learner wrote (issue 9's table, and more typical mistakes); see
tests/submissions/README.md for the format (one folder per exercise; 04-06 are graded in their own test files).
Three of them are the negative controls of checks that could be switched off unnoticed (issue 10, item 4):

* ``ring_allreduce/float16_copies``: replicas that differ in the last bits. Planted bug:
  ``all_reduce_bit_identical`` switched off (its body replaced by ``return``) -> this attempt scores 12, not 11.
* ``ring_allreduce/parameter_server``: a correct result where one rank sends everything. Planted bug: the
  per-rank load part of ``ring_traffic_pattern`` deleted -> its feedback lacks "per-rank load". (It cannot fail that
  part alone: with neighbours only and exactly 2·(G−1)·N elements the load is forced to the ring's, so an
  unbalanced load always comes with a non-neighbour, which the correctness checks reject too.)
* ``ring_allreduce/calls_dist_all_reduce``: a ring that calls ``dist.all_reduce``. Planted bug:
  ``only_point_to_point`` switched off -> it earns its point. (Every check that runs the forbidden call fails
  with the same sentence: a check that credited such code would credit a cheat, so it cannot fail that check alone.)
* ``ring_allreduce/does_nothing``: returns its input's owned segment, leaves ``out`` as it is, sends nothing. Planted
  bug: ``only_point_to_point``'s "nothing was sent" test deleted (its run kept) -> it earns that point, and it is the
  only attempt that fails (the others that lose the point call a forbidden function or deadlock in the run itself).

``data_parallel/accumulation_overwrites`` (issue 12, item 8) is right with one backward per step and fails only
``hooks_gradient_accumulation``. Planted bug: that check's body replaced by ``return 1.0`` -> seen failing
("hooks_gradient_accumulation earned 2.0, not 0").
"""

import time

import pytest
from grading_support import assert_graded, attempts, load

from coursekit import grading

FOLDERS = ("ring_allreduce", "data_parallel", "model_parallel")  # 04-06 are graded in test_checks_<exercise>.py
ATTEMPTS = [f"{folder}/{name}" for folder in FOLDERS for name in attempts(folder)]
NOISE = ("terminate called", "EnforceNotMet", "Connection reset by peer", "Connection closed by peer", "pair.cc")


def test_every_row_of_the_issue_has_an_attempt():
    assert {"ring_allreduce/parameter_server", "ring_allreduce/off_by_one_receive",
            "ring_allreduce/wrong_owned_segment", "ring_allreduce/send_before_recv", "data_parallel/average_weights",
            "data_parallel/sum_not_mean", "data_parallel/zero2_frozen", "data_parallel/dist_all_reduce",
            "data_parallel/accumulation_overwrites", "ring_allreduce/wraps_library_ring",
            "ring_allreduce/wraps_library_all_gather", "ring_allreduce/does_nothing"} <= set(ATTEMPTS)  # issue 22


@pytest.mark.parametrize("name", ATTEMPTS)
def test_attempt_gets_its_score_and_feedback(name, capfd):
    attempt = load(*name.split("/"))
    parts = grading.EXERCISES[attempt.EXERCISE].parts
    start = time.perf_counter()
    report = grading.grade(attempt.EXERCISE, verbose=False,
                           **{f: getattr(attempt, f) for f in parts if hasattr(attempt, f)})
    seconds = time.perf_counter() - start
    with capfd.disabled():  # reported (pytest -s), never asserted: it depends on the machine
        print(f"\n{name}: graded in {seconds:.1f} s")
    assert_graded(report, attempt)
    table = report.table()
    leaked = capfd.readouterr()
    for text in NOISE:
        assert text not in table, f"{name}: {text!r} reached the feedback\n{table}"
        assert text not in leaked.out + leaked.err, f"{name}: {text!r} was printed"
