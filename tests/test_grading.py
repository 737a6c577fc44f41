"""coursekit.grading and coursekit.grading.ring_allreduce: the ring exercise's checks on good, unfinished,
cheating and stuck submissions; each exercise's checks registered once; `coursekit grade` on the exercise
and solution notebooks."""

import importlib
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from coursekit import collectives, comm, grading
from coursekit.cli import grade_notebook, main
from coursekit.grading import RING
from grading_support import load

ROOT = Path(__file__).resolve().parents[1]


# The notebook's solution, written with coursekit.comm as a learner would (coursekit's own ring is held back
# while exercise 01 is graded).
_SOLUTION = load("ring_allreduce", "_ring_solution")
_good_rs, _good_ag = _SOLUTION.reduce_scatter, _SOLUTION.all_gather


def _todo_rs(tensor, group=None):
    raise NotImplementedError("write reduce_scatter")


def _todo_ag(segment, out, group=None):
    raise NotImplementedError("write all_gather")


def _owned_view(tensor):
    size, rank = comm.get_world_size(), comm.get_rank()
    start, stop = collectives.segment_bounds(tensor.numel(), size)[collectives.owned_segment(rank, size)]
    return tensor.view(-1)[start:stop]


def _cheat_rs(tensor, group=None):
    dist.all_reduce(tensor)
    return _owned_view(tensor)


def _naive_rs(tensor, group=None):  # right answer, wrong algorithm: everyone talks to everyone
    collectives.naive_all_reduce(tensor)
    return _owned_view(tensor)


def _whole_tensor_rs(tensor, group=None):
    """Right answer along the ring, but it passes the whole running sum around: G-1 times N per rank."""
    size, rank = comm.get_world_size(), comm.get_rank()
    running, incoming = tensor.clone(), torch.empty_like(tensor)
    for _ in range(size - 1):
        work = comm.isend(running, (rank + 1) % size)
        comm.recv(incoming, (rank - 1) % size)
        work.wait()
        running = tensor + incoming
    tensor.copy_(running)
    return _owned_view(tensor)


def _divisible_only_rs(tensor, group=None):
    size = comm.get_world_size()
    if tensor.numel() % size:
        raise ValueError("only works for lengths divisible by the world size")
    return _good_rs(tensor, group)


def _stuck_rs(tensor, group=None):
    comm.recv(tensor, (comm.get_rank() - 1) % comm.get_world_size())  # nobody sends
    return tensor


def test_the_reference_ring_scores_full_marks():
    report = grading.check_ring_all_reduce(_good_rs, _good_ag, verbose=False)
    assert report.full_marks and report.score == report.max_score == 12, report.table()
    assert any(r.hidden for r in report.results)


def test_unfinished_stubs_score_zero_quickly_without_raising():
    start = time.perf_counter()
    report = grading.check_ring_all_reduce(_todo_rs, _todo_ag, verbose=False)
    assert report.score == 0 and not report.full_marks
    assert {r.status for r in report.results} == {"not done"}, report.table()
    assert time.perf_counter() - start < 120  # generous: no check may wait for a timeout


def test_calling_torch_all_reduce_fails_with_an_explanation():
    report = grading.grade(RING, only="reduce_scatter_correct", reduce_scatter=_cheat_rs,
                           all_gather=_good_ag, verbose=False)
    assert report.score == 0
    assert "torch.distributed.all_reduce was called" in report.results[0].feedback


def test_everyone_to_everyone_earns_nothing_and_the_traffic_check_names_the_non_neighbour():
    """Right values by the wrong algorithm: not the ring's reduce-scatter, so no credit for them either."""
    report = grading.grade(RING, only=["reduce_scatter_correct", "ring_traffic_pattern"],
                           reduce_scatter=_naive_rs, all_gather=_good_ag, verbose=False)
    correct, traffic = report.results
    assert correct.earned == 0 and traffic.earned == 0
    # G = 2, N = 8: naive sends each rank's whole tensor to the other (one message of 8 > ceil(8/2) elements)
    assert ("world size 2, length 8: right values, but not the ring's reduce-scatter: rank 0 sent 8 elements in "
            "one message (the whole tensor)") in correct.feedback
    assert "rank 0 sent to rank 2" in traffic.feedback and "right neighbour" in traffic.feedback


def test_sending_whole_tensors_is_not_a_ring_step_and_reports_the_extra_traffic():
    report = grading.grade(RING, only=["reduce_scatter_correct", "ring_traffic_pattern"],
                           reduce_scatter=_whole_tensor_rs, all_gather=_good_ag, verbose=False)
    correct, traffic = report.results
    assert correct.earned == 0 and "right values, but not the ring's reduce-scatter" in correct.feedback
    assert "(the whole tensor)" in traffic.feedback
    # G=4, N=10: reduce-scatter moves 4·3·10, all-gather (the good one) 3·10 -> 150 / 60
    assert "2.5× the expected traffic (150 elements moved" in traffic.feedback


