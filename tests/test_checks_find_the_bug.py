"""Exercise 09's grader: the notebook's solution full marks, its stub zero, each typical mistake what it deserves;
and the broken programs fail on real ranks the way the notebook says they do.

The solution, the stub and the broken programs come from the notebook's one source
(tools/notebook_src/09_find_the_bug.py, through tests/submissions/find_the_bug/_fb_solution.py); every attempt in
tests/submissions/find_the_bug/ is graded with its score and feedback (README there).

Planted bugs, each seen failing (in coursekit/grading/find_the_bug*.py):
* the letters compared as given, not upper-cased and stripped -> reads_the_hints "names_each_bug's feedback lacks
  'not every reading is the one its report supports'";
* program A's length error left to the generic words -> broken_unchanged and loss_all_reduced_after_step_on_rank_0
  "program_a_fixed's feedback lacks 'the loss all-reduce still runs on rank 0 only'";
* the sum-not-mean test left out -> loss_divided_on_rank_0_only "feedback lacks \"the sum of the ranks' losses, not
  their mean\""; the own-loss test left out -> loss_not_all_reduced "feedback lacks \"its own loss ...\"";
* RingWatch's vet switched off -> broken_unchanged and ring_receives_from_right deadlock in the simulator, "feedback
  lacks 'world size 3: rank r still sends to r-1 ...'" / "'... rank r receives from r+1 ...'"; the library's labels
  not looked at -> ring_calls_the_library "program_b_fixed earned 3.0, not 0"; the passed-own-tensor test left out
  -> ring_passes_its_own "feedback lacks \"rank 0's sum holds its left neighbour's tensor 2 times\"";
* the replicas' samples not compared -> replica_one_seed_for_all "feedback lacks 'world size 2: rank 1 drew the same
  samples as rank 0'"; nothing sent not checked -> replica_seeded_alike_then_apart "program_c_fixed earned 3.0, not
  0"; rank 0's stuck send not explained -> replica_received_on_rank_1_only "feedback lacks 'rank 2 never receives
  what rank 0 sends it'";
* make_replica judged on 2 ranks only -> replica_sent_to_rank_1_only "program_c_fixed earned 3.0, not 1.5";
* rank 0's start taken as built, not as its seed draws it -> replica_weights_averaged "program_c_fixed earned 3.0,
  not 0" (it earned 12/12: issue 42, item 3);
* words instead of letters taken as unanswered -> diagnosis_in_words "names_each_bug's feedback lacks 'program_a:
  a letter is expected'" (it was told to replace each "?"); a length error other than the loss's 1 element left to
  the library's words -> loss_padded_to_match "program_a_fixed's feedback lacks 'a collective runs on rank 0
  only'" (it was told "did one rank build its gradients differently?": issue 42, item 6);
* the stub not recognised before ranks start -> test_stub_is_not_done (status "fail", not "not done").
"""

from __future__ import annotations

import itertools

import pytest
import torch
from grading_support import assert_graded, attempts, load

import coursekit
from coursekit.grading import check_find_the_bug
from coursekit.grading.find_the_bug_options import ANSWERS, OPTIONS, judge_diagnosis
from coursekit.grading.find_the_bug_programs import (data_parallel_rank, drawn_replica, replica_rank,
                                                     replica_reference, replicas_compared, ring_rank,
                                                     start_difference)

ATTEMPTS = attempts("find_the_bug")
PARTS = ("diagnosis", "train_step", "ring_sum", "make_replica")


def graded(module):
    return check_find_the_bug(*(getattr(module, part) for part in PARTS), verbose=False)


@pytest.mark.parametrize("name", ATTEMPTS)
def test_attempt_gets_its_score_and_feedback(name):
    module = load("find_the_bug", name)
    report = graded(module)
    assert report.max_score == 12
    assert_graded(report, module)


def test_stub_is_not_done():
    report = graded(load("find_the_bug", "stub"))
    assert [r.status for r in report.results] == ["not done"] * 4, report.table()
    assert check_find_the_bug(verbose=False).score == 0     # nothing given at all: not done, no crash


def test_every_typical_mistake_has_an_attempt():
    assert {"solution", "stub", "broken_unchanged", "reads_the_hints", "loss_divided_on_rank_0_only",
            "loss_not_all_reduced", "ring_receives_from_right", "ring_passes_its_own", "ring_calls_the_library",
            "replica_one_seed_for_all", "replica_sent_to_rank_1_only", "replica_broadcast_parameters"} <= set(ATTEMPTS)


def test_the_options_do_not_give_the_answer_away():
    """One right letter per program, a different one each time; the right option is never the longest and every
    option is within 10% of its program's mean length. (Issue 42, item 5: the right option was always the longest,
    and B, C, D in turn.) Planted, seen failing: the right option of program_a made the longest -> 'program_a: the
    right option is the longest'."""
    assert set(ANSWERS) == set(OPTIONS) and len(set(ANSWERS.values())) == len(ANSWERS)
    for program, options in OPTIONS.items():
        assert set(options) == {"A", "B", "C", "D"}, program
        lengths = {letter: len(text) for letter, text in options.items()}
        right = lengths.pop(ANSWERS[program])
        assert right < max(lengths.values()), f"{program}: the right option is the longest"
        mean = (right + sum(lengths.values())) / 4
        assert all(abs(n - mean) <= 0.1 * mean for n in [right, *lengths.values()]), (program, lengths, right)


