"""Figures of run records: per-position gap curves (the leaderboard's) and the curves of one or
more runs (`python -m bench plot`: training loss, validation gap when recorded, gap by position).

Gaps of a model near the Bayes predictor are ~1e-4 while a no-learning baseline can be ~5: on a
linear axis the models are a flat line at 0. When the references reach more than OFF_SCALE times
the models' largest |gap|, the gap axis is symmetric-logarithmic (linear within the models'
range, logarithmic beyond), so both stay readable and negative gaps still show."""
from __future__ import annotations

import colorsys
import json
import math
from pathlib import Path

from bench.records.store import RESULT_NEUTRAL, not_written
from bench.reports.identities import resolved_config
from tasks.files import write_atomic
from tasks.stats import across_seeds

OFF_SCALE = 20.0  # references beyond this multiple of the models' largest |gap|: symlog axis


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


def largest_magnitude(curves) -> float:
    values = [abs(v) for curve in curves for v in curve
              if v is not None and math.isfinite(v)]
    return max(values, default=0.0)


def gap_scale(models: dict[str, list], references: dict[str, list]) -> tuple[str, float | None]:
    """("linear", None), or ("symlog", linear threshold) when the references are off the
    models' scale (OFF_SCALE); the threshold is a tenth of the models' largest |gap|."""
    inner = largest_magnitude(models.values())
    outer = largest_magnitude(references.values())
    if inner > 0 and outer > OFF_SCALE * inner:
        return "symlog", inner / 10
    return "linear", None


def draw_curves(ax, models: dict[str, list], references: dict[str, list], start: int = 1):
    """Solid model curves and dashed reference curves, x = start + index; None values skipped."""
    curves = [*models.items(), *references.items()]
    for (name, curve), (colour, style) in zip(curves, curve_styles(len(models), len(references))):
        xs = [i + start for i, v in enumerate(curve) if v is not None]
        ys = [v for v in curve if v is not None]
        ax.plot(xs, ys, label=name, color=colour, linestyle=style, lw=1.0, alpha=0.85)


def gap_axes(ax, models: dict[str, list], references: dict[str, list], ylabel: str) -> None:
    """Per-position curves on ax, with the axis scale of `gap_scale` and a zero line."""
    draw_curves(ax, models, references)
    scale, threshold = gap_scale(models, references)
    if scale == "symlog":
        ax.set_yscale("symlog", linthresh=threshold)
        ylabel += " (symlog)"
    ax.axhline(0, color="k", lw=0.6)  # black: in neither palette
    ax.set_xlabel("position (context length)")
    ax.set_ylabel(ylabel)


def gap_figure(title: str, models: dict[str, list], references: dict[str, list], ylabel: str):
    """Per-position gap curves: solid for models, dashed for references, each its own colour.
    The legend sits below the axes so it never hides the curves, and the figure grows with the
    number of curves."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.4 + 0.22 * (len(models) + len(references))))
    gap_axes(ax, models, references, ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
    fig.tight_layout()
    return fig


def save_png(fig, path: Path) -> None:
    import matplotlib.pyplot as plt
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110,
                                                   bbox_inches="tight"))
    finally:
        plt.close(fig)


def plot_gaps(path: Path, title: str, models: dict[str, list], references: dict[str, list],
              ylabel: str) -> None:
    save_png(gap_figure(title, models, references, ylabel), path)


# --- python -m bench plot ------------------------------------------------------------------
NEAR = 3.0  # references within this multiple of the models' largest |gap| share their panel
SHOWN_KEYS = ("task.", "model.", "trainer.")  # overrides that can tell two runs apart
# result-neutral keys tell no runs apart; steps come from train.steps
HIDDEN_KEYS = (*(f"trainer.{key}" for key in RESULT_NEUTRAL), "trainer.max_steps")


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


def facets(record: dict) -> dict[str, str]:
    """What can tell a run apart from another of its section: the model, its command line's
    model/task/trainer settings, the steps it trained and whether it is an evaluation."""
    found = {"model": record["model"]["name"], "steps": f"{record['train']['steps']} steps"}
    for override in record.get("overrides") or []:
        key, _, value = override.partition("=")
        if key.startswith(SHOWN_KEYS) and not key.startswith(HIDDEN_KEYS):
            found[key] = f"{key.split('.', 1)[1]}={value}"
    if record.get("origin") == "eval":
        found["origin"] = "eval"
    if record.get("name"):
        found["name"] = f"[{record['name']}]"
    return found


def run_groups(records: list[dict]) -> list[tuple[str, list[dict]]]:
    """The runs of one section grouped by their facets (the seeds of one config together), each
    labelled by the model and what differs between the groups, never by what all share."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault(tuple(sorted(facets(record).items())), []).append(record)
    keys = {key for group in groups for key, _ in group}
    differing = [key for key in sorted(keys) if key != "model" and
                 len({dict(group).get(key) for group in groups}) > 1]
    labelled = []
    for group, runs in groups.items():
        newest = {}  # a seed once: its newest record (a re-run or resumed copy replaces it)
        for record in sorted(runs, key=lambda r: r["run_id"][-22:]):
            newest[record["seed"]] = record
        runs = list(newest.values())
        values = dict(group)
        parts = [values[key] for key in differing if key in values]
        seeds = sorted(r["seed"] for r in runs)
        seed_text = (f"s{seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds")
        label = " ".join([values["model"], *parts, f"({seed_text})"])
        labelled.append((label, sorted(runs, key=lambda r: r["seed"])))
    return sorted(labelled)


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


