"""leaderboard.md from run records: per task, the Bayes gap of every model with its interval.

Runs are grouped by task name + resolved task config (an order-2 Markov run is never averaged
with an order-1 one) and, within a task, by model name + resolved model config + trainer budget.
Several seeds of one group are summarised by their mean gap and a 95% t-interval across seeds;
a single seed shows its bootstrap interval over held-out sequences."""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections import defaultdict
from pathlib import Path

from bench.evaluate import fmt
from bench.records import read_records

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}  # Student t quantiles (two-sided 95%) by degrees of freedom


def digest(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:8]


def across_seeds(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% t-interval (None for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, T_975.get(n - 1, 1.96) * sd / math.sqrt(n)


IGNORED_IN_LABELS = ("trainer.progress", "trainer.threads", "trainer.eval_batch_size")


def label_of(record: dict) -> str:
    """Model name plus the model and trainer overrides of its command line (seeds, paths and
    display options aside), so a row says how it differs from conf/model/<name>.yaml."""
    shown = [o for o in record.get("overrides", [])
             if o.startswith(("model.", "trainer.")) and not o.startswith(IGNORED_IN_LABELS)]
    return record["model"]["name"] + (f" ({', '.join(shown)})" if shown else "")


def plot_gaps(path: Path, title: str, curves: dict[str, list], ylabel: str) -> None:
    """Per-position gap curves, one per row; the legend sits below the axes so it never hides
    the curves, and the figure grows with the number of rows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.4 + 0.22 * len(curves)))
    for name, curve in curves.items():
        xs = [i + 1 for i, v in enumerate(curve) if v is not None]
        ys = [v for v in curve if v is not None]
        ax.plot(xs, ys, label=name, lw=1.0, alpha=0.85)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("position (context length)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def mean_curve(curves: list[list]) -> list:
    out = []
    for values in zip(*curves):
        present = [v for v in values if v is not None]
        out.append(sum(present) / len(present) if present else None)
    return out


def task_section(task_name: str, runs: list[dict], figure: Path, figure_link: str) -> list[str]:
    first = runs[-1]
    metrics = first["metrics"]
    reference = metrics["gap_reference"]
    unit = "nats/token" if "accuracy" in metrics else "squared error per coordinate"
    lines = [f"## {task_name}", "",
             f"`{json.dumps(first['task']['config'], sort_keys=True)}` — gap to "
             f"`{reference}` ({metrics['gap_reference_role']}), {unit}; "
             f"{metrics['sequences']} held-out sequences.", "",
             "| model | Bayes gap | 95% CI | relative gap | params | state | steps | seeds | "
             "wall (s) |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[dict]] = defaultdict(list)
    for run in runs:  # seeds of one model and training configuration form a row
        trainer = {k: v for k, v in run["trainer"]["config"].items()
                   if k not in ("progress", "threads", "eval_batch_size")}
        groups[digest([run["model"]["name"], run["model"]["config"], trainer])].append(run)
    rows, curves = [], {}
    for group in groups.values():
        label = label_of(group[0])
        gaps = [r["metrics"]["bayes_gap"] for r in group]
        mean, half = across_seeds(gaps)
        lo, hi = ((mean - half, mean + half) if half is not None
                  else tuple(group[0]["metrics"]["bayes_gap_ci"]))
        rel = sum(r["metrics"]["relative_gap"] for r in group) / len(group)
        wall = sum(r["train"]["wall_time_s"] for r in group) / len(group)
        seeds = sorted({r["seed"] for r in group})
        rows.append((mean, f"| {label} | {fmt(mean)} | [{fmt(lo)}, {fmt(hi)}]"
                           f"{'' if half is None else ' (seeds)'} | {rel:.2%} | {group[0]['params']} | "
                           f"{group[0]['state_size']} | {group[0]['train']['steps']} | "
                           f"{len(seeds)} | {wall:.0f} |"))
        curves[label] = mean_curve([r["per_position"]["gap.model"] for r in group])
    lines += [row for _, row in sorted(rows)]
    lines += ["", "| reference | role | loss | gap | 95% CI |", "|---|---|---|---|---|"]
    for name in sorted(metrics["roles"], key=lambda n: metrics["loss"][n]):
        lo, hi = metrics["gap_ci"][name]
        lines.append(f"| {name} | {metrics['roles'][name]} | {fmt(metrics['loss'][name])} | "
                     f"{fmt(metrics['gap'][name])} | [{fmt(lo)}, {fmt(hi)}] |")
        if name != reference and f"gap.{name}" in first["per_position"]:
            curves[f"{name} ({metrics['roles'][name]})"] = first["per_position"][f"gap.{name}"]
    plot_gaps(figure, f"{task_name}: gap to {reference} by position", curves,
              f"loss − loss({reference})")
    lines += ["", f"![per-position gap]({figure_link})", ""]
    return lines


def write_leaderboard(out_dir: str, out: str = "leaderboard.md") -> tuple[str, int]:
    records = [r for r in read_records(out_dir) if r.get("status") == "ok" and "metrics" in r]
    out_path = Path(out)
    figures = Path(out_dir) / "figures"
    by_task: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_task[(record["task"]["name"], digest(record["task"]["config"]))].append(record)
    lines = ["# Leaderboard", "",
             f"Generated by `python -m bench leaderboard out_dir={out_dir}` from {len(records)} run "
             "records. Bayes gap = held-out loss of the model − loss of the task's exact Bayes "
             "predictor on the same sequences (or of its clairvoyant bound, where the table says "
             "`bound`). Relative gap = gap / reference loss. State = floats carried to continue "
             "a sequence.", ""]
    for (task_name, task_digest), runs in sorted(by_task.items()):
        figure = figures / f"{task_name}-{task_digest}.png"
        link = os.path.relpath(figure, out_path.resolve().parent if out_path.parent != Path("")
                               else Path.cwd())
        lines += task_section(f"{task_name} [{task_digest}]", runs, figure,
                              Path(os.path.relpath(figure.resolve(), out_path.resolve().parent))
                              .as_posix() if link else link)
    out_path.write_text("\n".join(lines))
    return str(out_path), len(records)
