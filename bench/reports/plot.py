"""Figures of run records: per-position gap curves (the leaderboard's) and the curves of one or
more runs (`python -m bench plot`: training loss, validation gap when recorded, gap by position).

Gaps of a model near the Bayes predictor are ~1e-4 while a no-learning baseline can be ~5: on a
linear axis the models are a flat line at 0. Wherever the references reach more than NEAR times
the models' largest |gap|, the gap axis is symmetric-logarithmic (linear within the models'
range, logarithmic beyond), so both stay readable and negative gaps still show.

One layout for every figure: a name (a model's config, a reference) has one colour in the whole
figure and no model shares a reference's colour (Palette); a config is spelt one way, by what
differs in its resolved config (facets); a kind of panel has one column in every row (PANELS);
models are the mean of their seeds with the band of its 95% interval; axes say their unit."""
from __future__ import annotations

import colorsys
import functools
import hashlib
import importlib.metadata
import io
import json
import math
import os
import stat
import struct
import textwrap
import zlib
from pathlib import Path

from bench.records.store import RESULT_NEUTRAL, not_written
from bench.reports.identities import resolved_config
from tasks.files import write_atomic
from tasks.stats import across_seeds

NEAR = 3.0  # references beyond this multiple of the models' largest |gap|: a symlog axis
PANELS = ("training", "validation", "position", "references")  # the columns, in this order
LABEL_WIDTH = 34  # characters a line of an axis label holds beside a 4-inch axis at 9 points
# result-neutral keys tell no runs apart; steps come from train.steps
HIDDEN_TRAINER_KEYS = (*RESULT_NEUTRAL, "max_steps")


# --- colours, scales and labels --------------------------------------------------------------
def curve_styles(n_models: int, n_references: int = 0) -> list[tuple[tuple, str]]:
    """(colour, line style) for n_models model curves followed by n_references reference curves.
    Colours never repeat within a figure: tab10 up to 10 curves, tab20 (its ten strong colours
    first) up to 20, then evenly spaced hues at two brightnesses; references are dashed."""
    import matplotlib
    n = n_models + n_references
    if n <= 10:
        colours = list(matplotlib.colormaps["tab10"].colors[:n])
    elif n <= 20:
        tab20 = matplotlib.colormaps["tab20"].colors
        colours = list((tab20[0::2] + tab20[1::2])[:n])
    else:  # alternating brightness keeps neighbouring hues apart
        colours = [colorsys.hsv_to_rgb(i / n, 0.8, 0.9 if i % 2 == 0 else 0.55) for i in range(n)]
    return [(tuple(float(c) for c in colour[:3]), "-" if i < n_models else "--")
            for i, colour in enumerate(colours)]


class Palette:
    """The colour of each curve name of a figure (curve_styles): models and references each
    their own, the same in every panel and row that draws the name (clairvoyant was green in
    one row and orange, the transformer's colour, in the next)."""

    def __init__(self, models, references):
        models, references = list(dict.fromkeys(models)), list(dict.fromkeys(references))
        colours = [colour for colour, _ in curve_styles(len(models), len(references))]
        self.models = dict(zip(models, colours))
        self.references = dict(zip(references, colours[len(models):]))

    def model(self, name: str) -> tuple:
        return self.models[name]

    def reference(self, name: str) -> tuple:
        return self.references[name]


def largest_magnitude(curves) -> float:
    values = [abs(v) for curve in curves for v in curve
              if v is not None and math.isfinite(v)]
    return max(values, default=0.0)


def gap_scale(models: dict[str, list], references: dict[str, list]) -> tuple[str, float | None]:
    """("linear", None), or ("symlog", linear threshold) when the references are off the
    models' scale (beyond NEAR times their largest |gap|); the threshold is the models'
    largest |gap|, so their range stays linear."""
    inner = largest_magnitude(models.values())
    outer = largest_magnitude(references.values())
    if inner > 0 and outer > NEAR * inner:
        return "symlog", inner
    return "linear", None


def set_symlog(ax, threshold: float, outer: float) -> None:
    """A symlog y axis, linear within ±threshold and each half of that part as tall as the
    decades above it: the models' range is not squeezed, and the ticks at 0 and ±threshold keep
    apart (at the default linscale, 10^-2, 0 and -10^-2 printed over one another)."""
    decades = math.log10(max(outer / threshold, 10.0))
    ax.set_yscale("symlog", linthresh=threshold, linscale=decades)


