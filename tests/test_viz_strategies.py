import pytest

from coursekit.viz.strategies import draw_strategies, layout


@pytest.mark.parametrize("n_gpus, n_layers, expected", [(2, 4, [0, 0, 1, 1]), (3, 4, [0, 0, 1, 2]), (1, 3, [0, 0, 0])])
def test_model_parallel_gives_each_gpu_contiguous_layers(n_gpus, n_layers, expected):
    assert layout("model", n_gpus, n_layers)["layers"] == expected


def test_data_parallel_splits_the_batch_and_copies_the_model():
    plan = layout("data", 3, n_layers=4, batch=8)
    assert plan["layers"] == [None] * 4
    assert [plan["batch"].count(g) for g in range(3)] == [3, 3, 2]


def test_pipeline_schedule_has_the_gpipe_bubble():
    plan = layout("pipeline", 4, n_layers=4, micro_batches=4)
    steps = {(stage, step) for stage, step, _ in plan["schedule"]}
    total = 4 * (4 + 4 - 1)
    assert len(steps) == 16 and total - len(steps) == 4 * 3  # (p-1) idle slots per stage


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
