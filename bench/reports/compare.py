"""python -m bench compare A B: two runs' models on the same held-out sequences, paired.

Every run of a task configuration is scored on the same held-out sequences: they are drawn from
a seed of the test split alone, never the run's seed (Task.held_out), and a record's
metrics.held_out_digest says which sequences it scored. The difference of two models' mean
losses, which is the difference of their gaps (the reference cancels), then has a bootstrap
interval over sequences of the per-sequence differences: far narrower than either gap's own
interval when the two models find the same sequences hard. The same is done for each context
length band of the records (bench/training/evaluate.py BAND_STARTS), where short contexts often
separate models that the full average does not."""
from __future__ import annotations

import itertools
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.config import ConfigError, TrainerConfig, compose
from bench.config.formats import fmt_sig
from bench.records.store import read_record, read_records, record_matches
from tasks.stats import across_seeds, paired_difference


def load(path: str) -> dict:
    """The `ok` run record at path with what a paired comparison needs; ConfigError (one line,
    exit 2) when it is not one."""
    if not Path(path).is_file():
        raise ConfigError(f"compare: {path}: no such record file")
    record, reason = read_record(Path(path))
    if record is None:
        raise ConfigError(f"compare: {path}: {reason}")
    if record.get("status") != "ok":
        why = f" ({record['reason']})" if record.get("reason") else ""
        raise ConfigError(f"compare: {path}: a {record.get('status')!r} run record{why}; only "
                          "ok runs have held-out losses to compare")
    metrics = record.get("metrics")
    if isinstance(metrics, dict) and metrics.get("scoring") == "perplexity":
        raise ConfigError(f"compare: {path}: a text record; text is scored per token over the "
                          "whole split (perplexity), not per sequence, so its runs do not pair "
                          "by sequence")
    if not isinstance(record.get("per_sequence"), dict) or "held_out_digest" not in metrics:
        raise ConfigError(f"compare: {path} has no per-sequence losses (written before bench "
                          "compare existed); re-run it, or re-evaluate its weights with python "
                          "-m bench eval weights=<file>")
    if not well_formed(record):
        raise ConfigError(f"compare: {path}: malformed per_sequence or metrics.gap_by_band")
    return record


def well_formed(record: dict) -> bool:
    """Whether per_sequence holds one number (or null, in a band) per held-out sequence."""
    n = record["metrics"].get("sequences")
    per_sequence = record["per_sequence"]

    def numbers(values, nullable: bool) -> bool:
        return (isinstance(values, list) and len(values) == n
                and all((v is None and nullable) or (isinstance(v, (int, float))
                                                     and not isinstance(v, bool)) for v in values))
    try:
        bands = per_sequence["bands"]
        band_loss = per_sequence["band_loss"]["model"]
        return (numbers(per_sequence["loss"]["model"], nullable=False)
                and isinstance(bands, list) and isinstance(band_loss, list)
                and len(bands) == len(band_loss) == len(record["metrics"]["gap_by_band"])
                and all(numbers(values, nullable=True) for values in band_loss))
    except (KeyError, TypeError):
        return False


def verdict(paired: dict, name_a: str = "A", name_b: str = "B") -> str:
    """Which side is better (the lower loss) when the interval of B − A is clear of 0."""
    lo, hi = paired["ci"]
    if lo > 0:
        return f"{name_a} better"  # B's loss is higher on these sequences
    if hi < 0:
        return f"{name_b} better"
    if "seeds" in paired:
        return f"not distinguishable at {paired['seeds']} seeds"
    return f"not distinguishable at {paired['sequences']} sequences"


def names(a: dict, b: dict) -> tuple[str, str]:
    """What a verdict calls the two runs: their model names, with seeds or A/B where those are
    the same."""
    name_a, name_b = a["model"]["name"], b["model"]["name"]
    if name_a != name_b:
        return name_a, name_b
    if a["seed"] != b["seed"]:
        return f"{name_a} (seed {a['seed']})", f"{name_b} (seed {b['seed']})"
    return "A", "B"


def resamples_of(record: dict) -> int:
    """The record's trainer.bootstrap, or the default where a record has none usable."""
    given = record["trainer"]["config"].get("bootstrap")
    return given if type(given) is int and given >= 1 else TrainerConfig.bootstrap


def label(record: dict) -> str:
    return (f"{record['model']['name']}, seed {record['seed']}, {record['train']['steps']} steps "
            f"({record.get('run_id')})")