def set_ylabel(ax, text: str) -> None:
    """An axis label wrapped to lines that fit beside the axis (a long one grew taller than its
    axis and printed over the legend of the panel below)."""
    ax.set_ylabel("\n".join(textwrap.wrap(text, LABEL_WIDTH)), fontsize=9)


def mean_and_band(curves: list[list]) -> tuple[list, list, list]:
    """Position by position: the mean across seeds and its 95% t-interval (None where fewer
    than two seeds have a value)."""
    length = max((len(c) for c in curves), default=0)
    means, lows, highs = [], [], []
    for i in range(length):
        values = [c[i] for c in curves if i < len(c) and c[i] is not None
                  and math.isfinite(c[i])]
        if not values:
            means.append(None), lows.append(None), highs.append(None)
            continue
        mean, half = across_seeds(values)
        means.append(mean)
        lows.append(None if half is None else mean - half)
        highs.append(None if half is None else mean + half)
    return means, lows, highs


def draw_group(ax, xs: list, curves: list[list], label: str, colour, marker=None) -> bool:
    """One group's curve (the mean of its seeds) with the band of its interval across seeds;
    False when it has nothing to draw (no legend entry then)."""
    means, lows, highs = mean_and_band(curves)
    points = [(x, m) for x, m in zip(xs, means) if m is not None]
    if not points:
        return False
    ax.plot(*zip(*points), color=colour, lw=1.0, label=label, marker=marker, ms=2.5)
    band = [(x, lo, hi) for x, lo, hi in zip(xs, lows, highs) if lo is not None]
    if band:
        ax.fill_between(*zip(*band), color=colour, alpha=0.18, lw=0)
    return True


def by_position(ax, curves: list[list], label: str, colour) -> bool:
    """draw_group of per-position curves (position 1 first)."""
    return draw_group(ax, list(range(1, 1 + max(map(len, curves), default=0))), curves, label,
                      colour)


def draw_reference(ax, name: str, curve: list, colour) -> None:
    xs = [i + 1 for i, v in enumerate(curve) if v is not None]
    ax.plot(xs, [v for v in curve if v is not None], color=colour, linestyle="--", lw=1.0,
            alpha=0.85, label=name)


def legend_below(ax) -> None:
    if ax.get_legend_handles_labels()[0]:  # only what is drawn
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