def test_partial_credit_names_the_world_size_and_length_that_fail():
    report = grading.grade(RING, only="reduce_scatter_correct", reduce_scatter=_divisible_only_rs,
                           all_gather=_good_ag, verbose=False)
    result = report.results[0]
    assert result.status == "partial" and result.earned == pytest.approx(1.5)  # 3 of 6 cases
    assert "world size 3" in result.feedback and "only works for lengths divisible" in result.feedback


def test_feedback_says_which_segment_is_wrong():
    def wrong_owner(tensor, group=None):  # the right sums, but returns segment r instead of (r+1) % G
        collectives.naive_all_reduce(tensor)  # not the ring (held back in grading): the sums are what matter
        size, rank = comm.get_world_size(), comm.get_rank()
        start, stop = collectives.segment_bounds(tensor.numel(), size)[rank]
        return tensor[start:stop]

    report = grading.grade(RING, only="reduce_scatter_correct", reduce_scatter=wrong_owner,
                           all_gather=_good_ag, verbose=False)
    feedback = report.results[0].feedback
    assert ("world size 2, length 8, float32, rank 0: returned segment 0; after G−1 steps rank r owns segment "
            "(r+1) mod G, so expected segment 1 = elements 4:8") in feedback


def test_a_deadlock_is_found_by_the_simulator_at_once_and_named():
    """Every rank receives, nobody sends: the strict simulator sees it without waiting for a timeout, and the
    feedback names the case: the function, the world size and the lengths (issue 58: "world size 2" alone).
    Planted, seen failing: Context.simulate's message back to "world size {G}: deadlock"."""
    report = grading.check_ring_all_reduce(_stuck_rs, _good_ag, timeout=60.0, verbose=False)
    first = report.results[0]
    assert first.status == "deadlock" and first.earned == 0, report.table()
    assert "reduce_scatter, world size 2, lengths 8 and 9: deadlock" in first.feedback  # the case, not only G
    assert "rank 0 waits in recv from rank 1, 8 elements; rank 1 waits in recv from rank 0, 8 elements" in first.feedback
    assert first.seconds < 60  # liveness only: far below the check's 60 s timeout, which is never waited for


def _stuck_outside_the_simulator_rs(tensor, group=None):
    rank = dist.get_rank()  # torch.distributed's own rank: the simulator cannot run this, real ranks can
    comm.recv(tensor, (rank - 1) % dist.get_world_size())  # nobody sends
    return tensor


def test_a_deadlock_on_real_ranks_fails_after_the_timeout_and_skips_the_rest():
    start = time.perf_counter()
    report = grading.check_ring_all_reduce(_stuck_outside_the_simulator_rs, _good_ag, timeout=6.0, verbose=False)
    first = report.results[0]
    assert first.status == "timeout", report.table()
    assert "still running after 6 s, stopped: rank 0 waits in recv from rank 1, 8 elements" in first.feedback
    assert {r.status for r in report.results[1:]} <= {"skipped", "pass"}
    assert report.score < report.max_score
    assert time.perf_counter() - start < 6.0 * 10  # liveness: one 6 s timeout, the rest skipped


def test_a_rank_that_gloo_aborts_is_one_line_and_no_gloo_text_is_printed():
    """In a process of its own, faulthandler on as a kernel or pytest may have it, so that everything any rank
    writes to an inherited descriptor is seen. Planted bugs: quiet_rank disabled (gloo's "terminate called"
    and Python's "Fatal Python error: Aborted" are printed) or death_summary disabled (the feedback says only
    "killed by signal SIGABRT", or a peer's "Connection reset by peer")."""
    script = ("import sys; sys.path.insert(0, 'tests/submissions/ring_allreduce'); "
              "from _real_ranks_abort import reduce_scatter; "
              "from _ring_solution import all_gather; from coursekit import grading; "
              "grading.grade('01_ring_allreduce', only='reduce_scatter_correct', reduce_scatter=reduce_scatter, "
              "all_gather=all_gather)")
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=dict(os.environ, MPLBACKEND="agg"))
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    assert "reduce_scatter_correct    0/3    fail" in done.stdout, printed
    # the same abort in each of the check's 6 cases (it always sends 5 elements for 4): said once, for all of them
    assert ("every case (6 of them): rank 1 was aborted by gloo: a message of 20 bytes arrived where the receive "
            "posted for it holds 16 bytes: sender and receiver disagree on a length") in done.stdout, printed
    for noise in ("terminate called", "EnforceNotMet", "Connection reset by peer", "Connection closed by peer",
                  "Fatal Python error", "SIGABRT"):
        assert noise not in printed, f"{noise!r} was printed:\n{printed}"


