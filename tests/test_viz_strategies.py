import pytest

from coursekit.viz.strategies import draw_strategies, layout


@pytest.mark.parametrize("n_gpus, n_layers, expected", [(2, 4, [0, 0, 1, 1]), (3, 4, [0, 0, 1, 2]), (1, 3, [0, 0, 0])])
def test_model_parallel_gives_each_gpu_contiguous_layers(n_gpus, n_layers, expected):
    assert layout("model", n_gpus, n_layers)["layers"] == expected


def test_data_parallel_splits_the_batch_and_copies_the_model():
    plan = layout("data", 3, n_layers=4, batch=8)
    assert plan["layers"] == [None] * 4
    assert [plan["batch"].count(g) for g in range(3)] == [3, 3, 2]


def _pipeline_boxes(p: int, m: int) -> dict[str, tuple[int, float, float]]:
    """What the strategy map's pipeline panel draws: action -> (GPU row, start, end), read off the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig = draw_strategies(n_gpus=p, n_layers=max(4, p), micro_batches=m)
    ax = fig.axes[3]
    boxes = {r.get_gid(): (p - 1 - round(r.get_y()), r.get_x(), r.get_x() + r.get_width() + 0.05)
             for r in ax.patches if isinstance(r, Rectangle) and r.get_gid()}
    plt.close(fig)
    return boxes


@pytest.mark.parametrize("p, m", [(4, 4), (2, 4), (3, 5), (1, 3), (4, 2)])
def test_pipeline_panel_draws_forward_and_backward_with_the_real_bubble(p, m):
    """Read off the drawn boxes, against the definition and (p−1)/(m+p−1) (issue 10, item 5). Planted bugs, each
    seen failing: the old panel, forwards only ('no backward drawn'); every stage starting at time 0 (no bubble:
    'F0@s1 starts before F0@s0 ends'); backward boxes one unit wide (white area '0.6 != 0.4286' at p=4, m=4)."""
    boxes = _pipeline_boxes(p, m)
    assert sorted(boxes) == sorted(f"{op}{i}@s{s}" for op in "FB" for s in range(p) for i in range(m)), \
        "every GPU runs F and B of every micro-batch once" + ("" if any(k[0] == "B" for k in boxes) else
                                                             ": no backward drawn")
    for name, (gpu, start, end) in boxes.items():
        op, (i, s) = name[0], map(int, name[1:].split("@s"))
        assert gpu == s, f"{name} drawn on GPU{gpu + 1}"
        before = ([f"F{i}@s{s - 1}"] if op == "F" and s else []) + \
                 ([f"F{i}@s{s}"] + ([f"B{i}@s{s + 1}"] if s < p - 1 else []) if op == "B" else [])
        for need in before:
            assert start >= boxes[need][2] - 1e-9, f"{name} starts before {need} ends"
    for gpu in range(p):  # one thing at a time per GPU
        spans = sorted((start, end) for g, start, end in boxes.values() if g == gpu)
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:])), f"GPU{gpu + 1} runs two things at once"
    makespan = max(end for _, _, end in boxes.values())
    busy = sum(end - start for _, start, end in boxes.values())
    assert 1 - busy / (p * makespan) == pytest.approx((p - 1) / (m + p - 1)), "1F1B's bubble: (p-1)/(m+p-1)"
    if p > 1 and m > 1:  # P7: while some micro-batches go forward, others' gradients flow backward
        assert any(op_a == "F" and op_b == "B" and sa < eb and sb < ea
                   for a, (ga, sa, ea) in boxes.items() for b, (gb, sb, eb) in boxes.items()
                   for op_a, op_b in [(a[0], b[0])] if ga != gb)


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


def test_tensor_panel_splits_by_columns_then_by_rows():
    """Chapter 05's lesson, drawn (issue 26 §6): W1 and W3 cut into vertical stripes (output features, column
    parallel), W2 and W4 into horizontal ones (input features, row parallel), one stripe per GPU. Planted bug,
    seen failing: the old panel, every weight by columns ("W2 is split by columns")."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    assert layout("tensor", 4)["split"] == ["columns", "rows", "columns", "rows"]
    fig = draw_strategies(n_gpus=4)
    stripes = {}
    for r in fig.axes[2].patches:
        if isinstance(r, Rectangle) and r.get_gid():
            stripes.setdefault(r.get_gid().split()[0], []).append(r)
    plt.close(fig)
    for name, expected in zip(("W1", "W2", "W3", "W4"), ("columns", "rows", "columns", "rows")):
        parts = stripes.get(name, [])
        assert len(parts) == 4, f"{name}: {len(parts)} stripes for 4 GPUs"
        vertical = all(p.get_height() > p.get_width() for p in parts)
        got = "columns" if vertical and len({p.get_y() for p in parts}) == 1 else "rows"
        assert got == expected, f"{name} is split by {got}"


@pytest.mark.parametrize("n_gpus", [2, 4, 8])
def test_every_label_is_legible(n_gpus):
    """No text under 8 pt at any size the widget offers (issue 43: legible at 100%). Planted bug, seen failing:
    the pipeline boxes' labels back at 6 pt."""
    import matplotlib.pyplot as plt
    import matplotlib.text

    fig = draw_strategies(n_gpus=n_gpus)
    small = sorted({(t.get_fontsize(), t.get_text()[:20]) for t in fig.findobj(matplotlib.text.Text)
                    if t.get_text() and t.get_fontsize() < 8})
    assert not small, f"text under 8 pt at {n_gpus} GPUs: {small[:5]}"
    plt.close(fig)
