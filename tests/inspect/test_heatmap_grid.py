"""The attention grid's labels: a small grid names the tokens on every panel, a large one on
its outer panels only (the bottom row's keys, the first column's queries)."""

import numpy as np
import pytest

from attnlm.inspect import heatmap


def _laid_out(monkeypatch, panels, tmp_path):
    """The figure plot_attention_panels draws, captured before it is written."""
    seen = {}

    def keep(plt, fig, path, top=1.0):
        seen["fig"], seen["top"] = fig, top
        return path

    monkeypatch.setattr(heatmap, "_save", keep)
    heatmap.plot_attention_panels(panels, list("abc"), list("xyzw"), tmp_path / "g.png", "t")
    return seen["fig"], seen["top"]


def _labels(ax, axis):
    ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in ticks]


@pytest.mark.parametrize("rows,cols", [(1, 1), (2, 2), (1, 4)])
def test_a_small_grid_names_the_tokens_on_every_panel(monkeypatch, tmp_path, rows, cols):
    m = np.full((3, 4), 0.25)
    fig, _ = _laid_out(monkeypatch, [[(f"{r}{c}", m) for c in range(cols)] for r in range(rows)],
                       tmp_path)  # fmt: skip
    for ax in fig.axes:
        assert _labels(ax, "x") == list("xyzw") and _labels(ax, "y") == list("abc")


def test_a_large_grid_names_them_on_its_outer_panels(monkeypatch, tmp_path):
    m = np.full((3, 4), 0.25)
    rows = [[(f"{r}{c}", m) for c in range(3)] for r in range(2)] + [[("20", m)]]
    fig, top = _laid_out(monkeypatch, rows, tmp_path)
    axes = np.array(fig.axes).reshape(3, 3)
    for r in range(3):
        for c in range(3):
            if r == 2 and c > 0:
                assert not axes[r][c].axison  # an empty cell of the last row
                continue
            # the bottom panel of each column: the last row's, or row 1's above an empty cell
            bottom = r == 2 or (r == 1 and c > 0)
            assert _labels(axes[r][c], "x") == (list("xyzw") if bottom else [])
            assert _labels(axes[r][c], "y") == (list("abc") if c == 0 else [])
    assert 0.9 < top < 1.0  # the title's strip
