"""`python -m bench claims plan`: for every open claim, what would decide it and its price: the seeds
a power estimate says would decide an undecided claim (and the suite file that makes them), the
steps of a control that did not train, the runs of a claim with no records."""
import math

import pytest
import yaml

from bench.cli.main import main
from bench.reports.claims.plan import MAX_SEEDS, seeds_to_decide
from bench.config import load_suite
from test_claims import MAMBA, NOCONV, put, record, rules_file
from tasks.stats import t_quantile


def sharp_record(*args, **kwargs) -> dict:
    """test_claims' record with a model gap whose own (held-out) interval is ±1e-6: what the
    plan asks of seeds, with a held-out set that adds next to nothing."""
    rec = record(*args, **kwargs)
    gap = rec["metrics"]["bayes_gap"]
    rec["metrics"]["bayes_gap_ci"] = [gap - 1e-6, gap + 1e-6]
    return rec


def test_seeds_to_decide_is_the_first_n_whose_interval_clears_the_difference():
    # 3 seeds, per-seed spread 1, mean difference 0.9: half-width t(n-1)/sqrt(n) < 0.9 first at
    n = seeds_to_decide(0.9, t_quantile(2) / math.sqrt(3), 3)
    assert t_quantile(n - 1) / math.sqrt(n) < 0.9 <= t_quantile(n - 2) / math.sqrt(n - 1)
    assert seeds_to_decide(0.0, 1.0, 3) is None  # no effect: no seeds decide it
    assert seeds_to_decide(0.01, 1.0, 3) is None  # more than MAX_SEEDS
    assert seeds_to_decide(0.5, 0.1, 1) == 3  # one seed: seeds to estimate a spread
    assert MAX_SEEDS == 30
    # the held-out set's half-width does not shrink with seeds: with it, more seeds are needed,
    # and where it alone reaches the difference none decide
    with_held_out = seeds_to_decide(0.9, t_quantile(2) / math.sqrt(3), 3, held_out_half=0.5)
    assert with_held_out > n
    assert math.hypot(t_quantile(with_held_out - 1) / math.sqrt(with_held_out), 0.5) < 0.9
    assert seeds_to_decide(0.9, t_quantile(2) / math.sqrt(3), 3, held_out_half=0.9) is None


def test_plan_lists_undecided_claims_and_writes_a_suite_of_their_seeds(tmp_path, capsys):
    """noconv >= 5 x mamba on 3 seeds, paired difference +0.0006 with a spread that leaves it
    open: the plan adds seeds 3.. of both models, priced at their records' wall time, and the
    suite file it writes composes."""
    out = tmp_path / "r"
    mamba = [0.001, 0.002, 0.0015]
    noconv = [5 * m + d for m, d in zip(mamba, (0.0002, 0.0014, 0.0002))]
    put(out, *(sharp_record(MAMBA, seed=s, gap=g, wall_time_s=60.0) for s, g in enumerate(mamba)),
        *(sharp_record(NOCONV, seed=s, gap=g, wall_time_s=30.0) for s, g in enumerate(noconv)))
    rules = rules_file(tmp_path, rule="noconv >= 5 * mamba", control="mamba <= 0.05")
    suite = tmp_path / "plan.yaml"
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}", f"out={suite}"]) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("| t-conv"))
    seeds = int(row.split(" | ")[3].split("→")[1])
    assert seeds > 3 and f"| {2 * (seeds - 3)} |" in row
    entries = load_suite(str(suite))
    assert len(entries) == 2 * (seeds - 3)
    assert [*MAMBA, "seed=3"] in entries and [*NOCONV, f"seed={seeds - 1}"] in entries
    assert f"{(seeds - 3) * 90 / 60:.0f} min" in row  # 60 s + 30 s per added seed
    # within a budget too small for it, nothing is chosen and the suite is empty
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}", f"out={suite}",
                 "budget_h=0.001"]) == 0
    assert "(over the budget)" in capsys.readouterr().out
    assert yaml.safe_load(suite.read_text())["runs"] == []