def legend_below(ax) -> None:
    if ax.get_legend_handles_labels()[0]:  # only what is drawn
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


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
        return references, kind, f"gap to {reference} by position ({unit})"
    return references, kind, f"loss by position ({unit})"


def far_references(records: list[dict]) -> dict[str, list]:
    """References beyond NEAR times the models' largest |value|: drawn with the models they
    would flatten every model curve (an `erm` gap of 5 against models at 1e-3)."""
    references, _, _ = reference_curves(records)
    inner = largest_magnitude(position_curves(r)[0].get("model", []) for r in records)
    return {name: curve for name, curve in references.items()
            if inner > 0 and largest_magnitude([curve]) > NEAR * inner}


def runs_figure(records: list[dict]):
    """One row of panels per section (a task config and its held-out set): training loss by
    step, the validation gap where recorded, and the gap (or loss) by position of every run,
    the references dashed, those far off the models' scale in a panel of their own. Runs of one
    config (seeds) are one curve, their mean, with a band of the 95% interval across seeds;
    labels say what differs between the curves."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sections: dict[tuple, list[dict]] = {}
    for record in records:
        sections.setdefault(section_of(record), []).append(record)
    layout = [(runs, section_panels(runs)) for runs in sections.values()]
    columns = max(len(panels) for _, panels in layout)
    height = sum(4.0 + 0.18 * len(run_groups(runs)) for runs, _ in layout)
    fig, axes = plt.subplots(len(layout), columns, figsize=(5.0 * columns, height),
                             squeeze=False)
    for row, (runs, panels) in zip(axes, layout):
        draw_section(row, runs, panels)
        for ax in row[len(panels):]:
            ax.set_visible(False)
    fig.tight_layout()
    return fig


def draw_section(row, runs: list[dict], panels: list[str]) -> None:
    groups = run_groups(runs)
    references, kind, ylabel = reference_curves(runs)
    far = far_references(runs)
    near = {name: curve for name, curve in references.items() if name not in far}
    styles = curve_styles(len(groups), len(references))
    run_colours = [colour for colour, _ in styles[:len(groups)]]
    reference_colours = dict(zip(references, (colour for colour, _ in styles[len(groups):])))
    unit = unit_of(runs[0])
    axes = dict(zip(panels, row))
    ax = axes["training"]
    for (label, members), colour in zip(groups, run_colours):
        steps, table = by_step([(r.get("train") or {}).get("loss_curve") or [] for r in members])
        draw_group(ax, steps, table, label, colour)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss ({unit})")
    losses = [v for line in ax.lines for v in line.get_ydata() if v is not None]
    if losses and min(losses) > 0 and max(losses) > OFF_SCALE * min(losses):
        ax.set_yscale("log")  # an early spike would flatten the rest of the curve
    ax.set_title(section_title(runs), fontsize=9, loc="left")
    legend_below(ax)
    if "validation" in axes:
        ax = axes["validation"]
        for (label, members), colour in zip(groups, run_colours):
            steps, table = by_step([(r.get("train") or {}).get("val_curve") or []
                                    for r in members])
            draw_group(ax, steps, table, label, colour, marker="o")
        ax.set_xlabel("step")
        ax.set_ylabel(f"{validation_label(runs[0])}" + ("" if "nats" in
                                                        validation_label(runs[0]) else f" ({unit})"))
        if kind == "gap":
            ax.axhline(0, color="k", lw=0.6)  # a gap's zero; nats/token are far from it
        legend_below(ax)
    for panel, shown in (("position", near), ("references", references)):
        if panel not in axes:
            continue
        ax = axes[panel]
        for (label, members), colour in zip(groups, run_colours):
            curves = [position_curves(r)[0].get("model", []) for r in members]
            draw_group(ax, list(range(1, 1 + max(map(len, curves), default=0))), curves, label,
                       colour)
        for name, curve in shown.items():
            xs = [i + 1 for i, v in enumerate(curve) if v is not None]
            ax.plot(xs, [v for v in curve if v is not None], color=reference_colours[name],
                    linestyle="--", lw=1.0, label=name)
        if kind == "gap":
            ax.axhline(0, color="k", lw=0.6)
        if panel == "references":
            ax.set_yscale("symlog", linthresh=max(largest_magnitude(
                position_curves(r)[0].get("model", []) for r in runs), 1e-12))
        ax.set_xlabel("position (context length)")
        ax.set_ylabel(ylabel if panel == "position" else f"{ylabel}, all references (symlog)")
        legend_below(ax)


def plot_runs(records: list[dict], path: Path) -> Path:
    try:
        save_png(runs_figure(records), path)
    except OSError as error:
        raise not_written(path, error) from None
    return path
