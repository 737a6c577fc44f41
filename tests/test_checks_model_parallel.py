"""Exercise 03's grader: the solution gets full marks, the stub zero, right variants full marks, and each check
fails on the mistake it is there for. (The committed wrong attempts with their scores and feedback:
tests/submissions/model_parallel/, graded by tests/test_grading_submissions.py; each check of this exercise is seen
failing there: no requires_grad_ and the gradient to the wrong rank fail the gradient checks, the extra
message traffic_pattern, the attached activations activations_sent_detached, zero_grad per micro-batch and the
micro-batches' losses left unweighted the micro-batch cases, the activations kept detached on rank 0 the first
stage's gradients (its backward has no graph), the gradient received first and every forward sent before the first
gradient deadlocks named by the simulator, and peers named by global rank the mesh's second pipeline.)"""

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
two_stage_step, step_with = _solution.two_stage_step, _solution.two_stage_step_with


def test_solution_full_marks_and_stub_zero():
    report = check_model_parallel(two_stage_step, verbose=False)
    assert report.full_marks, report.table()
    stub = check_model_parallel(verbose=False)
    assert stub.score == 0 and all(r.status == "not done" for r in stub.results), stub.table()


def gpipe_step(stage, inputs, targets, loss_fn, width, micro_batches, group=None):
    """Every forward first, then every backward (GPipe's order), with isend/irecv, peers by global rank; the
    receive buffer made to require grad before the receive."""
    xs, ys = inputs.tensor_split(micro_batches), targets.tensor_split(micro_batches)
    if comm.get_rank(group) == 0:
        kept = [stage(x) for x in xs]
        sends = [comm.isend(a.detach(), dst=1) for a in kept]
        for activations in kept:
            grad = torch.empty_like(activations)
            comm.irecv(grad, src=1).wait()
            activations.backward(grad)
        for work in sends:
            work.wait()
        return None
    total, sends = torch.zeros(()), []
    for y in ys:
        received = torch.empty(len(y), width, requires_grad=True)
        comm.irecv(received, src=0).wait()
        loss = loss_fn(stage(received), y) * len(y) / len(targets)
        loss.backward()
        sends.append(comm.isend(received.grad, dst=0))
        total = total + loss.detach()
    for work in sends:
        work.wait()
    return total


def test_a_right_variant_earns_full_marks():
    """GPipe's order with isend/irecv, and the receive buffer made to require grad before the receive (gloo writes
    into it; the simulator alone would refuse an in-place copy into such a leaf: the watch layer makes both agree),
    returning a 0-d tensor. Planted bug: Watch.irecv (coursekit/grading/watch.py) passing the tensor itself instead
    of tensor.detach() -> this variant fails in the simulator ("a leaf Variable that requires grad is being used in
    an in-place operation")."""
    report = check_model_parallel(gpipe_step, verbose=False,
                                  only=["gradients_of_both_stages", "training_equals_one_process",
                                        "activations_reach_the_loss"])
    assert report.full_marks, report.table()


def test_a_last_stage_that_ignores_what_arrived_fails_the_loss_check():
    """Planted mistake: the last stage computes on a fresh tensor, not on the activations it received (the shapes
    agree, so nothing crashes): the loss differs from one process, and the feedback says on what it should have
    computed."""
    def step(stage, inputs, targets, loss_fn, width, micro_batches, group=None):
        if comm.get_rank() == 0:
            return two_stage_step(stage, inputs, targets, loss_fn, width, micro_batches)
        comm.recv(torch.empty(len(targets), width), src=0)
        received = torch.zeros(len(targets), width, requires_grad=True)   # the mistake
        loss = loss_fn(stage(received), targets)
        loss.backward()
        comm.send(received.grad, dst=0)
        return loss

    report = check_model_parallel(step, verbose=False, only=["activations_reach_the_loss"])
    result = report.results[0]
    assert result.earned == 0, report.table()
    assert "it did not compute the output layer on the activations the first stage computed" in result.feedback