def test_grading_leaves_torch_distributed_as_it_was():
    """The simulator's ranks are threads of this process, each inside forbid_torch_collectives. Planted bug
    (seen): each thread saving and restoring the functions itself left them switched off for good."""
    from coursekit.grading import FORBIDDEN

    before = {name: getattr(dist, name) for name in FORBIDDEN if hasattr(dist, name)}
    for _ in range(3):
        grading.grade(RING, only=["reduce_scatter_correct", "all_reduce_bit_identical"], reduce_scatter=_good_rs,
                      all_gather=_good_ag, verbose=False)
    assert {name: getattr(dist, name) for name in before} == before


def test_report_file_keeps_the_latest_result_of_each_check(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    monkeypatch.setenv(grading.REPORT_ENV, str(path))
    grading.grade(RING, only="reduce_scatter_correct", reduce_scatter=_todo_rs, all_gather=_todo_ag,
                  verbose=False)
    grading.grade(RING, only="reduce_scatter_correct", reduce_scatter=_good_rs, all_gather=_todo_ag,
                  verbose=False)
    saved = json.loads(path.read_text())[RING]
    assert saved["reduce_scatter_correct"]["status"] == "pass"


def test_unknown_exercise_or_check_is_a_clear_error():
    with pytest.raises(ValueError, match="known exercises"):
        grading.grade("99_nope")
    with pytest.raises(ValueError, match="unknown checks"):
        grading.grade(RING, only="nope")


def _cli(path):
    env = dict(os.environ, MPLBACKEND="agg")
    return subprocess.run([sys.executable, "-m", "coursekit", "grade", str(path)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)


@pytest.mark.notebook
def test_cli_grades_an_untouched_exercise_zero_without_touching_it():
    """The CLI on exercise 04's notebook as handed out. (Its solution's full marks through the CLI are
    tests/test_grading_install.py's, in a learner's install; every solution's score table is held to the
    committed one by tests/notebook_support.py.)"""
    exercise = ROOT / "exercises" / "04_pipeline_schedule.ipynb"
    before = exercise.read_bytes()
    todo = _cli(exercise)
    assert todo.returncode == 1, todo.stdout + todo.stderr
    assert "0 / 10 points" in todo.stdout and "not done" in todo.stdout
    assert exercise.read_bytes() == before
    # the kernel's own start-up warnings are not for a learner's eyes
    assert "IPKernelApp" not in todo.stdout + todo.stderr, todo.stdout + todo.stderr


@pytest.mark.notebook
def test_cli_keeps_the_kernels_log_from_the_learner(tmp_path):
    """An error the kernel logs about itself (one grading printed "[IPKernelApp] ERROR | KeyboardInterrupt caught
    in kernel." after its score table, issue 42 item 7) is not the learner's: only the cells' outputs and the
    table are shown. Planted, seen failing: the kernel's log level back at ERROR -> the line in stderr."""
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'get_ipython().kernel.log.error("KeyboardInterrupt caught in kernel.")\nprint("the learner\'s line")')])
    path = tmp_path / "04_pipeline_schedule.ipynb"
    nbformat.write(notebook, path)
    graded = _cli(path)
    assert "IPKernelApp" not in graded.stdout + graded.stderr, graded.stdout + graded.stderr
    assert "0 / 10 points" in graded.stdout, graded.stdout + graded.stderr


def test_cli_missing_notebook_or_unknown_exercise(capsys):
    assert grade_notebook([str(ROOT / "exercises" / "nope.ipynb")]) == 2
    assert grade_notebook([str(ROOT / "README.md")]) == 2  # no checks for an exercise called "README"
    assert "no such notebook" in capsys.readouterr().err


def test_cli_help_and_options_in_any_order(capsys):
    """``coursekit -h`` and ``coursekit grade -h`` print help; grade's options work before the notebook and after
    it (issue 58: ``grade -h`` and ``grade --timeout 120 NB`` were "unrecognized arguments", only options after
    the notebook reached grade). Planted, seen failing: main's REMAINDER subparser for grade put back ->
    "coursekit: error: unrecognized arguments: -h" and SystemExit 2."""
    for argv, usage in ((["-h"], "usage: coursekit [-h] {doctor,grade,train}"),
                        (["grade", "-h"], "usage: coursekit grade [-h]")):
        with pytest.raises(SystemExit) as done:
            main(argv)
        said = capsys.readouterr()
        assert done.value.code == 0 and usage in said.out, said.out + said.err
    readme = str(ROOT / "README.md")  # a file, but no exercise of that name: only an option read names 99_nope
    for argv in (["grade", "--exercise", "99_nope", readme], ["grade", readme, "--exercise", "99_nope"],
                 ["grade", "--timeout", "120", "--exercise", "99_nope", readme],
                 ["grade", readme, "--timeout", "120", "--exercise", "99_nope"]):
        assert main(argv) == 2, argv
        assert "no checks for exercise '99_nope'" in capsys.readouterr().err, argv


