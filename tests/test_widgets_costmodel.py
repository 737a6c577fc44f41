"""Chapter 07's strategy calculator: its default state drawn at construction and equal to the chapter's static
image, every control redraws, and the bars are the cost model's numbers.

Each test names the bug it was seen failing on (planted in coursekit/widgets/costmodel.py or
coursekit/viz/costmodel.py, then restored).
"""

import re
from pathlib import Path

import matplotlib

matplotlib.use("agg")

import coursekit.widgets.costmodel as calculator  # noqa: E402
from coursekit.costmodel import Hardware, Layout, evaluate, num_params  # noqa: E402
from coursekit.viz.costmodel import PRESETS, draw_memory_per_gpu, draw_step_time, layout_label  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "tools" / "notebook_src" / "07_choosing_a_strategy.py"


def _spy(monkeypatch):
    drawn = []
    real = calculator.draw_calculator
    monkeypatch.setattr(calculator, "draw_calculator",
                        lambda config, hardware, gpus, batch, **k: drawn.append((config, hardware, gpus, batch))
                        or real(config, hardware, gpus, batch, **k))
    return drawn


def test_default_state_is_drawn_at_construction_and_is_the_static_images(monkeypatch):
    """Planted: no redraw() at construction -> 'assert [] == [...]'; the widget's default GPUs 16 -> 32 with
    calculator_inputs' left at 16 -> the first assert (the static image would show another question)."""
    drawn = _spy(monkeypatch)
    box = calculator.strategy_calculator()
    assert drawn == [calculator.calculator_inputs()]
    config, hardware, gpus, batch = drawn[0]
    assert (config.name, config.seq_len, hardware.memory, hardware.gpus_per_node, gpus, batch) == \
        ("Llama-style 7B (GPT shape)", 4096, 80e9, 8, 16, 64)
    assert (hardware.intra_bandwidth, hardware.bandwidth) == (300e9, 25e9)
    words, image = box.children[4], box.children[5]
    assert bytes(image.value).startswith(b"\x89PNG")
    assert "6.72 B parameters" in words.value and "Fastest that fits" in words.value, words.value


def test_the_chapter_shows_the_default_state_right_before_the_widget():
    """The static image is drawn from calculator_inputs() with no arguments, in the cell right before the one
    that builds strategy_calculator() with none. Planted: the static cell given gpus=8 -> the regex fails."""
    cells = re.split(r"^# %%.*$", SOURCE.read_text(), flags=re.M)
    widget = next(i for i, cell in enumerate(cells) if "strategy_calculator()" in cell)
    assert re.search(r"draw_calculator\(\*calculator_inputs\(\)\)", cells[widget - 1]), cells[widget - 1]


def test_every_control_redraws(monkeypatch):
    """Planted: the network slider not observed -> ('network (GB/s)', 8): 'assert 8 == 9', not redrawn."""
    drawn = _spy(monkeypatch)
    box = calculator.strategy_calculator()
    controls = [c for row in box.children[:4] for c in row.children]
    image = box.children[5]
    changes = ("GPT-2 small", 1024, 32, 40, 8, 4, 150, 50)
    for i, (control, value) in enumerate(zip(controls, changes)):
        before = image.value
        control.value = value
        assert len(drawn) == i + 2, (control.description, len(drawn))
        assert image.value != before, f"{control.description}: the image did not change"
    config, hardware, gpus, batch = drawn[-1]
    assert (config.name, config.seq_len, batch, hardware.memory, gpus) == ("GPT-2 small", 1024, 32, 40e9, 8)
    assert (hardware.gpus_per_node, hardware.intra_bandwidth, hardware.bandwidth) == (4, 150e9, 50e9)
    assert "GPT-2 small: 124,475,904 parameters" in box.children[4].value


def test_presets_are_the_published_shapes():
    """GPT-2 small's 124,439,808 (tests/test_costmodel_memory.py) + the 47 padded vocabulary rows × 768; the
    Llama-style models by N = h(v + s) + L(12h² + 10h) + 2h + vh (no biases, untied head), written out here.
    Planted: the 7B preset tied -> 6,591,619,072 != 6,722,691,072."""
    assert num_params(PRESETS["course transformer"]).total == 104_832
    assert num_params(PRESETS["GPT-2 small"]).total == 124_439_808 + 47 * 768
    for name, h, layers in (("Llama-style 7B", 4096, 32), ("Llama-style 70B", 8192, 80)):
        v, s = 32000, 4096
        assert num_params(PRESETS[name]).total == h * (v + s) + layers * (12 * h * h + 10 * h) + 2 * h + v * h
    assert num_params(PRESETS["Llama-style 7B"]).total == 6_722_691_072
    g3 = PRESETS["GPT-3 175B"]
    assert (g3.hidden, g3.layers, g3.heads, g3.seq_len, g3.vocab) == (12288, 96, 96, 2048, 51200)


def test_the_bars_are_the_cost_models_numbers():
    """Bar heights = memory_per_gpu's terms (GB) and step_time's (s), the line = the GPU's memory.
    Planted: activations and buffers swapped in the stack -> the activation bar's height differs."""
    hardware = Hardware(memory=40e9)
    candidates = [evaluate(PRESETS["GPT-2 small"], layout, hardware, 64)
                  for layout in (Layout(dp=8), Layout(dp=2, tp=4, zero=3), Layout(pp=2, dp=4, micro_batches=4))]
    ax = draw_memory_per_gpu(candidates, hardware).axes[0]
    kinds = ("params", "grads", "optimizer", "activations", "buffers")
    bars = ax.patches
    for k, kind in enumerate(kinds):
        for x, c in enumerate(candidates):
            assert abs(bars[k * len(candidates) + x].get_height() - getattr(c.memory, kind) / 1e9) < 1e-12, (kind, x)
    assert [line.get_ydata()[0] for line in ax.lines] == [40.0]
    ax = draw_step_time(candidates).axes[0]
    for x, c in enumerate(candidates):
        stacked = sum(bar.get_height() for bar in ax.patches[x::len(candidates)])
        assert abs(stacked - c.seconds) < 1e-12
        assert abs(ax.patches[len(candidates) + x].get_height() - c.time.bubble) < 1e-12
    assert [t.get_text() for t in ax.get_xticklabels()] == [layout_label(c.layout) for c in candidates]
    assert layout_label(candidates[2].layout) == "pp2 dp4\n1f1b m4"