def compare(path_a: str, path_b: str) -> dict:
    """The paired comparison of two records: overall and per context-length band."""
    a, b = load(path_a), load(path_b)
    if os.path.samefile(path_a, path_b):  # a run against itself: zero by construction
        raise ConfigError(f"compare: {path_a} and {path_b} are the same file; give two runs")
    if a["metrics"]["held_out_digest"] != b["metrics"]["held_out_digest"]:
        raise ConfigError("compare: the two records scored different held-out sets (another task "
                          "configuration or eval_sequences); their sequences do not pair")
    # the runs' own number of resamples (the larger: more never hurt)
    resamples = max(resamples_of(a), resamples_of(b))
    rows = [{"positions": "all", "gap_a": a["metrics"]["bayes_gap"],
             "gap_b": b["metrics"]["bayes_gap"],
             "paired": paired_difference(a["per_sequence"]["loss"]["model"],
                                         b["per_sequence"]["loss"]["model"], resamples)}]
    same_bands = a["per_sequence"]["bands"] == b["per_sequence"]["bands"]
    if same_bands:
        for i, band in enumerate(a["per_sequence"]["bands"]):
            rows.append({"positions": f"{band[0]}–{band[1]}",
                         "gap_a": a["metrics"]["gap_by_band"][i]["gap"],
                         "gap_b": b["metrics"]["gap_by_band"][i]["gap"],
                         "paired": paired_difference(a["per_sequence"]["band_loss"]["model"][i],
                                                     b["per_sequence"]["band_loss"]["model"][i],
                                                     resamples)})
    return {"a": a, "b": b, "rows": rows, "same_bands": same_bands,
            "same_run": a["run_id"] == b["run_id"]}


def print_comparison(result: dict) -> None:
    a, b = result["a"], result["b"]
    m = a["metrics"]
    print(f"A: {label(a)}\nB: {label(b)}")
    if result.get("same_run"):
        print("(A and B are records of the same run — a copy, or a record and its edit)")
    print(f"task {a['task']['name']}: {m['sequences']} held-out sequences, the same in both "
          f"(digest {m['held_out_digest'][:12]}); gap = loss − loss of '{m['gap_reference']}'")
    name_a, name_b = names(a, b)
    print(f"{'positions':<11}{'gap A':>11}{'gap B':>11}{'B − A':>12}{'95% paired CI':>26}  "
          "verdict")
    for row in result["rows"]:
        paired = row["paired"]
        if paired is None:
            print(f"{row['positions']:<11}{'-':>11}{'-':>11}{'-':>12}{'-':>26}  "
                  "no scored position in this band")
            continue
        lo, hi = paired["ci"]
        print(f"{row['positions']:<11}{fmt_sig(row['gap_a']):>11}{fmt_sig(row['gap_b']):>11}"
              f"{fmt_sig(paired['difference']):>12}"
              f"{'[' + fmt_sig(lo) + ', ' + fmt_sig(hi) + ']':>26}  "
              f"{verdict(paired, name_a, name_b)}")
    reference_a, reference_b = (r["metrics"]["loss"].get(m["gap_reference"]) for r in (a, b))
    same_reference = (b["metrics"]["gap_reference"] == m["gap_reference"]
                      and reference_a == reference_b)
    if not same_reference:
        print("(the records' gap references differ (another task config or code version): gap A "
              "and gap B are to different references; B − A still compares the models' losses)")
    if not result["same_bands"]:
        print("(the records' context-length bands differ (other code versions): overall only)")
    equals_gaps = ", = gap B − gap A" if same_reference else ""
    print(f"(B − A: difference of the models' mean losses{equals_gaps}; the interval is a "
          "bootstrap over the paired sequences)")


@dataclass
class Selection:
    """What `compare <settings>` names: the setting varied (key) and its values, each value's
    `ok` training records in out_dir (evaluations aside), and the seed asked for, if any."""

    key: str
    values: list[str]
    shared: list[str]
    records: list[list[dict]]
    seed: int | None
    out_dir: str

    def seeds(self) -> list[set[int]]:
        return [{r["seed"] for r in side} for side in self.records]

    def newest(self, side: list[dict], seed: int) -> dict:
        return max((r for r in side if r["seed"] == seed), key=lambda r: r["run_id"][-22:])