def test_trying_letters_learns_nothing_about_any_one_letter():
    """Of the 64 ways to answer with three letters, one is right and the other 63 get the same words: a retry
    learns only "not this set" (issue 42, item 5: a sentence per wrong program let a retry find each letter in at
    most three tries). Answered in part, the letters given are not judged. Planted, seen failing: judging each
    program on its own ("63 wrong sets were told 7 different things"), and judging the letters given beside a "?"."""
    told = {}
    for letters in itertools.product("ABCD", repeat=3):
        problems, nothing = judge_diagnosis(dict(zip(OPTIONS, letters)))
        assert not nothing
        told[letters] = "\n".join(problems)
    right = tuple(ANSWERS[program] for program in OPTIONS)
    assert told.pop(right) == "", "the right letters were not judged right"
    assert len(set(told.values())) == 1, f"{len(told)} wrong sets were told {len(set(told.values()))} different things"
    partial = {"\n".join(judge_diagnosis({"program_a": "?", **dict(zip(list(OPTIONS)[1:], letters))})[0])
               for letters in itertools.product("ABCD", repeat=2)}
    assert len(partial) == 1, f"with program_a unanswered, the others' letters were told {len(partial)} things"


# ----------------------------------------------------------------------------- what the notebook says
def solution():
    return load("find_the_bug", "_fb_solution").solution


def test_program_a_dies_on_a_length_error_that_blames_the_gradients():
    with pytest.raises(coursekit.RankError) as caught:
        coursekit.launch(data_parallel_rank, 2, solution()["broken_train_step"], timeout=20)
    assert caught.value.rank == 0
    assert caught.value.remote_traceback.strip().splitlines()[-1] == (
        "ValueError: ring_all_reduce: rank 0 has 1 elements of torch.float32 but rank 1 has 1024 elements of "
        "torch.float32. Every rank must pass a tensor of the same length and dtype (did one rank build its "
        "gradients differently?).")


def test_program_b_works_on_two_ranks_and_hangs_on_three_each_rank_waiting_on_its_left():
    broken = solution()["broken_ring_sum"]
    two = coursekit.launch(ring_rank, 2, broken, 5, False, timeout=20)
    first, second = (torch.randint(-8, 9, (5,), generator=torch.Generator().manual_seed(7919 * r + 5)) for r in (0, 1))
    assert all(torch.equal(r["total"], (first + second).float()) for r in two)
    with pytest.raises(coursekit.LaunchTimeout) as caught:
        coursekit.launch(ring_rank, 3, broken, 5, False, timeout=2)
    assert caught.value.ranks == [0, 1, 2]
    for rank in range(3):
        assert caught.value.waiting[rank].startswith(f"waiting on recv from rank {(rank - 1) % 3}, 5 elements "
                                                     f"(ring step 0)"), caught.value.waiting


def test_program_c_runs_and_differs_from_one_process_first_in_rank_1s_starting_weights():
    results = coursekit.launch(replica_rank, 2, solution()["broken_make_replica"], timeout=20)
    reference = replica_reference(results[0]["initial"], [r["drawn"] for r in results])
    report = coursekit.compare(reference, [r["records"] for r in results], check_output=False)
    assert not report.ok and (report.first.step, report.first.kind, report.first.rank) == (0, "loss", 0)
    assert abs(results[0]["records"][0]["loss"] - reference[0]["loss"]) > 0.05   # "the loss differs by 0.07"
    start = replicas_compared(results).first
    assert (start.kind, start.name, start.rank) == ("param", "0.weight", 1)
    assert results[0]["drawn"] != results[1]["drawn"]     # each rank its own samples, as the options say


def test_the_grader_draws_rank_0s_replica_as_the_broken_program_does():
    """The start program C's grader holds rank 0 to is the notebook's: rank 0 of broken_make_replica, built in a
    rank, equals drawn_replica(0) exactly (and rank 1's differs). Planted, seen failing: drawn_replica seeded
    with 1000 + rank + 1 -> "('0.weight', ...)"."""
    results = coursekit.launch(replica_rank, 2, solution()["broken_make_replica"], timeout=20)
    assert start_difference(drawn_replica(0), results[0]["initial"]) is None, \
        start_difference(drawn_replica(0), results[0]["initial"])
    assert start_difference(drawn_replica(1), results[1]["initial"]) is None
    assert start_difference(drawn_replica(0), results[1]["initial"]) is not None


def test_the_same_attempt_gets_the_same_report():
    module = load("find_the_bug", "broken_unchanged")
    assert graded(module).table() == graded(module).table()
