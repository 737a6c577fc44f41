"""An exercise's untouched stub is reported "not done" at once: no ranks are started to watch it raise.

(Untouched exercise 02 took 83 s to grade 0/15, each check starting ranks to find NotImplementedError.)
"""

import pytest

from coursekit import grading
from coursekit.grading import context
from coursekit.grading.feedback import NOT_IMPLEMENTED, is_stub


def stub(model, group=None):
    """As an exercise ships it: set-up lines the learner keeps, then the raise."""
    world_size = 2
    # YOUR CODE HERE
    raise NotImplementedError(f"average over {world_size} ranks")


def bare_stub():
    raise NotImplementedError


def half_written(model, group=None):
    def hook(grad):
        return grad / 2
    model.register_hook(hook)
    raise NotImplementedError("the rest")


def returns_first(model, group=None):
    if model is None:
        return None
    raise NotImplementedError


def raises_only_sometimes(model, group=None):
    if model:
        raise NotImplementedError
    return model


def generator():
    yield 1
    raise NotImplementedError


@pytest.mark.parametrize("function, expected", [
    (stub, True), (bare_stub, True), (half_written, True),  # every call that ends, ends in NotImplementedError
    (returns_first, False), (raises_only_sometimes, False), (generator, False),
    (lambda: None, False), (print, False), (grading.Context, False),
])
def test_is_stub(function, expected):
    assert is_stub(function) is expected


def test_a_stub_is_not_done_without_starting_ranks(monkeypatch):
    started = []
    monkeypatch.setattr(context, "launch", lambda *a, **k: started.append("launch"))
    monkeypatch.setattr(context, "simulate", lambda *a, **k: started.append("simulate"))
    report = grading.grade("02_data_parallel", verbose=False, attach_gradient_averaging=stub,
                           reduce_scatter_gradients=stub)
    assert not started, f"ranks were started for a stub: {started}"
    assert report.score == 0 and {r.status for r in report.results} == {"not done"}, report.results
    assert {r.feedback for r in report.results} == {NOT_IMPLEMENTED}


def test_a_timeout_inside_torch_distributed_is_described_as_a_wait_there():
    """The launcher's report of a rank blocked in a torch.distributed call (no coursekit note) becomes "waits
    inside torch.distributed.all_reduce at ...", not "busy outside coursekit.comm"; a busy rank stays busy, and
    the report's other threads stay out of the feedback. Planted bug, seen failing: every rank without a note
    called busy (the old wording)."""
    from coursekit.grading.feedback import describe_timeout
    from coursekit.launch import LaunchTimeout

    error = LaunchTimeout(5.0, {
        0: "inside torch.distributed.all_reduce (not a coursekit call: no note of what it waits on); "
           "at sync (attempt.py:7) <- step (attempt.py:12); its other threads at _work (units.py:86)",
        1: "busy (not inside a communication call); at forward (linear.py:134)"})
    assert describe_timeout(error) == ("rank 0 waits inside torch.distributed.all_reduce at sync (attempt.py:7) <- "
                                       "step (attempt.py:12); rank 1 is busy outside coursekit.comm at forward "
                                       "(linear.py:134)")
