"""Exercise 03's grader: the solution gets full marks, the stub zero, right variants full marks, and each check
fails on the mistake it is there for. (The committed wrong attempts with their scores and feedback:
tests/submissions/model_parallel/, graded by tests/test_grading_submissions.py; each check of this exercise is seen
failing there: no requires_grad_ and the gradient to the wrong rank fail the gradient checks, the extra
message traffic_pattern, the attached activations activations_sent_detached, zero_grad per call the
micro-batch cases, the activations kept detached on rank 0 the first stage's gradients (its backward has no graph),
and the gradient received first is a deadlock named by the simulator.)"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from grading_support import load

from coursekit import comm
from coursekit.grading import check_model_parallel

ROOT = Path(__file__).resolve().parents[1]
_solution = load("model_parallel", "_mp_solution")
first_stage, second_stage = _solution.first_stage, _solution.second_stage


def test_solution_full_marks_and_stub_zero():
    report = check_model_parallel(first_stage, second_stage, verbose=False)
    assert report.full_marks, report.table()
    stub = check_model_parallel(verbose=False)
    assert stub.score == 0 and all(r.status == "not done" for r in stub.results), stub.table()


def test_a_right_variant_earns_full_marks():
    """isend/irecv instead of send/recv, and the receive buffer made to require grad before the receive (gloo
    writes into it; the simulator alone would refuse an in-place copy into such a leaf: the watch layer makes
    both agree). Planted bug: Watch.irecv (coursekit/grading/watch.py) passing the tensor itself instead of tensor.detach() -> this variant
    fails in the simulator ("a leaf Variable that requires grad is being used in an in-place operation")."""
    def first(stage, inputs):
        activations = stage(inputs)
        work = comm.isend(activations.detach(), dst=1)
        grad = torch.empty_like(activations)
        comm.irecv(grad, src=1).wait()
        work.wait()
        activations.backward(grad)

    def second(stage, targets, loss_fn, shape):
        inputs = torch.empty(shape, requires_grad=True)
        comm.irecv(inputs, src=0).wait()
        loss = loss_fn(stage(inputs), targets)
        loss.backward()
        comm.isend(inputs.grad, dst=0).wait()
        return loss

    report = check_model_parallel(first, second, verbose=False,
                                  only=["gradients_of_both_stages", "training_equals_one_process"])
    assert report.full_marks, report.table()


def test_a_second_stage_that_ignores_what_arrived_fails_the_loss_check():
    """Planted mistake: the second stage computes on a fresh tensor, not on the activations it received (the
    shapes agree, so nothing crashes): the loss differs from one process, and the feedback says on what rank 1
    should have computed."""
    def second(stage, targets, loss_fn, shape):
        comm.recv(torch.empty(shape), src=0)
        inputs = torch.zeros(shape, requires_grad=True)   # the mistake
        loss = loss_fn(stage(inputs), targets)
        loss.backward()
        comm.send(inputs.grad, dst=0)
        return loss

    report = check_model_parallel(first_stage, second, verbose=False, only=["activations_reach_the_loss"])
    result = report.results[0]
    assert result.earned == 0, report.table()
    assert "did not compute the output layer on the activations rank 0 computed" in result.feedback


def test_the_loss_returned_is_checked_whatever_its_form():
    """A second stage that returns loss.item() (a float) returns the loss: full marks on the loss check; one that
    returns the output layer's logits does not, and the feedback says what came back. (Returning nothing, and a
    loss computed without the loss_fn given: tests/submissions/model_parallel/returns_nothing.py, own_cross_entropy.py.)
    Planted bug: returned_value without its branch for Python numbers -> loss.item() fails ("it returned a float")."""
    def second_with(returned):
        def second(stage, targets, loss_fn, shape):
            inputs = torch.empty(shape)
            comm.recv(inputs, src=0)
            inputs.requires_grad_()
            output = stage(inputs)
            loss = loss_fn(output, targets)
            loss.backward()
            comm.send(inputs.grad, dst=0)
            return returned(loss, output)
        return second

    report = check_model_parallel(first_stage, second_with(lambda loss, output: loss.item()), verbose=False,
                                  only=["activations_reach_the_loss"])
    assert report.full_marks, report.table()
    report = check_model_parallel(first_stage, second_with(lambda loss, output: output), verbose=False,
                                  only=["activations_reach_the_loss"])
    result = report.results[0]
    assert result.earned == 0, report.table()
    assert "second_stage must return the loss: it returned a tensor of shape (12, 4)" in result.feedback


def test_the_loss_check_stops_rank_0_after_its_send_whatever_its_backward_does():
    """A first stage whose backward fails after a right forward (``activations.backward()`` without the gradient:
    "grad can be implicitly created only for scalar outputs") still earns the loss check: rank 1's loss is right.
    The check reruns the forward alone when the whole step stopped; there rank 0 stops right after its send.
    Seen failing before the change (issue 22, item 2): that rerun sent rank 0 zeros, rank 0 ran the same failing
    backward, and the loss check earned 0 with the raw RuntimeError. The gradients check still fails, on it."""
    def first(stage, inputs):
        activations = stage(inputs)
        comm.send(activations.detach(), dst=1)
        grad = torch.empty_like(activations)
        comm.recv(grad, src=1)
        activations.backward()                  # the mistake: the gradient received is not used

    report = check_model_parallel(first, second_stage, verbose=False,
                                  only=["activations_reach_the_loss", "gradients_of_both_stages"])
    loss, grads = report.results
    assert loss.earned == 2, report.table()
    assert grads.earned == 0 and "grad can be implicitly created only for scalar outputs" in grads.feedback, \
        report.table()


# receives_gradient_first.py (tests/submissions/model_parallel/) as a learner writes it in the notebook's cell
_STUCK_FIRST_STAGE = """def first_stage(stage, inputs):
    activations = stage(inputs)
    grad = torch.empty_like(activations)
    comm.recv(grad, src=1)                       # the mistake: waits for the gradient before sending
    comm.send(activations.detach(), dst=1)
    activations.backward(grad)
