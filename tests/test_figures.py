"""The figures' layout rules (bench/reports/plot.py): one column per kind of panel in every row,
one spelling per config, one colour per model or reference across the figure, labels that fit,
symlog wherever a reference dwarfs the models with its ticks apart, and the leaderboard's
figures with units and bands across seeds."""
from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import pytest

from bench.reports.plot import LABEL_WIDTH, gap_figure, run_groups, runs_figure
from test_leaderboard import record

CURVE = {"steps": 10, "wall_time_s": 1.0, "loss_curve": [[0, 0.7], [5, 0.6]]}


def run(task="markov", model="mamba", seed=0, clairvoyant=-0.05, **extra) -> dict:
    rec = record(task=task, model=model, seed=seed, **{"train": dict(CURVE), **extra})
    rec["per_position"]["gap.clairvoyant"] = [clairvoyant] * 8
    rec["metrics"]["roles"]["clairvoyant"] = "bound"
    return rec


@pytest.fixture
def figure():
    """Two sections: markov with a validation curve and a reference far off the models (the
    references column), lgssm with neither; clairvoyant in both."""
    watched = run(seed=0, train={**CURVE, "val_curve": [[5, 0.1]]})
    far = run(seed=1)
    far["per_position"]["gap.unigram"] = [50.0] * 8
    lgssm = [run(task="lgssm", model=m, clairvoyant=-0.02) for m in ("transformer", "mamba")]
    for rec in lgssm:
        rec["metrics"].pop("accuracy")
        rec["per_position"]["gap.unigram"] = [0.2] * 8  # near the models: no references panel
    fig = runs_figure([watched, far, *lgssm])
    yield fig
    plt.close(fig)


def rows_of(fig) -> list[list]:
    """The axes of each row, left to right, hidden ones included."""
    ys = sorted({round(ax.get_position().y0, 6) for ax in fig.axes}, reverse=True)
    return [sorted((ax for ax in fig.axes if round(ax.get_position().y0, 6) == y),
                   key=lambda ax: ax.get_position().x0) for y in ys]


def test_a_kind_of_panel_has_one_column_in_every_row(figure):
    """Column 2 showed validation by step in one row and the gap by position in the next."""
    rows = rows_of(figure)
    assert [len(row) for row in rows] == [4, 4]
    kinds = [[ax.get_ylabel().replace("\n", " ").split(" (")[0] if ax.get_visible() else None
              for ax in row] for row in rows]
    markov, lgssm = (kinds if rows[0][0].get_title(loc="left").startswith("markov")
                     else kinds[::-1])
    assert markov[1].startswith("validation") and lgssm[1] is None  # the column stays empty
    assert markov[2] == lgssm[2] == "gap to bayes"
    assert markov[3].startswith("gap to bayes") and lgssm[3] is None


def test_a_name_has_one_colour_across_the_figure(figure):
    """clairvoyant was green in one row and orange, the transformer's colour, in the next."""
    colours: dict[str, set] = {}
    for ax in figure.axes:
        for line in ax.lines:
            if not line.get_label().startswith("_"):
                colours.setdefault(line.get_label(), set()).add(
                    matplotlib.colors.to_hex(line.get_color()))
    assert all(len(found) == 1 for found in colours.values()), colours
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)  # never shared


def test_every_axis_label_fits_beside_its_axis(figure):
    for ax in figure.axes:
        assert all(len(line) <= LABEL_WIDTH for line in ax.get_ylabel().splitlines())


def test_a_config_is_spelt_one_way_however_its_command_line_spelt_it():
    """`mamba (s0)` and `mamba order=1 (2 seeds)` were one config drawn twice: a default given
    on the command line changes nothing the run did."""
    plain = run(seed=0)
    given = run(seed=1, overrides=["model.d_model=8", "trainer.progress=false"])
    other = run(seed=2)
    other["model"]["config"] = {"d_model": 16}
    groups = run_groups([plain, given, other])
    assert [label for label, _ in groups] == ["mamba d_model=16 (s2)", "mamba d_model=8 (2 seeds)"]