def test_a_comparison_with_a_reference_is_priced_with_its_held_out_noise_apart(tmp_path, capsys):
    """`mamba <= 0.1 * unigram` pairs seeds and adds the reference's held-out noise (it was read as
    a one-seed comparison: "3 → 3, 0 runs"): the plan asks for more seeds than 3, and the
    suite's runs are mamba's."""
    out = tmp_path / "r"
    gaps = [0.0062, 0.0078, 0.0070]  # against 0.1 x 0.08: open on 3 seeds, decided on more
    records = [sharp_record(MAMBA, seed=s, gap=g, wall_time_s=60.0) for s, g in enumerate(gaps)]
    for rec in records:  # the reference's own interval: its held-out noise, ±1e-5 after x 0.1
        rec["metrics"]["gap_ci"]["unigram"] = [0.0799, 0.0801]
    put(out, *records)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES_REFERENCE)
    suite = tmp_path / "plan.yaml"
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}", f"out={suite}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-ref"))
    seeds = int(row.split(" | ")[3].split("→")[1])
    assert seeds > 3 and f"| {seeds - 3} |" in row
    assert load_suite(str(suite)) == [[*MAMBA, f"seed={s}"] for s in range(3, seeds)]


RULES_REFERENCE = """\
paper: "000"
title: A test paper
claims:
  - id: t-ref
    section: "Fig. 1"
    claim: Mamba learns.
    paper_number: it learns
    where: [task=markov, trainer.max_steps=1000, trainer.lr=0.01, model=mamba]
    measure:
      mamba: {}
      unigram: {metric: metrics.gap.unigram}
    kind: attainment
    rule: "mamba <= 0.1 * unigram"
    scale: paper
    command: python -m bench suite name=leaderboard
"""


def test_a_control_that_did_not_train_and_a_claim_without_records_are_priced(tmp_path, capsys):
    """Not reached: twice the steps of the control's model's runs (its 3 records of 60 s: 6 min);
    not measured: three seeds of the missing config, timed from the records of the same task and
    model at other settings (60 s for 1000 steps: 2000 steps cost 2 min a seed)."""
    out = tmp_path / "r"
    put(out, *(record(MAMBA, seed=s, gap=0.2, wall_time_s=60.0) for s in range(3)),
        *(record(NOCONV, seed=s, gap=0.3, wall_time_s=60.0) for s in range(3)))
    rules = rules_file(tmp_path, control="mamba <= 0.05")
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-conv"))
    assert "not reached at reduced scale" not in row  # scale: paper gives undecided ...
    rules = rules_file(tmp_path, control="mamba <= 0.05", scale="cpu")
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-conv"))
    assert "not reached at reduced scale" in row and "3 runs of mamba at 2×" in row
    assert row.endswith("| 6 min |")
    longer = [a.replace("max_steps=1000", "max_steps=2000") for a in MAMBA]
    extra = ("  - id: t-missing\n    section: \"Fig. 2\"\n    claim: Longer.\n"
             "    paper_number: n/a\n    measure:\n"
             f"      m: {{where: [{', '.join(longer)}]}}\n"
             "    kind: attainment\n    rule: \"m <= 0.01\"\n    scale: cpu\n"
             "    command: python -m bench suite name=leaderboard\n")
    rules.write_text(rules.read_text() + extra)
    suite = tmp_path / "plan.yaml"
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}", f"out={suite}"]) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("| t-missing"))
    assert "| not measured |" in row and "| 0 → 3 | 3 | 6 min |" in row
    assert [*longer, "seed=2"] in load_suite(str(suite))
    assert "2 open claims (0 undecided, 1 not reached at reduced scale, 1 not measured)" in printed