@pytest.mark.parametrize("exercise", sorted(grading.EXERCISE_MODULES))
def test_each_exercise_and_each_check_is_registered_once(exercise):
    module = importlib.import_module(grading.EXERCISE_MODULES[exercise])
    names = [c.name for c in grading.checks_for(exercise)]
    importlib.reload(module)  # importing the module again (a reload, a notebook re-run) replaces, never adds
    again = grading.checks_for(exercise)
    assert [c.name for c in again] == names == [c.name for c in grading.checks_for(exercise)]
    assert len(set(names)) == len(names) and names
    assert all(c.fn is getattr(module, c.name) for c in again)  # the reloaded functions, not stale ones
    assert all(c.exercise == exercise for c in again)
    assert [e for e, m in grading.EXERCISE_MODULES.items() if m == module.__name__] == [exercise]


def test_redefining_a_check_replaces_it_in_place():
    exercise = "99_registry_test"

    @grading.check(exercise)
    def first(submission, ctx):
        pass

    @grading.check(exercise)
    def second(submission, ctx):
        pass

    @grading.check(exercise, points=5, name="first")
    def first_again(submission, ctx):
        pass

    try:
        checks = grading.checks_for(exercise)
        assert [(c.name, c.points) for c in checks] == [("first", 5), ("second", 1)]
    finally:
        grading.forget(exercise)


def test_ctx_memo_runs_once_per_grading_and_remembers_a_failure():
    """Checks of one grade() call share ctx.memo's results (and its CheckFailed); the next grade() runs again.
    Planted bug: memo storing nothing -> "computed [2, 2]", not [1, 1]."""
    exercise, computed = "99_memo_test", [0, 0]

    def compute(index):
        computed[index] += 1
        if index == 1:
            raise grading.CheckFailed("wrong once, wrong for every check")
        return "run"

    @grading.check(exercise)
    def first(submission, ctx):
        assert ctx.memo("ok", lambda: compute(0)) == "run"
        ctx.memo("failed", lambda: compute(1))

    @grading.check(exercise)
    def second(submission, ctx):
        assert ctx.memo("ok", lambda: compute(0)) == "run"
        ctx.memo("failed", lambda: compute(1))

    try:
        report = grading.grade(exercise, verbose=False)
        assert computed == [1, 1], f"computed {computed}"
        assert [r.feedback for r in report.results] == ["wrong once, wrong for every check"] * 2
        grading.grade(exercise, verbose=False)
        assert computed == [2, 2], f"computed {computed}"
    finally:
        grading.forget(exercise)


def test_chapter_01_names_stay_importable_from_grading():
    from coursekit.grading import check_ring_all_reduce

    assert check_ring_all_reduce is grading.check_ring_all_reduce and grading.RING == RING == "01_ring_allreduce"
    with pytest.raises(AttributeError):
        grading.no_such_name


@pytest.mark.parametrize("exercise", sorted(grading.EXERCISES))
def test_each_exercise_has_its_entry_point_taking_its_parts(exercise):
    """``check_<exercise>(part, ..., **options)`` in coursekit.grading, one parameter per part the learner writes."""
    spec = grading.EXERCISES[exercise]
    entry = getattr(grading, spec.entry)
    parameters = inspect.signature(entry).parameters
    assert list(parameters) == [*spec.parts, "options"] and entry.__name__ == spec.entry
    assert all(parameters[part].default is None for part in spec.parts)


def test_an_entry_point_grades_a_part_not_given_as_not_done():
    """None (or nothing) for a part: "not done", zero points, no crash; a part given is graded (exercise 04:
    an attempt the validator accepts, written as a learner would -- the library's own 1F1B is held back)."""
    one_f_one_b = load("pipeline_schedule", "no_warmup").one_f_one_b

    report = grading.check_pipeline_schedule(verbose=False, only=["valid_schedule", "peak_activations"])
    assert [r.status for r in report.results] == ["not done", "not done"] and report.score == 0, report.table()
    report = grading.check_pipeline_schedule(one_f_one_b=one_f_one_b, verbose=False, only="valid_schedule")
    assert report.full_marks, report.table()
    with pytest.raises(TypeError):
        grading.check_pipeline_schedule(one_f_one_b, None, one_f_one_b)  # two parts: 1F1B and the optional stretch