# --- the leaderboard's figure: one task section ------------------------------------------------
def gap_figure(title: str, models: dict[str, list[list]], references: dict[str, list],
               ylabel: str):
    """Per-position curves of a section: each model the mean of its seeds' curves (one list per
    seed) with its band, the references dashed, the axis of `gap_scale`, a zero line. The legend
    sits below the axes so it never hides the curves, and the figure grows with the curves."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.4 + 0.22 * (len(models) + len(references))))
    palette = Palette(models, references)
    for name, curves in models.items():
        by_position(ax, curves, name, palette.model(name))
    for name, curve in references.items():
        draw_reference(ax, name, curve, palette.reference(name))
    means = {name: mean_and_band(curves)[0] for name, curves in models.items()}
    scale, threshold = gap_scale(means, references)
    if scale == "symlog":
        set_symlog(ax, threshold, largest_magnitude(references.values()))
        ylabel += ", symlog"
    ax.axhline(0, color="k", lw=0.6)  # black: in neither palette
    ax.set_xlabel("position (context length)")
    set_ylabel(ax, ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
    fig.tight_layout()
    return fig


def save_png(fig, path: Path, stamp: str | None = None) -> None:
    """fig as a PNG at path, written atomically; with `stamp` (figure_inputs) the file carries it
    (stamped) so that the same figure is not drawn again."""
    import matplotlib.pyplot as plt
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
        png = buffer.getvalue() if stamp is None else stamped(buffer.getvalue(), stamp)
        write_atomic(path, lambda tmp: Path(tmp).write_bytes(png))
    finally:
        plt.close(fig)


# --- a drawn figure is not drawn again --------------------------------------------------------
# Drawing is most of what `leaderboard` costs (about 0.25 s a section), and most sections are
# unchanged between two boards. A figure file carries, in a PNG text chunk right after its
# header, the digest of what it was drawn from and the digest of its other bytes: it is reused
# only where both match, so a file edited, truncated or drawn from other data is drawn again.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HEADER_END = 33  # the signature and the IHDR chunk (13 bytes of data), always first
STAMP_KEY = b"icl-bench drawn from"


def figure_inputs(*inputs) -> str:
    """The digest of what a figure shows and how: its data and the code that draws it
    (drawing_code)."""
    h = hashlib.blake2b(json.dumps(inputs, sort_keys=True).encode(), digest_size=16)
    h.update(drawing_code())
    return h.hexdigest()


# Seeds' values on which across_seeds' mean and band are taken to fingerprint what it computes:
# one seed (no band), two, and enough for the t quantile's tail.
BAND_PROBES = ([0.75], [1.0, 2.5], [0.1, 0.4, 0.35, 2.0, 1e-3],
               [math.sin(i) + 2 for i in range(40)])


@functools.cache
def drawing_code() -> bytes:
    """This module, matplotlib's version and what the statistics it calls compute (their values
    on BAND_PROBES, not their source: a change elsewhere in tasks/stats.py left every committed
    figure drawn again by every board): once a process."""
    bands = repr([[x.hex() if x is not None else None for x in across_seeds(values)]
                  for values in BAND_PROBES])
    return b"".join([Path(__file__).read_bytes(), bands.encode(),
                     importlib.metadata.version("matplotlib").encode()])


def _text_chunk(body: bytes) -> bytes:
    return (struct.pack(">I", len(body)) + b"tEXt" + body
            + struct.pack(">I", zlib.crc32(b"tEXt" + body)))


def stamped(png: bytes, inputs: str) -> bytes:
    """png with a text chunk after its header: the inputs it was drawn from, and the digest of
    every other byte of the file."""
    content = hashlib.blake2b(png, digest_size=16).hexdigest()
    return png[:HEADER_END] + _text_chunk(STAMP_KEY + b"\0" + f"{inputs} {content}".encode()) \
        + png[HEADER_END:]


def drawn_from(path: Path) -> str | None:
    """The inputs the figure at path was drawn from, where it is a regular file (never a link)
    whose stamp matches its other bytes; None for anything else."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if data[:8] != PNG_SIGNATURE or data[8:16] != struct.pack(">I", 13) + b"IHDR":
        return None
    length = int.from_bytes(data[HEADER_END:HEADER_END + 4], "big")
    end = HEADER_END + 12 + length
    chunk = data[HEADER_END:end]
    body = chunk[8:-4]
    if len(chunk) != 12 + length or chunk != _text_chunk(body) \
            or not body.startswith(STAMP_KEY + b"\0"):
        return None
    inputs, _, content = body[len(STAMP_KEY) + 1:].decode("ascii", "replace").partition(" ")
    other = data[:HEADER_END] + data[end:]
    return inputs if hashlib.blake2b(other, digest_size=16).hexdigest() == content else None


def plot_gaps(path: Path, title: str, models: dict[str, list[list]],
              references: dict[str, list], ylabel: str) -> None:
    """The section's figure at path, drawn unless the file there was drawn from the same
    inputs (figure_inputs) and is whole."""
    inputs = figure_inputs(title, models, references, ylabel)
    if drawn_from(path) != inputs:
        save_png(gap_figure(title, models, references, ylabel), path, stamp=inputs)


# --- python -m bench plot ------------------------------------------------------------------
def position_curves(record: dict) -> tuple[dict[str, list], str]:
    """Per-position curves of a record by predictor: its gaps to the gap reference when
    recorded, else its losses; and what they are."""
    per_position = record.get("per_position") or {}
    kind = "gap" if "gap.model" in per_position else "loss"
    return ({key.split(".", 1)[1]: curve for key, curve in per_position.items()
             if key.startswith(kind + ".")}, kind)


def validation_label(record: dict) -> str:
    """What a record's train.val_curve holds (bench/training/validation.py LiveValidation): the
    Bayes gap to its gap reference, or for text (no Bayes predictor) the model's loss in
    nats/token."""
    metrics = record.get("metrics") or {}
    if metrics.get("scoring") == "perplexity":
        return "validation loss (nats/token)"
    return f"validation gap to {metrics.get('gap_reference') or 'bayes'}"


def unit_of(record: dict) -> str:
    """What a record's losses are measured in: token tasks (an accuracy, or text) in nats per
    token, the regression and state-space tasks in squared error per coordinate."""
    metrics = record.get("metrics") or {}
    tokens = metrics.get("scoring") == "perplexity" or "accuracy" in metrics
    return "nats/token" if tokens else "squared error"


def section_of(record: dict) -> tuple:
    """Runs that share a figure section: one task config scored on one held-out set."""
    return (record["task"]["name"], json.dumps(task_config(record), sort_keys=True),
            (record.get("metrics") or {}).get("sequences"))


