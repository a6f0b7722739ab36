"""Paired statistics in claims: a comparison is decided on its difference, seed by seed (a
t-interval across seeds) or, on one seed, over the held-out sequences (a paired bootstrap);
`abs(E) <= F` is an equivalence test (TOST); `per_seed` claims are judged seed by seed. Each
test plants records on which the paired rule decides where the unpaired one could not, and a
second set on which it goes the other way."""
import math

import pytest
import torch

from bench.reports.claims import Interval, Rule, load_claims
from bench.reports.claims.rules import Sample
from bench.reports.claims.verdicts import read_sequences
from test_claims import MAMBA, NOCONV, decide, put, record, rules_file
from test_claims_plan import RULES_REFERENCE as REFERENCE_RULE

SWITCH = """\
paper: "000"
claims:
  - id: t-switch
    section: "§5.1"
    claim: Mamba resets at switch tokens.
    paper_number: a_t = 0 at switches
    where: [task=markov, trainer.max_steps=1000, trainer.lr=0.01, model=mamba]
    measure:
      a_switch: {metric: metrics.probe.a_switch, range: [0, 1]}
    kind: attainment
    rule: "a_switch <= 0.1"
    scale: cpu
    per_seed: true
    command: python -m bench suite name=leaderboard
"""


def seeds(selector, gaps, **extra):
    return [record(selector, seed=s, gap=g, **extra) for s, g in enumerate(gaps)]


def sharp(records, half=1e-6):
    """records whose gap's own (held-out) interval is ±half: a held-out set that adds next to
    nothing to a comparison paired across seeds."""
    for rec in records:
        gap = rec["metrics"]["bayes_gap"]
        rec["metrics"]["bayes_gap_ci"] = [gap - half, gap + half]
    return records


def test_seeds_pair_where_the_intervals_of_the_means_overlap(tmp_path):
    """mamba varies 3x across seeds, and noconv with it: the two t-intervals overlap (unpaired:
    undecided), but the per-seed difference noconv - 5 mamba is +0.0005 on every seed."""
    mamba = [0.001, 0.002, 0.003, 0.0015, 0.0025]
    ahead = [5 * m + 0.0005 + 1e-5 * i for i, m in enumerate(mamba)]
    put(tmp_path / "up", *sharp(seeds(MAMBA, mamba)), *sharp(seeds(NOCONV, ahead)))
    rules = rules_file(tmp_path, rule="noconv >= 5 * mamba", control="mamba <= 0.05")
    [d] = decide(tmp_path / "up", rules)
    assert d.verdict == "holds"
    [control, test] = d.tests
    assert test.paired == "5 seeds; the held-out noise of mamba, noconv from their own " \
        "intervals, unpaired" and test.outcome is True
    assert test.difference == pytest.approx(0.0005 + 2e-5)
    # the worst-case interval arithmetic of the same means could not decide
    intervals = {n: Interval(*d.values[n].interval) for n in ("mamba", "noconv")}
    assert Rule("noconv >= 5 * mamba", intervals, "t").evaluate(intervals) is None
    # the other way: noconv 0.0005 below 5 x mamba on every seed
    behind = [5 * m - 0.0005 + 1e-5 * i for i, m in enumerate(mamba)]
    put(tmp_path / "down", *sharp(seeds(MAMBA, mamba)), *sharp(seeds(NOCONV, behind)))
    [d] = decide(tmp_path / "down", rules)
    assert d.verdict == "fails" and d.tests[-1].outcome is False


def test_seeds_not_shared_are_compared_unpaired_and_say_so(tmp_path):
    put(tmp_path / "r", *seeds(MAMBA, [0.001, 0.0012]),
        *(record(NOCONV, seed=s, gap=0.06) for s in (5, 6)))
    [d] = decide(tmp_path / "r", rules_file(tmp_path, rule="noconv >= 5 * mamba"))
    assert d.verdict == "holds" and d.tests[-1].paired == ""


def with_sequences(selector, model, references, seed=0, digest="d" * 64):
    """A record whose per-sequence losses are model's and each reference's (the metrics
    their means, with a percentile interval of the mean)."""
    losses = {"model": model, **references}
    rec = record(selector, seed=seed, gap=float((model - references["bayes"]).mean()))
    rec["metrics"]["loss"] = {n: float(v.mean()) for n, v in losses.items()}
    rec["metrics"]["loss_ci"] = {n: [float(v.mean() - 2 * v.std() / len(v) ** 0.5),
                                     float(v.mean() + 2 * v.std() / len(v) ** 0.5)]
                                 for n, v in losses.items()}
    rec["metrics"]["held_out_digest"] = digest
    rec["metrics"]["sequences"] = len(model)
    rec["per_sequence"] = {"bands": [], "loss": {n: v.tolist() for n, v in losses.items()}}
    return rec