@pytest.mark.parametrize("earlier, later, advice, cost", [
    (0.09, 0.06, "at 2× their steps", "| 6 min |"),  # 2^(0.01 / 0.03): 1.3× would do; 2× is least
    (0.10, 0.08, "at 3× their steps", "| 9 min |"),  # 2^(0.03 / 0.02) = 2.8×
    (0.30, 0.29, "at that rate over 1,000× the steps", "| — |"),  # 2^(0.24 / 0.01)
    (0.30, 0.2999, "at that rate over 1,000× the steps", "| — |"),  # 2^2499: no overflow
    (0.29, 0.30, "at that rate never, as it got no closer", "| — |"),
])
def test_more_steps_are_asked_for_as_far_as_the_steps_so_far_have_helped(
        tmp_path, capsys, earlier, later, advice, cost):
    """A control (mamba <= 0.05) that did not train at 1,000 steps, where the records also have
    500: its gap a doubling of steps took off says how many steps it would need, going on at
    that rate; where that is beyond MAX_STEPS_FACTOR, or the gap did not fall, more steps are
    not what the plan asks for."""
    out = tmp_path / "r"
    half = [a.replace("max_steps=1000", "max_steps=500") for a in MAMBA]
    jitter = (-0.001, 0.0, 0.001)
    put(out, *(sharp_record(half, seed=s, gap=earlier + j, wall_time_s=30.0)
               for s, j in enumerate(jitter)),
        *(sharp_record(MAMBA, seed=s, gap=later + j, wall_time_s=60.0) for s, j in enumerate(jitter)),
        *(sharp_record(NOCONV, seed=s, gap=0.3, wall_time_s=60.0) for s in range(3)))
    rules = rules_file(tmp_path, control="mamba <= 0.05", scale="cpu")
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-conv"))
    assert "not reached at reduced scale" in row
    assert f"so far `mamba` {earlier:.4g} at 500 → {later:.4g} at 1,000 steps" in row
    assert advice in row and row.endswith(cost)