def select(argv: list[str]) -> Selection:
    """Parse `compare task=lgssm_colored model=mamba,transformer[,...] [seed=N] [out_dir=runs]
    ...`: one override holds the values compared (commas between them), the others are shared;
    each value's records are its config's `ok` training records in out_dir."""
    options: dict[str, str] = {}
    for key, value in (arg.split("=", 1) for arg in argv):
        if key in options:  # as every other command: not the last value silently
            raise ConfigError(f"compare: '{key}' is given twice; give each key once")
        options[key] = value
    out_dir = options.pop("out_dir", "runs")
    seed = options.pop("seed", None)
    # plain ASCII digits: str.isdigit also takes '²' (which int() refuses) and '１'
    if seed is not None and not re.fullmatch(r"[0-9]+", seed):
        raise ConfigError(f"compare: seed must be a number, got '{seed}'")
    varied = [key for key, value in options.items() if "," in value]
    values = options[varied[0]].split(",") if len(varied) == 1 else []
    if len(varied) != 1 or len(values) < 2 or len(set(values)) != len(values) or "" in values:
        raise ConfigError("compare by selection needs one setting with the values compared, "
                          "e.g. model=mamba,transformer (the others shared); got "
                          f"{' '.join(argv) or 'none'}")
    key = varied[0]
    shared = [f"{k}={v}" for k, v in options.items() if k != key]
    configs = [compose([*shared, f"{key}={value}"]) for value in values]
    if not Path(out_dir).is_dir():
        raise ConfigError(f"compare: out_dir '{out_dir}' is not a directory")
    records, bad = read_records(out_dir)
    for path, reason in bad:  # a damaged newest record must not let an older one stand in unsaid
        print(f"warning: skipped {path}: {reason}", file=sys.stderr)
    found = [[r for r in records if r["status"] == "ok" and r.get("origin") != "eval"
              and record_matches(r, config)] for config in configs]
    for side, value in zip(found, values):
        if not side:
            raise ConfigError(f"compare: no ok run record of {key}={value} "
                              f"{' '.join(shared)} in {out_dir}".rstrip())
    return Selection(key, values, shared, found, int(seed) if seed is not None else None,
                     out_dir)


def by_seeds(selection: Selection) -> bool:
    """Whether the selection is compared across seeds (every value has at least two seeds in
    common, and no seed was asked for) rather than one pair of runs by sequence."""
    common = set.intersection(*selection.seeds())
    return selection.seed is None and (len(common) >= 2 or len(selection.values) > 2)


def select_pair(selection: Selection) -> tuple[str, str]:
    """The two records a two-value selection names: on the given seed, else on the newest seed
    both have."""
    if len(selection.values) != 2:
        raise ConfigError(f"compare: seed= pairs two runs by sequence; "
                          f"{selection.key}={','.join(selection.values)} names "
                          f"{len(selection.values)}: leave seed= out to compare them across "
                          "seeds")
    found, seeds = selection.records, selection.seeds()
    if selection.seed is not None:
        chosen = selection.seed
        if not all(chosen in s for s in seeds):
            raise ConfigError(f"compare: seed {chosen} has no record on both sides (seeds "
                              f"{sorted(seeds[0])} and {sorted(seeds[1])})")
    else:
        common = seeds[0] & seeds[1]
        if not common:
            raise ConfigError(f"compare: the two sides share no seed (seeds {sorted(seeds[0])} "
                              f"and {sorted(seeds[1])}): runs of one seed pair")
        chosen = max(common, key=lambda s: max(r["run_id"][-22:] for side in found
                                               for r in side if r["seed"] == s))
    newest = [selection.newest(side, chosen) for side in found]
    return newest[0]["_path"], newest[1]["_path"]


def held_out_half(side_a: list[dict], side_b: list[dict], resamples: int) -> float | None:
    """The half-width that the held-out set's sampling adds to the seed-paired difference B − A
    (the t-interval of the per-seed differences is conditional on the one held-out set every run
    is scored on): a bootstrap over the sequences of the per-sequence differences averaged over
    the seeds; None where a record keeps no per-sequence losses."""
    if not all(isinstance(r.get("per_sequence"), dict) and well_formed(r)
               for r in side_a + side_b):
        return None
    def averaged(side: list[dict]) -> list[float]:  # each sequence's loss, the mean over seeds
        columns = zip(*(r["per_sequence"]["loss"]["model"] for r in side))
        return [sum(column) / len(column) for column in columns]

    lo, hi = paired_difference(averaged(side_a), averaged(side_b), resamples)["ci"]
    return (hi - lo) / 2


def own_half(side: list[dict]) -> float | None:
    """The mean half-width of the records' own (held-out) intervals of their gap: at least the
    held-out noise of their mean over seeds, all scored on one set; None where one lacks it."""
    halves = []
    for record in side:
        interval = record["metrics"].get("bayes_gap_ci")
        if not (isinstance(interval, list) and len(interval) == 2
                and all(isinstance(x, (int, float)) and math.isfinite(x) for x in interval)):
            return None
        halves.append((interval[1] - interval[0]) / 2)
    return sum(halves) / len(halves)