EQUIVALENCE = """\
paper: "002"
claims:
  - id: t-gd
    section: "§4.1"
    claim: The model reaches the loss of the unigram reference.
    paper_number: equal
    where: [task=markov, trainer.max_steps=1000, trainer.lr=0.01, model=mamba]
    measure:
      model: {metric: metrics.loss.model}
      unigram: {metric: metrics.loss.unigram}
    kind: attainment
    rule: "abs(model - unigram) <= 0.05 * unigram"
    scale: cpu
    command: python -m bench suite name=leaderboard
"""


def test_one_seed_pairs_over_the_held_out_sequences(tmp_path):
    """Sequences differ 10x in difficulty, so each loss's own interval is wide (±~0.1); the
    model tracks the reference sequence by sequence, 2% above it: paired, the equivalence
    within 5% holds; 12% above, it fails (not reached, at reduced scale)."""
    generator = torch.Generator().manual_seed(0)
    hardness = torch.rand(256, generator=generator, dtype=torch.float64) * 2 + 0.2
    bayes = hardness * 0.9
    noise = torch.randn(256, generator=generator, dtype=torch.float64) * 0.002
    rules = tmp_path / "equal.yaml"
    rules.write_text(EQUIVALENCE)
    put(tmp_path / "near", with_sequences(MAMBA, hardness * 1.02 + noise,
                                          {"bayes": bayes, "unigram": hardness}))
    [d] = decide(tmp_path / "near", rules)
    assert d.verdict == "holds at reduced scale"
    assert [t.paired for t in d.tests] == ["256 sequences of seed 0"] * 2
    assert [t.text for t in d.tests] == ["model - unigram <= 0.05 * unigram",
                                         "-(model - unigram) <= 0.05 * unigram"]
    # the two losses' own intervals overlap the margin: unpaired, no decision
    intervals = {n: Interval(*d.values[n].interval) for n in ("model", "unigram")}
    assert Rule("abs(model - unigram) <= 0.05 * unigram", intervals, "t").evaluate(
        intervals) is None
    put(tmp_path / "far", with_sequences(MAMBA, hardness * 1.12 + noise,
                                         {"bayes": bayes, "unigram": hardness}))
    [d] = decide(tmp_path / "far", rules)
    assert d.verdict == "not reached at reduced scale" and d.tests[0].outcome is False


def test_held_out_sets_that_differ_are_not_paired(tmp_path):
    """Two records on different held-out sets (digests) are compared unpaired."""
    generator = torch.Generator().manual_seed(1)
    hard = torch.rand(64, generator=generator, dtype=torch.float64) + 0.5
    refs = {"bayes": hard * 0.9, "unigram": hard}
    put(tmp_path / "r", with_sequences(MAMBA, hard * 0.91, refs, digest="a" * 64),
        with_sequences(NOCONV, hard * 0.99, refs, digest="b" * 64))
    [d] = decide(tmp_path / "r", rules_file(tmp_path, rule="noconv >= mamba"))
    assert d.tests[-1].paired == ""


def test_the_bayes_gap_per_sequence_is_the_model_minus_the_gap_reference(tmp_path):
    rec = with_sequences(MAMBA, torch.tensor([1.0, 2.0]),
                         {"bayes": torch.tensor([0.5, 1.5]), "unigram": torch.tensor([3.0, 3.0])})
    [claim] = load_claims(rules_file(tmp_path))
    gap = claim.quantities["mamba"]  # metrics.bayes_gap
    digest, values = read_sequences(rec, gap)
    assert digest == "d" * 64 and values.tolist() == [0.5, 0.5]
    del rec["per_sequence"]["loss"]["bayes"]  # an older record: the model's losses only
    assert read_sequences(rec, gap) is None


@pytest.mark.parametrize("inner, margin, expected", [
    ((-0.01, 0.02), (0.05, 0.05), True),  # within ±0.05: equivalent
    ((0.06, 0.08), (0.05, 0.05), False),  # wholly beyond the margin
    ((-0.08, -0.06), (0.05, 0.05), False),  # wholly below -margin
    ((0.03, 0.07), (0.05, 0.05), None),  # straddles the margin
])
def test_abs_below_a_margin_is_two_one_sided_tests(inner, margin, expected):
    rule = Rule("abs(e) <= m", ["e", "m"], "t")
    outcome, tests = rule.decide({"e": Sample({}, Interval(*inner)),
                                  "m": Sample({}, Interval(*margin))})
    assert outcome is expected and [t.text for t in tests] == ["e <= m", "-e <= m"]
    # written the other way round it is the same test
    assert Rule("m >= abs(e)", ["e", "m"], "t").evaluate(
        {"e": Interval(*inner), "m": Interval(*margin)}) is expected
    # and `abs(e) > m`, its negation, is the or of the two
    assert Rule("abs(e) > m", ["e", "m"], "t").evaluate(
        {"e": Interval(*inner), "m": Interval(*margin)}) is (
        None if expected is None else not expected)