def task_config(record: dict) -> dict:
    """The task config with fields added after the record was written at their defaults: an
    older record of the same task is in the same section."""
    try:
        return resolved_config(record, "task")
    except (KeyError, TypeError, ValueError):  # a family this code no longer knows
        return record["task"]["config"]


def shown_value(value) -> str:
    """A config value as an override spells it: true/false, numbers as given, lists as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def facets(record: dict) -> dict[str, str]:
    """What can tell a run apart from another of its section: the model, its resolved model and
    trainer settings (not the result-neutral ones; a default given on the command line and one
    left out are one setting: `mamba (s0)` and `mamba order=1 (2 seeds)` were one config), the
    steps it trained and whether it is an evaluation."""
    found = {"model": record["model"]["name"], "steps": f"{record['train']['steps']} steps"}
    for group in ("model", "trainer"):
        try:
            config = resolved_config(record, group)
        except (KeyError, TypeError, ValueError):  # a family this code no longer knows
            config = (record.get(group) or {}).get("config") or {}
        for key, value in sorted(config.items()):
            if not (group == "trainer" and key in HIDDEN_TRAINER_KEYS):
                found[f"{group}.{key}"] = f"{key}={shown_value(value)}"
    if record.get("origin") == "eval":
        found["origin"] = "eval"
    if record.get("name"):
        found["name"] = f"[{record['name']}]"
    return found


def run_groups(records: list[dict]) -> list[tuple[str, list[dict]]]:
    """The runs of one section grouped by their facets (the seeds of one config together), each
    labelled by the model and what differs between the groups, never by what all share: a model
    setting where it differs between the groups of that model, any other where it differs
    between any groups."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault(tuple(sorted(facets(record).items())), []).append(record)
    everyone = [dict(group) for group in groups]
    keys = sorted({key for values in everyone for key in values} - {"model"})

    def differs(key: str, values: dict) -> bool:
        among = ([other for other in everyone if other["model"] == values["model"]]
                 if key.startswith("model.") else everyone)
        return len({other.get(key) for other in among}) > 1

    labelled = []
    for group, runs in groups.items():
        newest = {}  # a seed once: its newest record (a re-run or resumed copy replaces it)
        for record in sorted(runs, key=lambda r: r["run_id"][-22:]):
            newest[record["seed"]] = record
        runs = list(newest.values())
        values = dict(group)
        parts = [values[key] for key in keys if key in values and differs(key, values)]
        seeds = sorted(r["seed"] for r in runs)
        seed_text = (f"s{seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds")
        label = " ".join([values["model"], *parts, f"({seed_text})"])
        labelled.append((label, sorted(runs, key=lambda r: r["seed"])))
    return sorted(labelled)


def by_step(curves: list[list]) -> tuple[list, list]:
    """[step, value] curves of several seeds as steps and per-step values (seeds that logged
    the same steps)."""
    steps = sorted({s for curve in curves for s, _ in curve})
    index = {s: i for i, s in enumerate(steps)}
    table = [[None] * len(steps) for _ in curves]
    for row, curve in zip(table, curves):
        for s, v in curve:
            row[index[s]] = v
    return steps, table


def section_title(records: list[dict]) -> str:
    record = records[0]
    config = ", ".join(f"{k}={v}" for k, v in sorted(task_config(record).items())
                       if not isinstance(v, (list, dict)))
    sequences = (record.get("metrics") or {}).get("sequences")
    return (f"{record['task']['name']} ({config}) — scored on {sequences} held-out sequences"
            if len(config) < 110 else
            f"{record['task']['name']} — scored on {sequences} held-out sequences")


def section_panels(records: list[dict]) -> list[str]:
    panels = ["training"]
    if any((r.get("train") or {}).get("val_curve") for r in records):
        panels.append("validation")
    panels.append("position")
    if far_references(records):
        panels.append("references")
    return panels


def reference_curves(records: list[dict]) -> tuple[dict[str, list], str, str]:
    """The section's references by position (from its first run: they are the task's, the same
    for every run of a section), what the curves are, and their axis label."""
    first, kind = position_curves(records[0])
    references = {name: curve for name, curve in first.items() if name != "model"}
    unit = unit_of(records[0])
    if kind == "gap":
        reference = records[0]["metrics"].get("gap_reference", "bayes")
        references.pop(reference, None)  # its gap to itself is 0: the zero line
        return references, kind, f"gap to {reference} ({unit})"
    return references, kind, f"loss ({unit})"


