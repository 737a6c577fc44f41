"""``coursekit.show``: a chapter shows the library's own code, and never an exercise's answer."""

from __future__ import annotations

import inspect

import pytest

import coursekit
from coursekit.collectives import ring
from coursekit.parallel.pipeline import schedules
from coursekit.parallel.tensor import core
from coursekit.source import AnswerNotShown


def test_show_renders_what_runs():
    shown = coursekit.show(core.ParallelSelfAttention)
    assert repr(shown) == inspect.getsource(core.ParallelSelfAttention)
    html = shown._repr_html_()
    assert "<span" in html and "ParallelSelfAttention" in html  # highlighted in a notebook
    assert repr(coursekit.show(coursekit.comm.phase)) == inspect.getsource(coursekit.comm.phase)


@pytest.mark.parametrize("answer, exercise", [(ring.ring_reduce_scatter, "01_ring_allreduce"),
                                              (ring.ring_all_reduce, "01_ring_allreduce"),
                                              (ring, "01_ring_allreduce"),      # its helpers are the answer's body
                                              (schedules, "04_pipeline_schedule"),
                                              (core.RowParallelLinear, "05_tensor_parallel"),
                                              (core.ColumnParallelLinear, "05_tensor_parallel"),
                                              (core._Copy, "05_tensor_parallel"),      # f
                                              (core._Reduce, "05_tensor_parallel"),    # g
                                              (core.copy_to_parallel_region, "05_tensor_parallel"),
                                              (core, "05_tensor_parallel")])
def test_an_exercise_answer_is_never_shown(answer, exercise):
    """Planted, seen failing: no check (the wrapped function's source -- the answer -- was rendered)."""
    with pytest.raises(AnswerNotShown, match=rf"answer to exercise {exercise}: it is not shown here\. Write it in "
                                             rf"exercises/{exercise}\.ipynb"):
        coursekit.show(answer)


def test_chapter_05_shows_the_pair_beside_f_and_g():
    """Exercise 05 asks for f and g (issue 58: the whole mechanism), so chapter 05 shows the neighbouring pair of
    operators, gather forward / slice backward and the reverse, and never f or g (listed with the answers above)."""
    assert "_all_gather(tensor, dim, sizes, group)" in repr(coursekit.show(core._Gather))
    assert "_all_gather(grad, ctx.dim, ctx.sizes, ctx.group)" in repr(coursekit.show(core._Split))


def test_show_of_something_without_source_says_what_it_takes():
    with pytest.raises(TypeError, match="show\\(\\) renders a function, class, method or module"):
        coursekit.show(3)


def test_every_answer_listed_by_name_exists():
    """A renamed answer would drop out of the list silently; planted, seen failing: ``RowParallelLinear`` renamed."""
    from coursekit.answers import ANSWERS, answer_of, resolve

    for qualified, (exercise, _) in ANSWERS.items():
        obj = resolve(qualified)
        assert obj is not None, f"{qualified} (an answer to {exercise}) does not exist: update coursekit.answers"
        assert answer_of(obj) == exercise