def curve(at_half: float, at_end: float, points: int = 100) -> list[list[float]]:
    """A logged training curve (every 10 steps) whose tenth ending halfway averages at_half and
    whose last tenth averages at_end; the points between are far off, to show they are unread."""
    losses = [9.0] * points
    tenth = points // 10
    losses[points // 2 - tenth:points // 2] = [at_half - 0.01, at_half + 0.01] * (tenth // 2)
    losses[-tenth:] = [at_end + 0.02, at_end - 0.02] * (tenth // 2)
    return [[10 * i, v] for i, v in enumerate(losses)]


def test_the_training_loss_halfway_and_at_the_end_are_the_means_of_their_tenths():
    from bench.reports.claims.verdicts import final_train_loss
    rec = {"train": {"loss_curve": curve(0.7, 0.5)}}
    assert final_train_loss(rec) == pytest.approx(0.5)
    assert final_train_loss(rec, upto=0.5) == pytest.approx(0.7)
    # a short curve: a window of one point, ending at the point halfway through
    rec = {"train": {"loss_curve": [[0, 3.0], [10, 2.0], [20, 1.0]]}}
    assert final_train_loss(rec) == 1.0 and final_train_loss(rec, upto=0.5) == 2.0
    assert final_train_loss({"train": {}}, upto=0.5) is None


@pytest.mark.parametrize("at_half, at_end, advice, cost", [
    (0.59, 0.56, "at 2× their steps", "| 6 min |"),  # gap 0.06 -> 0.03: 2^(0.01 / 0.03)
    (0.60, 0.58, "at 3× their steps", "| 9 min |"),  # gap 0.10 -> 0.08: 2^(0.03 / 0.02)
    (0.59, 0.58, "at 8× their steps", "| 24 min |"),  # gap 0.09 -> 0.08: 2^(0.03 / 0.01)
    (0.62, 0.61, "at that rate about 64× the steps", "| — |"),  # 2^(0.06 / 0.01)
    (0.58, 0.59, "at that rate never, as it got no closer", "| — |"),
])
def test_with_one_budget_more_steps_are_asked_for_as_far_as_its_training_curve_fell(
        tmp_path, capsys, at_half, at_end, advice, cost):
    """A control (mamba <= 0.05) that did not train at 1,000 steps, with records at no other
    budget: what its training loss fell from halfway to the end, added to its gap now, stands
    for its gap at 500 steps, and the plan reads the rate of a doubling from that."""
    out = tmp_path / "r"
    gap = at_end - 0.5  # the held-out loss, 0.5 + gap, where the training loss ended
    records = [sharp_record(MAMBA, seed=s, gap=gap + j, wall_time_s=60.0)
               for s, j in enumerate((-0.001, 0.0, 0.001))]
    for rec in records:
        rec["train"]["loss_curve"] = curve(at_half, at_end)
    put(out, *records, *(sharp_record(NOCONV, seed=s, gap=0.3, wall_time_s=60.0) for s in range(3)))
    rules = rules_file(tmp_path, control="mamba <= 0.05", scale="cpu")
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-conv"))
    assert f"so far `mamba`'s training loss {at_half:.4g} at 500 → {at_end:.4g} at 1,000" in row
    assert advice in row and row.endswith(cost)
    # a run without a curve leaves the rate unknown: twice the steps, as before
    del records[0]["train"]["loss_curve"]
    put(out, records[0])
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-conv"))
    assert "so far" not in row and "at 2× their steps" in row and row.endswith("| 6 min |")


def test_seeds_that_split_on_the_bar_are_said_to_and_get_no_power_estimate(tmp_path, capsys):
    """Three seeds far below the bar and three far above, each decided on its own held-out
    interval: the mean's interval holds the bar, and the plan says the seeds split (which) rather
    than pricing seeds for the mean; seeds that agree (each holds on its own interval, their
    mean is open on the seeds' spread) get the power estimate."""
    out = tmp_path / "r"
    gaps = [0.001, 0.0012, 0.0011, 0.02, 0.021, 0.019]
    put(out, *(record(MAMBA, seed=s, gap=g) for s, g in enumerate(gaps)),
        *(record(NOCONV, seed=s, gap=0.3) for s in range(6)))
    rules = rules_file(tmp_path, rule="mamba <= 0.01", control="noconv >= 0.1", scale="cpu")
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-conv"))
    assert "| undecided |" in row
    assert ("its seeds split, 3 of 6 holding (seeds 0, 1, 2) and 3 failing (3, 4, 5) on their "
            "own held-out intervals") in row
    out = tmp_path / "agree"
    put(out, *(sharp_record(MAMBA, seed=s, gap=g)
               for s, g in enumerate([0.002, 0.0098, 0.003, 0.0097, 0.0025, 0.0096])),
        *(sharp_record(NOCONV, seed=s, gap=0.3) for s in range(6)))
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-conv"))
    assert "| undecided |" in row and "split" not in row and "| 6 → 7 |" in row


@pytest.mark.parametrize("gaps, says", [
    ([0.005, 0.005, 0.02], "it holds on seeds 0, 1 and fails on seed 2, each on its own held-out "
     "interval, so a claim about each run stays undecided"),
    ([0.005, 0.005, 0.0095], "seed 2 is open on its own held-out interval: more held-out "
     "sequences (trainer.eval_sequences), about 14× the 512 (7,394 sequences) at these "
     "differences, would decide them; more seeds would not")])
def test_a_claim_judged_seed_by_seed_says_whether_sequences_would_decide_it(tmp_path, capsys,
                                                                            gaps, says):
    """Seeds that trained and disagree leave a per-seed claim undecided for good; a seed open on
    its own interval (0.0095 against 0.01, ±0.0019) closes with more held-out sequences: (0.0019
    / 0.0005)² = 14.4 times the claim's 512, were the difference what it is."""
    out = tmp_path / "r"
    put(out, *(record(MAMBA, seed=s, gap=g) for s, g in enumerate(gaps)),
        *(record(NOCONV, seed=s, gap=0.3) for s in range(3)))
    rules = rules_file(tmp_path, rule="mamba <= 0.01", control="noconv >= 0.1", scale="cpu",
                       extra="    per_seed: true\n")
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-conv"))
    assert "| undecided |" in row and says in row


@pytest.mark.parametrize("args, message", [
    (["budget_h=abc"], "budget_h: invalid value 'abc'"),
    (["budget_h=-1"], "budget_h: invalid value '-1'"),
    (["out=plan.txt"], "must be a suite file ending in .yaml"),
    (["bogus=1"], "unknown argument 'bogus=1'"),
])
def test_plan_arguments_are_checked(tmp_path, capsys, args, message):
    put(tmp_path / "r", record(MAMBA))
    assert main(["claims", "plan", f"out_dir={tmp_path / 'r'}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_suite_lists_a_run_once_however_its_selectors_spell_it(tmp_path):
    """Two claims whose selectors order the same overrides differently ask for the same seeds:
    the suite file holds each run once (a suite refuses a run listed twice)."""
    from bench.reports.claims.plan import Need, suite_yaml
    one = tuple(MAMBA)
    other = tuple(reversed(MAMBA))
    needs = [Need("a", "undecided", [], 3, 4, runs={(one, 3): 60.0}),
             Need("b", "undecided", [], 3, 4, runs={(other, 3): 60.0})]
    path = tmp_path / "s.yaml"
    path.write_text(suite_yaml(needs, "test"))
    assert len(load_suite(str(path))) == 1


def test_an_attainment_judged_on_the_run_that_trained_best_asks_for_held_out_sequences(
        tmp_path, capsys):
    """judge_seed: the seed whose training loss ended lowest (seed 1, gap 0.0095 with its own
    interval [0.0076, 0.0114] about the 0.01 bar) decides; more seeds would not narrow that
    interval, more held-out sequences would: the plan says so and adds no runs."""
    out = tmp_path / "r"
    records = [record(MAMBA, seed=s, gap=g) for s, g in enumerate([0.08, 0.0095, 0.09])]
    for rec, ended in zip(records, [0.7, 0.4, 0.71]):
        rec["train"]["loss_curve"] = [[0, 5.0], [10, ended + 1.0], [20, ended]]
    put(out, *records)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES_REFERENCE.replace('rule: "mamba <= 0.1 * unigram"',
                                             'rule: "mamba <= 0.01"\n    judge_seed: mamba'))
    assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| t-ref"))
    assert "| undecided |" in row and "more held-out sequences" in row and "| — |" in row


def test_a_gpu_claim_on_a_corpus_this_machine_lacks_says_both(tmp_path, monkeypatch, capsys):
    """A GPU claim with no records: a GPU, and WikiText-103 while its folder holds no file (a
    GPU alone does not run it where no hub is reachable); with the files there, a GPU alone."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r"
    put(out, *(record(MAMBA, seed=s, gap=0.2, wall_time_s=60.0) for s in range(3)))
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "paper: \"000\"\ntitle: A test paper\nclaims:\n  - id: t-text\n    section: \"T1\"\n    claim: Text.\n"
        "    paper_number: n/a\n    measure:\n"
        "      m: {where: [task=wikitext103, model=mamba_lm14m, trainer=lm], "
        "metric: metrics.perplexity.model}\n"
        "    kind: attainment\n    rule: \"m <= 30\"\n    scale: paper\n    gpu: true\n"
        "    command: python -m bench suite name=paper000_text\n")

    def row() -> str:
        assert main(["claims", "plan", f"out_dir={out}", f"rules={rules}"]) == 0
        return next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("| t-text"))
    assert ("a GPU (its command runs on one), and wikitext-103 (data/wikitext-103/), which is "
            "not on this machine (its files in that folder") in row()
    (tmp_path / "data" / "wikitext-103").mkdir(parents=True)
    (tmp_path / "data" / "wikitext-103" / "wiki.train.raw").write_text("text\n")
    assert "not by seeds: a GPU (its command runs on one) |" in row()
