"""What a figure draws, for the tests that check it is legible: every text with its box on the canvas."""

import matplotlib
import matplotlib.text


def drawn_texts(fig):
    """Every text the figure draws (titles, ticks inside the axis' limits only, legends, labels), each with its box
    on the canvas; and the renderer that measured them."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ticks, shown = set(), set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update({id(tick.label1), id(tick.label2)})
                if lo - 1e-9 <= tick.get_loc() <= hi + 1e-9:
                    shown.update({id(tick.label1), id(tick.label2)})
    return [(t, t.get_window_extent(renderer)) for t in fig.findobj(matplotlib.text.Text)
            if t.get_text().strip() and t.get_visible() and (id(t) not in ticks or id(t) in shown)], renderer