def test_a_ratio_is_paired_seed_by_seed_and_a_zero_divisor_is_undecided():
    rule = Rule("a / b >= 2", ["a", "b"], "t")
    samples = {"a": Sample({0: 2.2, 1: 4.4, 2: 6.6}, Interval(2.2, 6.6)),
               "b": Sample({0: 1.0, 1: 2.0, 2: 3.0}, Interval(1.0, 3.0))}
    outcome, [test] = rule.decide(samples)
    assert outcome is True and test.difference == pytest.approx(0.2)
    assert test.paired == "3 seeds; the held-out noise of a, b not counted (its records give it " \
        "no interval)"
    samples["b"] = Sample({0: 1.0, 1: 0.0, 2: 3.0}, Interval(0.0, 3.0))
    outcome, [test] = rule.decide(samples)
    assert outcome is None and math.isnan(test.difference)


def probe_records(values, half=0.001):
    """Records of a_switch on each seed, with its interval ±half (None: without one)."""
    out = []
    for seed, a in enumerate(values):
        rec = record(MAMBA, seed=seed)
        rec["metrics"]["probe"] = {"a_switch": a}
        if half is not None:
            rec["metrics"]["probe"]["a_switch_ci"] = [a - half, a + half]
        out.append(rec)
    return out


def test_a_number_without_an_interval_decides_nothing_unless_it_is_exact(tmp_path):
    """a_switch = 0.01 against 0.1, but its records give it no interval: its noise is unknown,
    so the comparison is undecided and says why; declared exact (a function of the weights
    alone), the point decides; with an interval, the interval does."""
    rules = tmp_path / "switch.yaml"
    rules.write_text(SWITCH)
    put(tmp_path / "bare", *probe_records([0.01, 0.02, 0.03], half=None))
    [d] = decide(tmp_path / "bare", rules)
    assert d.verdict == "undecided"
    assert d.note == ("per seed: 3 of 3 seeds undecided (0 ? / 1 ? / 2 ?); `a_switch <= 0.1` "
                      "(no interval: its records give a_switch none)")
    rules.write_text(SWITCH.replace("range: [0, 1]}", "range: [0, 1], exact: true}"))
    assert decide(tmp_path / "bare", rules)[0].verdict == "holds at reduced scale"
    rules.write_text(SWITCH)
    put(tmp_path / "wide", *probe_records([0.05, 0.05, 0.05], half=0.08))
    assert decide(tmp_path / "wide", rules)[0].verdict == "undecided"  # [0, 0.13] holds 0.1
    put(tmp_path / "narrow", *probe_records([0.05, 0.05, 0.05], half=0.01))
    assert decide(tmp_path / "narrow", rules)[0].verdict == "holds at reduced scale"


def test_an_unpaired_comparison_names_the_quantity_whose_noise_it_leaves_out():
    rule = Rule("a < b", ["a", "b"], "t")
    outcome, [test] = rule.decide({"a": Sample({0: 0.01}, Interval(0.005, 0.015)),
                                   "b": Sample({1: 0.05}, Interval.point(0.05), {}, False)})
    assert outcome is True and test.paired == ""
    assert test.note == ("; the held-out noise of b not counted (its records give it no "
                         "interval)")
    outcome, [test] = rule.decide({"a": Sample({0: 0.01}, Interval.point(0.01), {}, False),
                                   "b": Sample({1: 0.05}, Interval.point(0.05), {}, False)})
    assert outcome is None and test.why == "no interval: its records give a, b none"


def test_a_claim_about_each_run_counts_seeds(tmp_path):
    """The mean of bimodal seeds (0.06 / 0.995 / 0.987) says nothing about any run: judged seed
    by seed, one of three holds — undecided, and the row says so; on every seed it holds, on
    none it is not reached."""
    rules = tmp_path / "switch.yaml"
    rules.write_text(SWITCH)
    put(tmp_path / "mixed", *probe_records([0.06, 0.995, 0.987]))
    [d] = decide(tmp_path / "mixed", rules)
    assert d.verdict == "undecided"
    assert d.note == ("per seed: 1 of 3 seeds holds at reduced scale, 2 of 3 seeds not reached "
                      "at reduced scale (0 ✓ / 1 not reached / 2 not reached)")
    put(tmp_path / "all", *probe_records([0.06, 0.01, 0.02]))
    assert decide(tmp_path / "all", rules)[0].verdict == "holds at reduced scale"
    put(tmp_path / "none", *probe_records([0.9, 0.95, 0.99]))
    assert decide(tmp_path / "none", rules)[0].verdict == "not reached at reduced scale"


def test_references_alone_are_not_paired_across_seeds():
    """References are the same on every seed: their seed-to-seed spread is 0, which says
    nothing about their held-out noise, so they compare on their own intervals."""
    rule = Rule("b < a", ["a", "b"], "t")
    same = {0: 0.08, 1: 0.08, 2: 0.08}
    outcome, [test] = rule.decide({
        "a": Sample(same, Interval(0.07, 0.09)),
        "b": Sample({s: 0.075 for s in same}, Interval(0.065, 0.085))})
    assert outcome is None and test.paired == ""