def test_a_symlog_axis_keeps_the_ticks_around_zero_apart():
    """A one-record figure's 10^-2, 0 and -10^-2 printed over one another."""
    fig = gap_figure("t", {"mamba": [[0.01, -0.01, 0.005]]}, {"erm": [10.0, 10.0, 10.0]}, "gap")
    try:
        ax = fig.axes[0]
        assert ax.get_yscale() == "symlog"
        fig.canvas.draw()
        to_pixels = ax.transData.transform
        height = ax.get_window_extent().height
        zero, threshold = (to_pixels((0, y))[1] for y in (0.0, 0.01))
        assert (threshold - zero) / height > 0.1
    finally:
        plt.close(fig)


def test_the_boards_figure_draws_each_model_with_its_band_and_unit(tmp_path, monkeypatch):
    import bench.reports.plot as plot
    from bench.cli.main import main
    from test_leaderboard import put
    results = tmp_path / "results"
    put(results, *(record(seed=s, gap=0.1 + 0.01 * s) for s in range(3)),
        record(model="transformer", gap=0.2))
    drawn = []
    monkeypatch.setattr(plot, "save_png", lambda fig, path, stamp=None: drawn.append(fig))
    assert main(["leaderboard", f"out_dir={results}", f"out={tmp_path / 'lb.md'}"]) == 0
    (ax,) = drawn[0].axes
    assert "(nats/token)" in ax.get_ylabel().replace("\n", " ")
    assert len(ax.collections) == 1  # the band of mamba's three seeds; one seed has none
    plt.close(drawn[0])


def test_a_figure_is_drawn_again_only_when_its_inputs_or_its_file_changed(tmp_path, monkeypatch):
    """The leaderboard reuses a section's figure whose file says it was drawn from the same
    data and code and whose bytes match that stamp: anything else is drawn again."""
    import matplotlib.image

    import bench.reports.plot as plot
    path = tmp_path / "f.png"
    models, references = {"mamba": [[0.1, 0.05, 0.02], [0.12, 0.04, 0.03]]}, {"unigram": [0.3] * 3}
    drawn = []

    def counting(*args):
        drawn.append(args[0])
        return gap_figure(*args)
    monkeypatch.setattr(plot, "gap_figure", counting)

    def board(title="markov: gap to bayes", curves=models):
        plot.plot_gaps(path, title, curves, references, "gap (nats/token)")
        return len(drawn)
    assert board() == 1 and matplotlib.image.imread(path).shape[2] == 4  # a valid PNG
    first = path.read_bytes()
    assert board() == 1 and path.read_bytes() == first  # the same figure: not drawn again
    assert board(title="markov: gap to add-beta") == 2  # other inputs
    assert board(curves={"mamba": [[0.1, 0.05, 0.02]]}) == 3
    board()
    assert len(drawn) == 4 and path.read_bytes() == first  # drawing is deterministic
    damaged = bytearray(first)
    damaged[-40] ^= 1  # a pixel's byte: the stamp no longer matches the file
    path.write_bytes(bytes(damaged))
    assert board() == 5 and path.read_bytes() == first
    unstamped = first[:plot.HEADER_END] + first[plot.HEADER_END + 12 + int.from_bytes(
        first[plot.HEADER_END:plot.HEADER_END + 4], "big"):]
    path.write_bytes(unstamped)  # a figure of a board before stamps, or anyone's PNG
    assert plot.drawn_from(path) is None and board() == 6
    target = tmp_path / "elsewhere.png"
    target.write_bytes(first)
    path.unlink()
    path.symlink_to(target)  # a link, even to the right figure, is not the board's file
    assert board() == 7 and not path.is_symlink() and target.read_bytes() == first


def test_a_figure_is_stamped_with_what_its_statistics_compute_not_their_source(monkeypatch):
    """The stamp covers plot.py, matplotlib's version and across_seeds' values on probes (not
    tasks/stats.py's bytes, whose bootstraps no figure draws): a band computed otherwise draws
    every figure again, and the same band again stamps as before."""
    import bench.reports.plot as plot
    import tasks.stats
    inputs = ("markov: gap to bayes", {"mamba": [[0.1, 0.05]]}, {}, "gap")
    plot.drawing_code.cache_clear()
    before = plot.figure_inputs(*inputs)

    def wider(values):
        mean, half = tasks.stats.across_seeds(values)
        return mean, None if half is None else 1.01 * half
    monkeypatch.setattr(plot, "across_seeds", wider)
    plot.drawing_code.cache_clear()
    assert plot.figure_inputs(*inputs) != before
    monkeypatch.undo()
    plot.drawing_code.cache_clear()
    assert plot.figure_inputs(*inputs) == before