def compare_across_seeds(selection: Selection) -> dict:
    """Every value's mean gap over the seeds all values share (newest record of each) with its
    95% t-interval, and every pair's seed-paired difference of gaps (the runs of one seed saw the
    same training batches' seed and the same held-out sequences) with the t-interval of the
    per-seed differences widened by the held-out set's noise (held_out_half, added in
    quadrature, as claims do), and a verdict naming the better one."""
    common = sorted(set.intersection(*selection.seeds()))
    if len(common) < 2:
        raise ConfigError(f"compare: {selection.key}={','.join(selection.values)} share "
                          f"{len(common)} seed{'s' if len(common) != 1 else ''} "
                          f"({', '.join(map(str, common)) or 'none'}); a comparison across seeds "
                          "needs two (or give seed=N with two values, to pair by sequence)")
    runs = [[selection.newest(side, seed) for seed in common] for side in selection.records]
    digests = {r["metrics"].get("held_out_digest") for side in runs for r in side}
    if len(digests) != 1:
        raise ConfigError("compare: the records scored different held-out sets (another task "
                          "configuration or eval_sequences); their seeds do not pair")
    if any(not isinstance(r["metrics"].get("bayes_gap"), (int, float)) for side in runs
           for r in side):
        raise ConfigError("compare: a record without a Bayes gap (text is scored by perplexity "
                          "over the whole split); compare text runs on the leaderboard")
    gaps = [[float(r["metrics"]["bayes_gap"]) for r in side] for side in runs]
    models = []
    for value, side in zip(selection.values, gaps):
        mean, half = across_seeds(side)
        models.append({"value": value, "gap": mean, "ci": (mean - half, mean + half)})
    pairs = []
    resamples = max(resamples_of(r) for side in runs for r in side)
    for i, j in itertools.combinations(range(len(runs)), 2):
        mean, half = across_seeds([b - a for a, b in zip(gaps[i], gaps[j])])
        held_out, unpaired = held_out_half(runs[i], runs[j], resamples), False
        if held_out is None:  # no per-sequence losses: the records' own intervals, unpaired
            halves = [own_half(runs[i]), own_half(runs[j])]
            held_out = sum(halves) if None not in halves else None
            unpaired = held_out is not None
        if held_out is not None:
            half = math.hypot(half, held_out)
        paired = {"difference": mean, "ci": (mean - half, mean + half), "seeds": len(common),
                  "held_out": held_out, "held_out_unpaired": unpaired}
        pairs.append({"a": selection.values[i], "b": selection.values[j], "paired": paired,
                      "verdict": verdict(paired, selection.values[i], selection.values[j])})
    better = {v: sum(p["verdict"] == f"{v} better" for p in pairs) for v in selection.values}
    best = [v for v, n in better.items() if n == len(selection.values) - 1]
    return {"selection": selection, "seeds": common, "models": models, "pairs": pairs,
            "best": best[0] if best else None, "reference": runs[0][0]["metrics"].get(
                "gap_reference")}


def print_across_seeds(result: dict) -> None:
    selection = result["selection"]
    seeds = result["seeds"]
    print(f"{selection.key} = {', '.join(selection.values)}; {' '.join(selection.shared)}; "
          f"{len(seeds)} seeds in common ({', '.join(map(str, seeds))}), the newest ok record "
          f"of each in {selection.out_dir}; gap = loss − loss of '{result['reference']}' on the "
          "same held-out sequences")
    print("")
    print(f"| {selection.key} | gap | 95% CI (seeds) |")
    print("|---|---|---|")
    for model in result["models"]:
        lo, hi = model["ci"]
        print(f"| {model['value']} | {fmt_sig(model['gap'])} | [{fmt_sig(lo)}, {fmt_sig(hi)}] |")
    print("")
    print("| pair | B − A | 95% CI (paired by seed) | verdict |")
    print("|---|---|---|---|")
    for pair in result["pairs"]:
        lo, hi = pair["paired"]["ci"]
        print(f"| B = {pair['b']}, A = {pair['a']} | {fmt_sig(pair['paired']['difference'])} | "
              f"[{fmt_sig(lo)}, {fmt_sig(hi)}] | {pair['verdict']} |")
    print("")
    best = result["best"]
    print(f"best: {best} (better than every other, paired by seed)" if best else
          "best: none (no value is better than every other at these seeds)")
    pairs = [pair["paired"] for pair in result["pairs"]]
    widened = all(p["held_out"] is not None and not p["held_out_unpaired"] for p in pairs)
    bounded = all(p["held_out"] is not None for p in pairs)
    print("(B − A: the mean over seeds of the per-seed difference of gaps, with its 95% "
          "t-interval across seeds, " + (
              "widened by the held-out set's noise: a bootstrap over the sequences of the "
              "differences averaged over the seeds" if widened else
              "widened by the held-out set's noise, bounded unpaired by the records' own "
              "intervals where they keep no per-sequence losses (wider than paired: re-run "
              "them, or re-score their weights with `bench eval`, to pair)" if bounded else
              "given the one held-out set every run is scored on (records without per-sequence "
              "losses or intervals give no held-out noise to add)") +
          "; one seed's two runs compare by sequence with seed=N)")