def test_the_held_out_noise_of_a_reference_widens_a_seed_paired_difference():
    """Three seeds at 0.030-0.032 against half a reference of 0.0774: paired across seeds alone
    it decides, but the reference's own held-out interval (±0.02) is part of the difference's
    uncertainty, and keeps it open."""
    rule = Rule("model <= 0.5 * reference", ["model", "reference"], "t")
    model = Sample({0: 0.030, 1: 0.031, 2: 0.032}, Interval(0.0285, 0.0335))
    sharp = Sample({s: 0.0774 for s in range(3)}, Interval(0.0774, 0.0774))
    assert rule.decide({"model": model, "reference": sharp})[0] is True
    noisy = Sample({s: 0.0774 for s in range(3)}, Interval(0.0574, 0.0974))
    outcome, [test] = rule.decide({"model": model, "reference": noisy})
    assert outcome is None
    assert test.paired == "3 seeds; the held-out noise of reference from its own interval; the " \
        "held-out noise of model not counted (its records give it no interval)"
    half = (test.interval[1] - test.interval[0]) / 2
    seeds_only = 4.303 * 0.001 / 3 ** 0.5
    assert half == pytest.approx(math.hypot(seeds_only, 0.01), rel=1e-3)


def test_the_held_out_noise_of_models_widens_a_seed_paired_difference():
    """Two models on three seeds, one held-out set, records without per-sequence values: the
    seeds' t-interval says nothing about the held-out set they share, so each model's records'
    own intervals (the mean of their half-widths) enter the difference, unpaired, and keep open
    what the seeds alone would decide; with none, the test says their noise is not counted."""
    rule = Rule("a >= 1.5 * b", ["a", "b"], "t")
    a = {0: 0.060, 1: 0.061, 2: 0.062}
    b = {0: 0.008, 1: 0.0081, 2: 0.0082}
    bare = {"a": Sample(a, Interval(0.058, 0.064), {}, True),
            "b": Sample(b, Interval(0.0078, 0.0084), {}, True)}
    outcome, [test] = rule.decide(bare)
    assert outcome is True and test.held_out_half == 0.0
    assert test.paired == ("3 seeds; the held-out noise of a, b not counted (its records give "
                           "it no interval)")
    own = {"a": Sample(a, Interval(0.058, 0.064), {}, True, {0: 0.07, 1: 0.068, 2: 0.072}),
           "b": Sample(b, Interval(0.0078, 0.0084), {}, True, {0: 0.006, 1: 0.006, 2: 0.006})}
    outcome, [test] = rule.decide(own)
    assert outcome is None
    assert test.paired == "3 seeds; the held-out noise of a, b from their own intervals, unpaired"
    assert test.held_out_half == pytest.approx(0.07 + 1.5 * 0.006, rel=1e-12)
    narrow = {"a": Sample(a, Interval(0.058, 0.064), {}, True, {s: 0.01 for s in a}),
              "b": Sample(b, Interval(0.0078, 0.0084), {}, True, {s: 0.001 for s in b})}
    outcome, [test] = rule.decide(narrow)
    assert outcome is True
    seeds_only = 4.303 * torch.tensor([a[s] - 1.5 * b[s] for s in a]).std().item() / 3 ** 0.5
    half = (test.interval[1] - test.interval[0]) / 2
    assert half == pytest.approx(math.hypot(seeds_only, 0.01 + 1.5 * 0.001), rel=1e-3)


def test_seeds_with_per_sequence_losses_pair_on_both(tmp_path):
    """Records that keep every predictor's per-sequence losses: the difference is paired across
    seeds and its held-out noise bootstrapped on the same sequences."""
    generator = torch.Generator().manual_seed(2)
    hard = torch.rand(128, generator=generator, dtype=torch.float64) + 0.5
    refs = {"bayes": hard * 0.9, "unigram": hard}
    put(tmp_path / "r", *(with_sequences(MAMBA, hard * (0.905 + 0.001 * s), refs, seed=s)
                          for s in range(3)),
        *(with_sequences(NOCONV, hard * (0.98 + 0.001 * s), refs, seed=s) for s in range(3)))
    [d] = decide(tmp_path / "r", rules_file(tmp_path, rule="noconv >= 5 * mamba"))
    assert d.tests[-1].paired == "3 seeds and 128 held-out sequences"
    assert d.verdict == "holds"


