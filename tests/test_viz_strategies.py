import pytest

from coursekit.viz.strategies import draw_strategies, layout


@pytest.mark.parametrize("n_gpus, n_layers, expected", [(2, 4, [0, 0, 1, 1]), (3, 4, [0, 0, 1, 2]), (1, 3, [0, 0, 0])])
def test_model_parallel_gives_each_gpu_contiguous_layers(n_gpus, n_layers, expected):
    assert layout("model", n_gpus, n_layers)["layers"] == expected


def test_data_parallel_splits_the_batch_and_copies_the_model():
    plan = layout("data", 3, n_layers=4, batch=8)
    assert plan["layers"] == [None] * 4
    assert [plan["batch"].count(g) for g in range(3)] == [3, 3, 2]


@pytest.mark.parametrize("p, m", [(4, 4), (2, 4), (3, 5), (1, 3)])
def test_pipeline_schedule_has_the_gpipe_bubble(p, m):
    """Planted bug: a schedule with no bubble (every stage starts at once) -- measured on the schedule built."""
    schedule = layout("pipeline", p, n_layers=4, micro_batches=m)["schedule"]
    when = {(stage, micro): step for stage, step, micro in schedule}
    assert sorted(when) == [(s, k) for s in range(p) for k in range(m)], "every stage runs every micro-batch once"
    for (stage, micro), step in when.items():
        if stage:  # a stage can only start a micro-batch the previous stage has finished
            assert step > when[(stage - 1, micro)], f"stage {stage} starts micro-batch {micro} before stage {stage - 1}"
    for stage in range(p):  # one forward at a time per stage
        steps = [step for (s, _), step in when.items() if s == stage]
        assert len(set(steps)) == len(steps), f"stage {stage} runs two micro-batches at once"
    makespan = max(when.values()) + 1
    idle = p * makespan - len(schedule)
    assert idle / (p * makespan) == pytest.approx((p - 1) / (m + p - 1)), "GPipe's bubble: (p-1)/(m+p-1)"


def test_bad_input_says_what_to_do():
    with pytest.raises(ValueError, match="fewer GPUs"):
        layout("model", 5, n_layers=4)
    with pytest.raises(ValueError, match="strategy must be one of"):
        layout("expert", 2)


def test_figure_changes_with_the_number_of_gpus():
    import io

    images = []
    for n in (2, 4):
        buffer = io.BytesIO()
        draw_strategies(n).savefig(buffer, format="png")
        images.append(buffer.getvalue())
    assert images[0] != images[1]