def test_the_loss_returned_is_checked_whatever_its_form():
    """A last stage that returns the loss as a 0-d tensor returns the loss: full marks on the loss check (the
    solution returns a float); one that returns the output layer's logits does not, and the feedback says what came
    back. (Returning nothing, and a loss computed without the loss_fn given: tests/submissions/model_parallel/
    returns_nothing.py, own_cross_entropy.py.) Planted bug: returned_value without its branch for 0-d tensors ->
    the tensor fails ("it returned a tensor of shape ()")."""
    def step_returning(returned):
        def step(stage, inputs, targets, loss_fn, width, micro_batches, group=None):
            if comm.get_rank() == 0:
                return two_stage_step(stage, inputs, targets, loss_fn, width, micro_batches)
            received = torch.empty(len(targets), width)
            comm.recv(received, src=0)
            received.requires_grad_()
            output = stage(received)
            loss = loss_fn(output, targets)
            loss.backward()
            comm.send(received.grad, dst=0)
            return returned(loss, output)
        return step

    report = check_model_parallel(step_returning(lambda loss, output: loss), verbose=False,
                                  only=["activations_reach_the_loss"])
    assert report.full_marks, report.table()
    report = check_model_parallel(step_returning(lambda loss, output: output), verbose=False,
                                  only=["activations_reach_the_loss"])
    result = report.results[0]
    assert result.earned == 0, report.table()
    assert "the last stage must return the batch's loss: it returned a tensor of shape (12, 4)" in result.feedback


def test_the_loss_check_stops_rank_0_after_its_send_whatever_its_backward_does():
    """A first stage whose backward fails after a right forward (``activations.backward()`` without the gradient:
    "grad can be implicitly created only for scalar outputs") still earns the loss check: the last stage's loss is
    right. The check reruns the forward alone when the whole step stopped; there rank 0 stops right after its send.
    The gradients check still fails, on it."""
    def step(stage, inputs, targets, loss_fn, width, micro_batches, group=None):
        if comm.get_rank() == 1:
            return two_stage_step(stage, inputs, targets, loss_fn, width, micro_batches)
        activations = stage(inputs)
        comm.send(activations.detach(), dst=1)
        grad = torch.empty_like(activations)
        comm.recv(grad, src=1)
        activations.backward()                  # the mistake: the gradient received is not used

    report = check_model_parallel(step, verbose=False, only=["activations_reach_the_loss", "gradients_of_both_stages"])
    loss, grads = report.results
    assert loss.earned == 2, report.table()
    assert grads.earned == 0 and "grad can be implicitly created only for scalar outputs" in grads.feedback, \
        report.table()


# receives_gradient_first.py (tests/submissions/model_parallel/) as a learner writes it in the notebook's cell
_STUCK_STEP = """def two_stage_step(stage, inputs, targets, loss_fn, width, micro_batches, group=None):
    if comm.get_rank(group) == 0:
        for x in inputs.tensor_split(micro_batches):
            activations = stage(x)
            grad = torch.empty_like(activations)
            comm.recv(grad, group=group, group_src=1)     # the mistake: waits for the gradient before sending
            comm.send(activations.detach(), group=group, group_dst=1)
            activations.backward(grad)
        return None
    total = 0.0
    for y in targets.tensor_split(micro_batches):
        received = torch.empty(len(y), width, requires_grad=True)
        comm.recv(received, group=group, group_src=0)
        loss = loss_fn(stage(received), y) * len(y) / len(targets)
        loss.backward()
        comm.send(received.grad, group=group, group_dst=0)
        total += loss.item()
    return total
"""


def _attempt_notebook(path: Path, step_source: str) -> None:
    """The exercise notebook with the learner's cell: ``step_source``."""
    notebook = json.loads((ROOT / "exercises" / "03_model_parallel.ipynb").read_text())
    cell = next(c for c in notebook["cells"] if "".join(c["source"]).startswith("def two_stage_step("))
    cell["source"] = step_source
    path.write_text(json.dumps(notebook))


@pytest.mark.notebook
def test_coursekit_grade_names_a_deadlock_without_waiting_for_the_timeout(tmp_path, capsys):
    """``coursekit grade`` on an exercise notebook whose first stage waits for the gradient before sending: every
    check names the deadlock (the simulator's words, rank 0 waiting in recv from rank 1). Issue 22, item 3: the
    notebook's own "Try it" cell waited CHECK_TIMEOUT (30 s) on real ranks before the grading cell ran; it now runs
    the simulator first, which names the deadlock at once. The time it took is printed (pytest -s), never
    asserted: it depends on the machine (measured in the commit that added this test)."""
    notebook = tmp_path / "03_model_parallel.ipynb"
    _attempt_notebook(notebook, _STUCK_STEP)
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