def far_references(records: list[dict]) -> dict[str, list]:
    """References beyond NEAR times the models' largest |value|: drawn with the models they
    would flatten every model curve (an `erm` gap of 5 against models at 1e-3)."""
    references, _, _ = reference_curves(records)
    inner = largest_magnitude(position_curves(r)[0].get("model", []) for r in records)
    return {name: curve for name, curve in references.items()
            if inner > 0 and largest_magnitude([curve]) > NEAR * inner}


def runs_figure(records: list[dict]):
    """One row of panels per section (a task config and its held-out set), one column per kind
    of panel (PANELS: training loss by step, the validation gap where recorded, the gap or loss
    by position with the references near the models, and every reference on a symlog axis where
    some are far off), a row without a kind leaving its column empty. Runs of one config (seeds)
    are one curve, their mean, with a band of the 95% interval across seeds; labels say what
    differs between the curves; a config or reference has one colour in the whole figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sections: dict[tuple, list[dict]] = {}
    for record in records:
        sections.setdefault(section_of(record), []).append(record)
    layout = [(runs, section_panels(runs), run_groups(runs)) for runs in sections.values()]
    columns = [panel for panel in PANELS if any(panel in panels for _, panels, _ in layout)]
    palette = Palette([label for _, _, groups in layout for label, _ in groups],
                      [name for runs, _, _ in layout for name in reference_curves(runs)[0]])
    height = sum(4.0 + 0.18 * max(len(groups), 1) for _, _, groups in layout)
    fig, axes = plt.subplots(len(layout), len(columns), figsize=(5.0 * len(columns), height),
                             squeeze=False)
    for row, (runs, panels, groups) in zip(axes, layout):
        draw_section({panel: row[columns.index(panel)] for panel in panels}, runs, groups,
                     palette)
        for panel, ax in zip(columns, row):
            if panel not in panels:
                ax.set_visible(False)
    fig.tight_layout()
    return fig


def draw_section(axes: dict, runs: list[dict], groups: list, palette: Palette) -> None:
    references, kind, ylabel = reference_curves(runs)
    far = far_references(runs)
    unit = unit_of(runs[0])
    ax = axes["training"]
    for label, members in groups:
        steps, table = by_step([(r.get("train") or {}).get("loss_curve") or [] for r in members])
        draw_group(ax, steps, table, label, palette.model(label))
    ax.set_xlabel("step")
    set_ylabel(ax, f"training loss ({unit})")
    losses = [v for line in ax.lines for v in line.get_ydata() if v is not None]
    if losses and min(losses) > 0 and max(losses) > 20 * min(losses):
        ax.set_yscale("log")  # an early spike would flatten the rest of the curve
    ax.set_title(section_title(runs), fontsize=9, loc="left")
    legend_below(ax)
    if "validation" in axes:
        ax = axes["validation"]
        for label, members in groups:
            steps, table = by_step([(r.get("train") or {}).get("val_curve") or []
                                    for r in members])
            draw_group(ax, steps, table, label, palette.model(label), marker="o")
        ax.set_xlabel("step")
        text = validation_label(runs[0])
        set_ylabel(ax, text if "nats" in text else f"{text} ({unit})")
        if kind == "gap":
            ax.axhline(0, color="k", lw=0.6)  # a gap's zero; nats/token are far from it
        legend_below(ax)
    near = {name: curve for name, curve in references.items() if name not in far}
    for panel, shown in (("position", near), ("references", references)):
        if panel not in axes:
            continue
        ax = axes[panel]
        for label, members in groups:
            by_position(ax, [position_curves(r)[0].get("model", []) for r in members], label,
                        palette.model(label))
        for name, curve in shown.items():
            draw_reference(ax, name, curve, palette.reference(name))
        if kind == "gap":
            ax.axhline(0, color="k", lw=0.6)
        label = ylabel
        if panel == "references":
            inner = largest_magnitude(position_curves(r)[0].get("model", []) for r in runs)
            set_symlog(ax, max(inner, 1e-12), largest_magnitude(references.values()))
            label = f"{ylabel}, every reference, symlog"
        ax.set_xlabel("position (context length)")
        set_ylabel(ax, label)
        legend_below(ax)


def plot_runs(records: list[dict], path: Path) -> Path:
    try:
        save_png(runs_figure(records), path)
    except OSError as error:
        raise not_written(path, error) from None
    return path