@pytest.mark.parametrize("count", [512, 4_097])
def test_resampled_means_are_the_means_of_the_indexed_resamples_bitwise(count):
    """The bootstrap's blocked, cached means against their definition (values[index].mean(1)):
    a block size changes no digit, and the cache answers by content, not by tensor."""
    from bench.reports.claims import rules
    values = torch.randn(count, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    generator = torch.Generator().manual_seed(0)
    index = torch.randint(count, (rules.BOOTSTRAP_RESAMPLES, count), generator=generator)
    assert torch.equal(rules._resampled_means(values), values[index].mean(1))
    assert torch.equal(rules._resampled_means(values.clone()), values[index].mean(1))
    other = values.clone()
    other[0] += 1.0
    assert torch.equal(rules._resampled_means(other), other[index].mean(1))


def test_same_on_every_seed_is_one_number_up_to_rounding():
    from bench.reports.claims.rules import same_on_every_seed
    assert same_on_every_seed([0.08, 0.08, 0.08]) and same_on_every_seed([0.08])
    assert same_on_every_seed([1.875, 1.875 - 7.77e-15])  # two code versions' rounding
    assert not same_on_every_seed([0.08, 0.08 * (1 + 1e-9)])  # trained seeds differ
    assert not same_on_every_seed([0.0, 1e-300]) and same_on_every_seed([0.0, 0.0])
    assert not same_on_every_seed([0.08, math.nan]) and not same_on_every_seed([math.inf, 1.0])


def test_a_reference_the_same_on_every_seed_brings_its_records_interval(tmp_path):
    """A reference scored on the held-out set every seed shares has one value on every seed, up
    to the rounding of two code versions: its spread across seeds is no interval. Its records'
    own (bootstrap) interval is its held-out noise: the quantity shows it, and a comparison
    paired across seeds, whose records keep no per-sequence losses, widens by it."""
    records = sharp(seeds(MAMBA, [0.0062, 0.0070, 0.0066]))
    for i, rec in enumerate(records):
        rec["metrics"]["gap"]["unigram"] = 0.08 - i * 1e-17
        rec["metrics"]["gap_ci"]["unigram"] = [0.07, 0.09]
    put(tmp_path / "r", *records)
    rules = tmp_path / "rules.yaml"
    rules.write_text(REFERENCE_RULE)
    [d] = decide(tmp_path / "r", rules)
    assert d.values["unigram"].interval == (0.07, 0.09)
    test = d.tests[-1]
    assert test.paired == "3 seeds; the held-out noise of mamba, unigram from their own " \
        "intervals, unpaired"
    differences = [g - 0.008 for g in (0.0062, 0.0070, 0.0066)]
    seeds_half = 4.303 * torch.tensor(differences).std().item() / 3 ** 0.5
    half = (test.interval[1] - test.interval[0]) / 2
    assert half == pytest.approx(math.hypot(seeds_half, 1e-6 + 0.1 * 0.01), rel=1e-3)


def reference_records(hard, model_scale, dropped=None):
    """Three seeds of Mamba records with per-sequence losses (the model's gap about 1% of the
    Bayes loss, the unigram's 20%), where `dropped` (seed, name) names a loss that an older
    record lacked."""
    refs = {"bayes": hard, "unigram": hard * 1.2}
    records = [with_sequences(MAMBA, hard * (1 + model_scale + 0.001 * s), refs, seed=s)
               for s in range(3)]
    gap = float((refs["unigram"] - hard).mean())
    for rec in records:
        rec["metrics"]["gap"]["unigram"] = gap
        rec["metrics"]["gap_ci"]["unigram"] = [gap - 0.01, gap + 0.01]
    for seed, name in [dropped] if dropped else []:
        del records[seed]["per_sequence"]["loss"][name]
    return records


def test_a_reference_missing_on_a_seed_pairs_on_another_seeds_sequences(tmp_path):
    """The held-out noise of a paired difference is a bootstrap over the sequences. An older
    record of seed 0 lacks the unigram's per-sequence losses, but a reference is the same on
    every seed, so another seed's stand in (the digests agree): all three seeds pair. Where the
    model's own losses are missing on seed 0, the bootstrap takes the two seeds that have them
    and says so."""
    hard = torch.rand(128, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.5
    rules = tmp_path / "rules.yaml"
    rules.write_text(REFERENCE_RULE)
    put(tmp_path / "reference", *reference_records(hard, 0.01, dropped=(0, "unigram")))
    [d] = decide(tmp_path / "reference", rules)
    assert d.tests[-1].paired == "3 seeds and 128 held-out sequences" and d.verdict == "holds"
    put(tmp_path / "model", *reference_records(hard, 0.01, dropped=(0, "model")))
    [d] = decide(tmp_path / "model", rules)
    assert d.tests[-1].paired == "3 seeds and 128 held-out sequences of 2 of the seeds"
    assert d.verdict == "holds"  # 0.01 against 0.1 x 0.2: apart on either


def test_per_sequence_values_are_read_only_where_every_one_is_a_number():
    """read_sequences' check (verdicts.plain_numbers): ints and floats, also of a float subclass
    (looked at one by one); a bool, a null or a string anywhere leaves the record unpaired."""
    from bench.reports.claims.verdicts import plain_numbers

    class Loss(float):
        pass
    assert plain_numbers([1, 2.5]) and plain_numbers([Loss(1.0), 2.0]) and plain_numbers([])
    for odd in (True, None, "NaN", [1.0]):
        assert not plain_numbers([1.0, odd, 2.0])


SPREAD = """\
paper: "004"
claims:
  - id: t-spread
    section: "Fig. 2 right"
    claim: Without convolution the errors spread wider.
    paper_number: a larger variance
    where: [task=markov, trainer.max_steps=1000, trainer.lr=0.01]
    measure:
      mamba_std: {where: [model=mamba], metric: metrics.task.error_distribution.std.model}
      noconv_std: {where: [model=mamba, model.conv=false], metric: metrics.task.error_distribution.std.model}
      mamba: {where: [model=mamba]}
    control: "mamba <= 0.05"
    rule: "noconv_std >= 1.01 * mamba_std"
    scale: cpu
    per_seed: true
    command: python -m bench suite name=leaderboard
"""


def with_errors(selector, errors: torch.Tensor, seed=0, digest="e" * 64, moments=True):
    """A record whose error distribution at one position is that of `errors` (sequences,
    coordinates): its std and the std's bootstrap interval as tasks/lgssm.py writes them, and
    (moments) the per-sequence mean and mean square behind them."""
    from tasks.lgssm import error_distribution, error_moments
    model = errors[:, None, :]  # (B, T=1, m)
    mask = torch.ones(len(errors), 1, dtype=torch.bool)
    rec = record(selector, seed=seed)
    rec["metrics"]["task"] = {"error_distribution": error_distribution({"model": model}, mask, 0)}
    rec["metrics"]["held_out_digest"] = digest
    rec["metrics"]["sequences"] = len(errors)
    rec["per_sequence"] = {"bands": [], "loss": {"model": [0.5] * len(errors)}}
    if moments:
        found = error_moments({"model": model}, mask, 0)
        rec["per_sequence"]["task"] = {"error_distribution": {
            "coordinates": found["coordinates"],
            **{part: {"model": found[part]["model"].tolist()} for part in ("mean", "square")}}}
    return rec


def test_the_spreads_of_two_models_compare_paired_by_sequence(tmp_path):
    """Two models' errors share the sequences' hard noise (sd 1.4) and add a small one of their
    own: each std has a bootstrap interval of about ±4%. With noise of the same size the
    spreads are equal, and `noconv_std >= 1.01 * mamba_std` fails on each seed when they are
    paired by sequence; with noconv's own noise three times larger (4% wider) it holds.
    Unpaired (records without per-sequence moments) no seed is decided either way."""
    rules = tmp_path / "spread.yaml"
    rules.write_text(SPREAD)
    generator = torch.Generator().manual_seed(4)

    def draw(extra: float):
        shared = torch.randn(1024, 2, generator=generator, dtype=torch.float64) * 1.4
        own = torch.randn(1024, 2, generator=generator, dtype=torch.float64)
        return shared + 0.15 * own, shared + extra * own

    for name, extra, verdict in (("same", 0.15, "fails at reduced scale"),
                                 ("wide", 0.45, "holds at reduced scale")):
        pairs = [draw(extra) for _ in range(3)]
        put(tmp_path / name, *(with_errors(MAMBA, m, seed=s) for s, (m, _) in enumerate(pairs)),
            *(with_errors(NOCONV, n, seed=s) for s, (_, n) in enumerate(pairs)))
        [d] = decide(tmp_path / name, rules)
        assert d.verdict == verdict, d.note
        put(tmp_path / f"{name}-unpaired",
            *(with_errors(MAMBA, m, seed=s, moments=False) for s, (m, _) in enumerate(pairs)),
            *(with_errors(NOCONV, n, seed=s, moments=False) for s, (_, n) in enumerate(pairs)))
        [d] = decide(tmp_path / f"{name}-unpaired", rules)
        assert d.verdict == "undecided"
        assert d.note == ("per seed: 3 of 3 seeds undecided (0 ? / 1 ? / 2 ?); on each: the "
                          "interval of a difference holds 0 (`noconv_std >= 1.01 * mamba_std`)")


def test_a_pooled_std_read_per_sequence_is_the_records_std(tmp_path):
    """read_sequences of metrics.task.error_distribution.{std,mean}.model: the statistic of the
    per-sequence moments' means is the record's std and mean (to the records' 7 digits), and on
    each bootstrap resample it is the std of the resampled sequences' pooled errors."""
    from bench.reports.claims import rules
    errors = torch.randn(300, 3, generator=torch.Generator().manual_seed(5),
                         dtype=torch.float64) + 0.2
    rec = with_errors(MAMBA, errors)
    ed = rec["metrics"]["task"]["error_distribution"]
    spec = tmp_path / "spread.yaml"
    spec.write_text(SPREAD.replace("error_distribution.std.model}\n      mamba:",
                                   "error_distribution.mean.model}\n      mamba:"))
    [claim] = load_claims(spec)
    digest, std = read_sequences(rec, claim.quantities["mamba_std"])
    assert digest == "e" * 64 and len(std) == 300
    assert std.value() == pytest.approx(ed["std"]["model"], rel=1e-12)
    _, mean = read_sequences(rec, claim.quantities["noconv_std"])  # here the mean's metric
    assert float(mean.mean()) == pytest.approx(ed["mean"]["model"], rel=1e-12, abs=1e-15)
    index = torch.randint(300, (rules.BOOTSTRAP_RESAMPLES, 300),
                          generator=torch.Generator().manual_seed(0))
    assert torch.allclose(std.resampled(), errors[index].flatten(1).std(1), rtol=1e-12)
    # a record whose moments are not one number per sequence keeps no per-sequence std
    rec["per_sequence"]["task"]["error_distribution"]["square"]["model"].pop()
    assert read_sequences(rec, claim.quantities["mamba_std"]) is None


def test_a_statistic_averaged_over_seeds_is_its_seeds_mean_on_every_resample():
    """_seed_average of pooled stds: each resample's value is the mean of the seeds' stds on
    that resample (not the std of averaged moments); of plain vectors, the mean vector."""
    from bench.reports.claims import rules
    from tasks.stats import pooled_std
    generator = torch.Generator().manual_seed(6)
    per_seed = []
    for scale in (1.0, 2.0):
        errors = torch.randn(200, 2, generator=generator, dtype=torch.float64) * scale
        per_seed.append(rules.SequenceStatistic(
            (errors.mean(1), errors.square().mean(1)), lambda m, s: pooled_std(m, s, 400)))
    averaged = rules._seed_average(per_seed)
    assert torch.equal(averaged.resampled(),
                       torch.stack([p.resampled() for p in per_seed]).mean(0))
    assert averaged.value() == pytest.approx(sum(p.value() for p in per_seed) / 2, rel=1e-14)
    vectors = [torch.arange(4.0, dtype=torch.float64), torch.ones(4, dtype=torch.float64)]
    assert torch.equal(rules._seed_average(vectors), torch.stack(vectors).mean(0))


EXCESS = """\
paper: "004"
claims:
  - id: t-excess
    section: "§5.1"
    claim: Without convolution the excess at k = 32 is higher.
    paper_number: a higher plateau
    where: [task=markov, trainer.max_steps=1000, trainer.lr=0.01]
    measure:
      noconv: {where: [model=mamba, model.conv=false], metric: "metrics.task.excess_over_bayes.model[2]"}
      mamba: {where: [model=mamba], metric: "metrics.task.excess_over_bayes.model[2]"}
    control: "mamba <= 1"
    rule: "noconv >= 1.5 * mamba"
    scale: cpu
    command: python -m bench suite name=leaderboard
"""


def with_excess(selector, excess: torch.Tensor, seed: int, per_sequence: bool) -> dict:
    """A record whose excess over bayes in bin 2 is the mean of `excess` (one value per held-out
    sequence), with its standard error beside it as tasks/lgssm.py writes them, and
    (per_sequence) the values themselves (binned_excess)."""
    rec = record(selector, seed=seed)
    n = len(excess)
    se = float(excess.std() / n ** 0.5)
    rec["metrics"]["task"] = {"excess_over_bayes": {"model": [0.0, 0.0, float(excess.mean())]},
                              "excess_over_bayes_stderr": {"model": [0.0, 0.0, se]}}
    rec["metrics"]["held_out_digest"] = "f" * 64
    rec["metrics"]["sequences"] = n
    rec["per_sequence"] = {"bands": [], "loss": {"model": [0.5] * n}}
    if per_sequence:
        rec["per_sequence"]["task"] = {"excess_over_bayes": {"model": {"2": excess.tolist()}}}
    return rec


def test_an_excess_in_a_bin_compares_paired_by_sequence(tmp_path):
    """Two models' excess at k = 32 on one held-out set whose hard sequences (a heavy tail) are
    hard for both: their own intervals are wide, so unpaired across the seeds the comparison
    stays open; the per-sequence values (per_sequence.task.excess_over_bayes.<name>.<bin>)
    bootstrap the difference on the shared sequences, and it holds. read_sequences finds
    them only at the bin recorded."""
    rules = tmp_path / "excess.yaml"
    rules.write_text(EXCESS)
    generator = torch.Generator().manual_seed(5)
    hard = torch.distributions.Pareto(torch.tensor(1.0, dtype=torch.float64),
                                      torch.tensor(2.2, dtype=torch.float64))
    torch.manual_seed(5)
    shared = hard.sample((512,)) * 0.01
    own = [torch.rand(512, generator=generator, dtype=torch.float64) * 0.002 for _ in range(6)]
    for paired, verdict, how in ((False, "undecided", "from their own intervals, unpaired"),
                                 (True, "holds at reduced scale", "and 512 held-out sequences")):
        out = tmp_path / ("paired" if paired else "unpaired")
        put(out, *(with_excess(MAMBA, shared + own[s], s, paired) for s in range(3)),
            *(with_excess(NOCONV, 2 * shared + own[3 + s], s, paired) for s in range(3)))
        [d] = decide(out, rules)
        assert d.verdict == verdict and how in d.tests[-1].paired
    mamba = load_claims(rules)[0].quantities["mamba"]
    rec = with_excess(MAMBA, shared, 0, True)
    digest, values = read_sequences(rec, mamba)
    assert digest == "f" * 64 and torch.allclose(values, shared)
    rec["per_sequence"]["task"]["excess_over_bayes"]["model"] = {"1": shared.tolist()}
    assert read_sequences(rec, mamba) is None


TEXT = """\
paper: "000"
claims:
  - id: t-text
    section: "§5.2"
    claim: Without convolution the perplexity is higher.
    paper_number: conv lowers perplexity
    where: [task=markov, trainer.max_steps=1000, trainer.lr=0.01]
    measure:
      noconv: {where: [model=mamba, model.conv=false], metric: metrics.perplexity.model}
      mamba: {where: [model=mamba], metric: metrics.perplexity.model}
      bigram: {where: [model=mamba], metric: metrics.perplexity.bigram}
    control: "mamba < bigram"
    rule: "noconv > mamba"
    scale: cpu
    command: python -m bench suite name=leaderboard
"""


def with_windows(selector, sums: dict[str, torch.Tensor], tokens: torch.Tensor, seed: int,
                 per_sequence: bool) -> dict:
    """A text record (perplexity scoring) of windows with these loss sums and scored tokens:
    per-token losses, perplexities and their own bootstrap intervals as evaluate.py's
    score_perplexity writes them, and (per_sequence) the windows' values behind them."""
    from tasks.stats import bootstrap_ci
    rec = record(selector, seed=seed)
    loss = {name: float(s.sum() / tokens.sum()) for name, s in sums.items()}
    ci = {name: bootstrap_ci(s, 1000, weights=tokens) for name, s in sums.items()}
    rec["metrics"] = {"scoring": "perplexity", "gap_reference": None, "roles": {},
                      "loss": loss, "loss_ci": ci,
                      "perplexity": {n: math.exp(v) for n, v in loss.items()},
                      "perplexity_ci": {n: [math.exp(lo), math.exp(hi)]
                                        for n, (lo, hi) in ci.items()},
                      "bits_per_byte": {n: v / math.log(2) for n, v in loss.items()},
                      "sequences": len(tokens), "held_out_digest": "a" * 64, "task": {}}
    rec["per_position"] = {f"loss.{n}": [v] for n, v in loss.items()}
    if per_sequence:
        rec["per_sequence"] = {"tokens": tokens.int().tolist(),
                               "loss_sum": {n: s.tolist() for n, s in sums.items()}}
    return rec


def test_perplexities_compare_paired_by_window(tmp_path):
    """Two models' perplexities on one held-out text, whose hard windows are hard for both:
    each perplexity's own interval (±3%) overlaps the other's, so across seeds the held-out
    noise bounded unpaired keeps `noconv > mamba` open; the windows' loss sums and tokens
    bootstrap the ratio of means on the shared windows, and it holds."""
    rules = tmp_path / "text.yaml"
    rules.write_text(TEXT)
    generator = torch.Generator().manual_seed(6)
    tokens = torch.randint(200, 256, (167,), generator=generator).double()
    hard = torch.rand(167, generator=generator, dtype=torch.float64) * 2 + 2.5  # nats a token

    def sums(scale: float, seed: int) -> torch.Tensor:
        jitter = torch.rand(167, generator=generator, dtype=torch.float64) * 0.01
        return (hard * scale + jitter + 0.001 * seed) * tokens

    for paired, verdict, how in ((False, "undecided", "from their own intervals, unpaired"),
                                 (True, "holds at reduced scale", "and 167 held-out sequences")):
        out = tmp_path / ("paired" if paired else "unpaired")
        put(out, *(with_windows(MAMBA, {"model": sums(1.0, s), "bigram": hard * 1.2 * tokens},
                                tokens, s, paired) for s in range(3)),
            *(with_windows(NOCONV, {"model": sums(1.01, s), "bigram": hard * 1.2 * tokens},
                           tokens, s, paired) for s in range(3)))
        [d] = decide(out, rules)
        assert d.verdict == verdict and how in d.tests[-1].paired
    found = read_sequences(with_windows(MAMBA, {"model": hard * tokens}, tokens, 0, True),
                           load_claims(rules)[0].quantities["mamba"])
    assert found is not None and found[1].value() == pytest.approx(math.exp(hard @ tokens
                                                                            / tokens.sum()))
