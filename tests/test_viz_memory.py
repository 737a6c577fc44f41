"""Memory bars and the explorer widget (drawn at once, headless)."""

import matplotlib

matplotlib.use("agg")

from coursekit.viz.memory import draw_memory, draw_memory_formula
from coursekit.widgets.memory import describe, memory_explorer


def test_bars_stack_to_the_totals():
    fig = draw_memory({"DP": {"params": 40, "grads": 40, "optimizer": 80},
                       "ZeRO-3": {"params": 10, "grads": 10, "optimizer": 20}}, formula={"DP": 160, "ZeRO-3": 40})
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert heights == [40, 40, 80, 10, 10, 20]
    assert [t.get_text() for t in ax.texts] == ["160 B", "40 B"]


def test_formula_figure_and_the_sentence():
    fig = draw_memory_formula(7.5e9, 64, "mixed", gpu_bytes=80e9, stage=3)
    assert "7.5 B parameters" in fig.axes[0].get_title()
    text = describe(7.5e9, 64, 0, "mixed", 80e9)
    assert "120 GB" in text and "does NOT fit" in text and "DP 5 B" in text
    assert "fits in 80 GB" in describe(7.5e9, 64, 3, "mixed", 80e9)


def test_explorer_draws_its_default_state_and_redraws(monkeypatch):
    import coursekit.widgets.memory as explorer

    calls = []
    real = explorer.draw_memory_formula
    monkeypatch.setattr(explorer, "draw_memory_formula", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    box = memory_explorer()
    assert len(calls) == 1  # the default state is drawn at once, without waiting for an event
    sentence = box.children[-2]
    before = sentence.value
    box.children[1].children[0].value = 3  # the stage dropdown: ZeRO-3
    assert len(calls) == 2 and calls[-1][1]["stage"] == 3
    assert sentence.value != before and sentence.value.startswith("ZeRO-3")
