"""Figures of run records: per-position gap curves (the leaderboard's) and the curves of one or
more runs (`python -m bench plot`: training loss, validation gap when recorded, gap by position).

Gaps of a model near the Bayes predictor are ~1e-4 while a no-learning baseline can be ~5: on a
linear axis the models are a flat line at 0. When the references reach more than OFF_SCALE times
the models' largest |gap|, the gap axis is symmetric-logarithmic (linear within the models'
range, logarithmic beyond), so both stay readable and negative gaps still show."""
from __future__ import annotations

import colorsys
import math
from pathlib import Path

from bench.records import not_written
from tasks.files import write_atomic

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
def run_label(record: dict, records: list[dict]) -> str:
    """model s<seed>, with the task and run name where the plotted runs differ in them."""
    label = f"{record['model']['name']} s{record['seed']}"
    if len({r["task"]["name"] for r in records}) > 1:
        label = f"{record['task']['name']} {label}"
    if record.get("name") and len({r.get("name") for r in records}) > 1:
        label += f" [{record['name']}]"
    return label


def position_curves(record: dict) -> tuple[dict[str, list], str]:
    """Per-position curves of a record by predictor: its gaps to the gap reference when
    recorded, else its losses; and what they are."""
    per_position = record.get("per_position") or {}
    kind = "gap" if "gap.model" in per_position else "loss"
    return ({key.split(".", 1)[1]: curve for key, curve in per_position.items()
             if key.startswith(kind + ".")}, kind)


def validation_label(record: dict) -> str:
    """What a record's train.val_curve holds (bench/validation.py LiveValidation): the Bayes gap to
    its gap reference, or for text (no Bayes predictor) the model's loss in nats/token."""
    metrics = record.get("metrics") or {}
    if metrics.get("scoring") == "perplexity":
        return "validation loss (nats/token)"
    return f"validation gap to {metrics.get('gap_reference') or 'bayes'}"


def runs_figure(records: list[dict]):
    """Training loss by step (and the validation gap where the record has it) beside the gap
    (or loss) by position: every run a solid curve; the first run's references dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    validation = any((r.get("train") or {}).get("val_curve") for r in records)
    columns = 3 if validation else 2
    fig, axes = plt.subplots(1, columns, figsize=(5.2 * columns, 4.2 + 0.2 * len(records)))
    labels = [run_label(r, records) for r in records]
    styles = curve_styles(len(records))
    for record, label, (colour, _) in zip(records, labels, styles):
        curve = (record.get("train") or {}).get("loss_curve") or []
        axes[0].plot([s for s, _ in curve], [v for _, v in curve], color=colour, lw=0.9,
                     label=label)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss")
    losses = [v for r in records for _, v in (r.get("train") or {}).get("loss_curve") or []]
    if losses and min(losses) > 0 and max(losses) > OFF_SCALE * min(losses):
        axes[0].set_yscale("log")  # an early spike would flatten the rest of the curve
    if validation:
        for record, label, (colour, _) in zip(records, labels, styles):
            curve = (record.get("train") or {}).get("val_curve") or []
            axes[1].plot([s for s, _ in curve], [v for _, v in curve], color=colour, lw=0.9,
                         marker="o", ms=2.5, label=label)
        axes[1].set_xlabel("step")
        axes[1].set_ylabel(validation_label(records[0]))
        if (records[0].get("metrics") or {}).get("scoring") != "perplexity":
            axes[1].axhline(0, color="k", lw=0.6)  # a gap's zero; nats/token are far from it
    first, kind = position_curves(records[0])
    models = {label: position_curves(r)[0].get("model", []) for r, label in zip(records, labels)}
    references = {name: curve for name, curve in first.items() if name != "model"}
    if kind == "gap":
        reference = records[0]["metrics"].get("gap_reference", "bayes")
        references.pop(reference, None)  # its gap to itself is 0: the zero line
        ylabel = f"gap to {reference} by position"
    else:
        ylabel = "loss by position"
    gap_axes(axes[-1], models, references, ylabel)
    for ax in axes:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    task = records[0]["task"]["name"]
    fig.suptitle(task if len({r["task"]["name"] for r in records}) == 1 else "runs", fontsize=10)
    fig.tight_layout()
    return fig


def plot_runs(records: list[dict], path: Path) -> Path:
    try:
        save_png(runs_figure(records), path)
    except OSError as error:
        raise not_written(path, error) from None
    return path