"""


def _attempt_notebook(path: Path, first_stage_source: str) -> None:
    """The exercise notebook with the learner's cells: ``first_stage_source``, and the solution's second_stage."""
    def cell(notebook, name):
        return next(c for c in notebook["cells"] if "".join(c["source"]).startswith(f"def {name}("))
    notebook = json.loads((ROOT / "exercises" / "03_model_parallel.ipynb").read_text())
    solution = json.loads((ROOT / "solutions" / "03_model_parallel.ipynb").read_text())
    cell(notebook, "first_stage")["source"] = first_stage_source
    cell(notebook, "second_stage")["source"] = cell(solution, "second_stage")["source"]
    path.write_text(json.dumps(notebook))


@pytest.mark.notebook
def test_coursekit_grade_names_a_deadlock_without_waiting_for_the_timeout(tmp_path, capsys):
    """``coursekit grade`` on an exercise notebook whose first stage waits for the gradient before sending: every
    check names the deadlock (the simulator's words, rank 0 waiting in recv from rank 1). Issue 22, item 3: the
    notebook's own "Try it" cell waited CHECK_TIMEOUT (30 s) on real ranks before the grading cell ran; it now runs
    the simulator first, which names the deadlock at once. The time it took is printed (pytest -s), never
    asserted: it depends on the machine (measured in the commit that added this test)."""
    notebook = tmp_path / "03_model_parallel.ipynb"
    _attempt_notebook(notebook, _STUCK_FIRST_STAGE)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "coursekit", "grade", str(notebook)], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, MPLBACKEND="agg"), cwd=ROOT)
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\ncoursekit grade on a deadlocking exercise 03: {seconds:.1f} s")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 / 12 points" in done.stdout, done.stdout
    said = "deadlock (a send waits until its receive is posted, as on gloo): rank 0 waits in recv from rank 1"
    assert done.stdout.count(said) == 6, done.stdout  # each of the six checks names it
