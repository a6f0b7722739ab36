"""Contracts that test themselves: every task family of `tasks.task_families()` against the task
contract (tasks/base.py), every model family of `models.model_families()` against the model
contract (models/backbone.py), and every YAML of conf/task and conf/model against its family's
`Config`. The families come from the registries, so a new one is checked without an edit here.

What the task contract says and what is checked here:
- `sample(n, generator)`: inputs (n, T) long tokens in [0, input_dim) or (n, T, input_dim)
  floats; targets (n, T) long in [0, output_dim) or (n, T, output_dim); loss_mask (n, T) bool;
  latent tensors with first axis n. Drawn "with generator only": the same seed gives the same
  batch whatever the global RNG did in between, another seed another batch.
- `held_out(n)`: the same batch at every call.
- references: at least one `bayes` or `bound` (a task scored by perplexity, text, has none: its
  references are baselines that give per-position losses). base.py says nothing about infinite
  log-probabilities; bench/training/evaluate.py position_scores takes an infinite loss at an unscored
  position (it selects with where(), not a product), so here the loss must be finite at every
  scored position and a token prediction a normalised distribution there (a -inf log-probability
  of a token that is not the target is allowed: a predictor may rule a symbol out).
- bound <= bayes <= every baseline in expectation (module docstring of tasks/base.py), as mean
  losses over the held-out set, see `assert_not_worse`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing

import pytest
import torch
import yaml

from bench.config import CONF_DIR, choices, compose
from tasks.stats import sequence_means
from conftest import assert_causal
from models import IOSpec, build_model, model_families
from tasks import task_families
from tasks.base import TEST_STREAM, Batch, make_generator

# The text family needs a corpus and the `datasets` package, whose import alone takes 3-10 s on
# the 2-core machine (the pydoc corpus itself then builds in ~0.1 s): over this module's budget.
# Its contract is covered by tests/test_text.py (training windows drawn from the generator, the
# evaluation split scored once per token, the reference caches) and tests/test_corpus.py
# (test_baselines_on_a_token_cache: the baselines' losses on a real corpus).
LEFT_OUT = {"text"}
TASK_FAMILIES = sorted(set(task_families()) - LEFT_OUT)
MODEL_FAMILIES = sorted(model_families())

# Small sizes, applied to every family whose Config has the field: sequences of 24 positions,
# and lgssm's SMC Bayes predictor at 64 particles instead of 512 (8.7 s -> ~1 s on 64 sequences;
# its Monte Carlo error is then larger, and accounted for: see monte_carlo_excess).
SMALL = {"seq_len": 24, "bayes_particles": 64}
HELD_OUT = 64  # sequences the references are compared on
# One-sided z of the ordering checks: a correct family fails a comparison with probability
# ~3e-5 (normal tail), ~1e-3 over the module's ~30 comparisons. The held-out set is fixed, so a
# check that passes keeps passing until a sampler or reference changes.
Z = 4.0


def small_task(family: str):
    """The family at the SMALL sizes its Config has and accepts; a size it refuses (a task
    that needs an odd seq_len) leaves its default."""
    cls = task_families()[family]
    names = {f.name for f in dataclasses.fields(cls.Config)}
    settings: dict = {}
    for key, value in SMALL.items():
        if key in names:
            try:
                cls.Config(**settings, **{key: value})
            except ValueError:
                continue
            settings[key] = value
    return cls(cls.Config(**settings))


@functools.lru_cache(maxsize=None)
def scored(family: str, prior: bool = False):
    """(task, batch, {name: per-position loss (B, T) float64}, {name: prediction}) on the held-out
    set, or with `prior` on a sample of the training prior of the same size."""
    task = small_task(family)
    batch = (task.sample(HELD_OUT, make_generator(TEST_STREAM, 0)) if prior
             else task.held_out(HELD_OUT))
    predictions, losses = {}, {}
    for name, ref in task.references().items():
        if ref.predict is not None:
            predictions[name] = ref.predict(batch).double()
            losses[name] = task.position_loss(predictions[name], batch.targets)
        else:
            losses[name] = ref.loss(batch).double()
    return task, batch, losses, predictions


def check_batch(task, batch: Batch, n: int) -> None:
    T = task.seq_len
    assert len(batch) == n and batch.loss_mask.shape == (n, T)
    assert batch.loss_mask.dtype == torch.bool and batch.loss_mask.any()
    if task.kind == "tokens":
        assert batch.inputs.shape == (n, T) and batch.targets.shape == (n, T)
        assert batch.inputs.dtype == batch.targets.dtype == torch.long
        assert 0 <= int(batch.inputs.min()) and int(batch.inputs.max()) < task.input_dim
        assert 0 <= int(batch.targets.min()) and int(batch.targets.max()) < task.output_dim
    else:
        assert batch.inputs.shape == (n, T, task.input_dim)
        assert batch.targets.shape == (n, T, task.output_dim)
        assert batch.inputs.is_floating_point() and batch.targets.is_floating_point()
        assert torch.isfinite(batch.inputs).all() and torch.isfinite(batch.targets).all()
    for name, value in batch.latent.items():
        assert value.shape[0] == n, name


def same_batch(a: Batch, b: Batch) -> bool:
    return (torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
            and torch.equal(a.loss_mask, b.loss_mask) and a.latent.keys() == b.latent.keys()
            and all(torch.equal(a.latent[k], b.latent[k]) for k in a.latent))


# --- tasks ---------------------------------------------------------------------------------

def test_the_registries_find_the_families():
    assert {"markov", "hmm", "linreg", "lgssm", "text"} <= set(task_families())
    assert {"mamba", "transformer", "lstm"} <= set(model_families())


def test_the_light_config_registries_are_the_families_own():
    """Composing a command line reads tasks/configs.py and models/configs.py (no torch); a family
    trains with the Config of its class: the two must be one."""
    from models.configs import ACTIVATION_NAMES, CONFIGS as MODEL_CONFIGS
    from models.mamba import ACTIVATIONS
    from tasks.configs import CONFIGS as TASK_CONFIGS, CORPUS_NAMES
    from tasks.corpora import CORPORA
    for families, configs in ((task_families(), TASK_CONFIGS), (model_families(), MODEL_CONFIGS)):
        assert set(families) == set(configs)
        assert all(families[name].Config is configs[name] for name in families)
    assert tuple(ACTIVATIONS) == ACTIVATION_NAMES and set(CORPORA) == set(CORPUS_NAMES)


def test_a_family_that_trains_on_a_pool_of_tasks_draws_them_as_a_latent_task():
    """`task.num_tasks` draws its training tasks with draw_latent and their sequences with
    sample_given: a family whose Config has it must be a LatentTask, whose `sample` is those
    two by construction (and one without it gains nothing from being one)."""
    from tasks.base import LatentTask
    for name, cls in task_families().items():
        pooled = any(f.name == "num_tasks" for f in dataclasses.fields(cls.Config))
        assert issubclass(cls, LatentTask) == pooled, name


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_batches_have_the_contract_shapes_and_dtypes(family):
    task = small_task(family)
    assert task.kind in ("tokens", "vectors") and task.scoring in ("gap", "perplexity")
    check_batch(task, task.sample(5, make_generator(7)), 5)
    check_batch(task, task.held_out(HELD_OUT), task.held_out_size(HELD_OUT))


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_sampling_depends_only_on_the_generator(family):
    task = small_task(family)
    torch.manual_seed(0)
    first = task.sample(6, make_generator(11))
    torch.manual_seed(12345)  # the global RNG moved: the batch must not
    torch.rand(100)
    again = task.sample(6, make_generator(11))
    other = task.sample(6, make_generator(12))
    assert same_batch(first, again)
    assert not torch.equal(first.inputs, other.inputs)


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_the_held_out_set_is_the_same_at_every_call(family):
    task = small_task(family)
    torch.manual_seed(1)
    first = task.held_out(8)
    torch.manual_seed(2)
    assert same_batch(first, task.held_out(8))
    assert same_batch(first, small_task(family).held_out(8))  # and for a new instance


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_references_are_finite_where_scored(family):
    task, batch, losses, predictions = scored(family)
    refs = task.references()
    roles = {ref.role for ref in refs.values()}
    assert roles <= {"bayes", "bound", "baseline", "replicate"}
    replicates = [name for name, ref in refs.items() if ref.role == "replicate"]
    if replicates:  # independent runs of the Monte Carlo Bayes estimate, which is their mean
        (bayes,) = [name for name, ref in refs.items() if ref.role == "bayes"]
        assert len(replicates) >= 2 and all(n.startswith(f"{bayes}_run") for n in replicates)
        mean = sum(predictions[n] for n in replicates) / len(replicates)
        assert torch.allclose(predictions[bayes], mean, rtol=0, atol=1e-12)
        # the loss is convex in the prediction: the mean's loss is at most the runs' mean loss
        runs_loss = sum(losses[n] for n in replicates) / len(replicates)
        assert (losses[bayes] <= runs_loss + 1e-12).all()
    if task.scoring == "gap":
        assert roles & {"bayes", "bound"}, f"{family} has neither a bayes nor a bound reference"
        assert all(ref.predict is not None for ref in refs.values())
    else:
        assert roles == {"baseline"} and all(ref.loss is not None for ref in refs.values())
    mask = batch.loss_mask
    B, T = mask.shape
    for name, loss in losses.items():
        assert loss.shape == (B, T), name
        assert torch.isfinite(loss[mask]).all(), f"{name}: infinite or NaN loss where scored"
    for name, prediction in predictions.items():
        assert not prediction.isnan().any(), name
        if task.kind == "tokens":
            assert prediction.shape == (B, T, task.output_dim), name
            assert (prediction[mask] <= 1e-12).all(), name  # log-probabilities
            norm = prediction[mask].logsumexp(-1)
            assert torch.allclose(norm, torch.zeros_like(norm), atol=1e-9), name
        else:
            assert prediction.shape == (B, T, task.output_dim), name
            assert torch.isfinite(prediction[mask]).all(), name


def monte_carlo_excess(predictions: dict, name: str, mask: torch.Tensor) -> float:
    """The expected loss that Monte Carlo error adds to reference `name` when it is the mean of
    k >= 2 independent runs that the task also names `<name>_run<j>` (lgssm's SMC): 0 otherwise.

    Derivation: a run is r_j = b + e_j with b the exact Bayes prediction and e_j independent
    zero-mean errors of covariance S (per position). The mean of k runs has error ē with
    covariance S/k, and its expected squared error is that of b plus tr(S)/k, since ē is
    independent of the target given the context. tr(S) is estimated without bias by the runs'
    sample variance Σ_j |r_j - r̄|² / (k - 1); divided by the coordinates d as position_loss
    averages them. (A bias of order 1/particles that all runs share is not seen by their spread;
    the baselines this guards are far from the Bayes loss, lgssm's erm by ~2 nats.)"""
    runs = [p for key, p in predictions.items() if key.startswith(f"{name}_run")]
    if len(runs) < 2:
        return 0.0
    stacked = torch.stack(runs)
    k, d = len(runs), stacked.shape[-1]
    excess = (stacked - stacked.mean(0)).pow(2).sum((0, -1)) / ((k - 1) * k * d)
    return float(sequence_means(excess, mask.double()).mean())


def assert_not_worse(family: str, losses: dict, mask, better: str, worse: str,
                     allowance: float = 0.0) -> None:
    """E[loss(better)] <= E[loss(worse)], from the paired per-sequence differences d (sequence
    means over scored positions, as the record's losses are): mean(d) <= Z · SE(d) + allowance,
    plus rounding (1e-9 relative: two predictors equal in exact arithmetic, e.g. linreg's bayes
    and ols without noise, differ by float rounding only)."""
    m = mask.double()
    d = sequence_means(losses[better], m) - sequence_means(losses[worse], m)
    mean, se = float(d.mean()), float(d.std() / math.sqrt(len(d)))
    rounding = 1e-9 * (1 + float(sequence_means(losses[worse], m).mean()))
    assert mean <= Z * se + allowance + rounding, (
        f"{family}: {better} is worse than {worse} by {mean:.4g} (mean loss per sequence) "
        f"(SE {se:.3g}, Monte Carlo allowance {allowance:.3g}, n={len(d)})")


@pytest.mark.parametrize("family", TASK_FAMILIES)
def test_bound_bayes_baseline_order_in_expectation(family):
    """bound <= bayes <= every baseline, and bound <= every baseline and replicate. The
    clairvoyant bound is optimal given the latent on any distribution, so it is checked on the
    held-out set; the
    Bayes predictor is optimal only under the training prior, so where the held-out set is not
    drawn from it (lgssm_colored's eval_rho) bayes <= baseline is checked on a sample of the
    prior instead."""
    task, batch, losses, predictions = scored(family)
    if task.scoring != "gap":
        pytest.skip(f"{family} is scored by perplexity: no bayes or bound")
    roles = {name: ref.role for name, ref in task.references().items()}
    by_role = {role: [n for n, r in roles.items() if r == role]
               for role in ("bound", "bayes", "baseline", "replicate")}
    for bound in by_role["bound"]:
        for other in by_role["bayes"] + by_role["baseline"] + by_role["replicate"]:
            assert_not_worse(family, losses, batch.loss_mask, bound, other)
    if not task.held_out_from_prior:
        task, batch, losses, predictions = scored(family, prior=True)
    for bayes in by_role["bayes"]:
        allowance = monte_carlo_excess(predictions, bayes, batch.loss_mask)
        for baseline in by_role["baseline"]:
            assert_not_worse(family, losses, batch.loss_mask, bayes, baseline, allowance)


@pytest.mark.parametrize("family", sorted(task_families()))
def test_every_task_family_describes_itself(family):
    cls = task_families()[family]
    assert isinstance(cls.description, str) and cls.description.strip()
    assert dataclasses.is_dataclass(cls.Config)


# --- models --------------------------------------------------------------------------------

IO = {"tokens": IOSpec("tokens", 5, 5, 16), "vectors": IOSpec("vectors", 3, 2, 16)}


@pytest.mark.parametrize("kind", sorted(IO))
@pytest.mark.parametrize("family", MODEL_FAMILIES)
def test_model_family_default_config_builds_is_causal_and_has_a_state(family, kind):
    """The default Config of every family on a token and a vector task: the prediction's shape
    (log-probabilities for tokens), a causal core (conftest.assert_causal: outputs up to t
    bit-identical when later inputs change), state_size a positive int. One training step and
    causality through the whole backbone, per conf/model file: tests/test_models.py."""
    cls = model_families()[family]
    io = IO[kind]
    torch.manual_seed(0)
    net = build_model(family, cls.Config(), io).eval()
    T = io.max_len
    inputs = (torch.randint(0, io.input_dim, (2, T)) if kind == "tokens"
              else torch.randn(2, T, io.input_dim))
    with torch.no_grad():
        prediction = net.predict(inputs)
        assert prediction.shape == (2, T, io.output_dim)
        assert torch.isfinite(prediction).all()
        if kind == "tokens":
            norm = prediction.double().logsumexp(-1)
            assert torch.allclose(norm, torch.zeros_like(norm), atol=1e-5)
        if net.core.owns_io:
            if kind == "vectors":
                assert_causal(net.core, inputs, T // 2)
        else:
            assert_causal(net.core, torch.randn(2, T, net.core.config.d_model), T // 2)
    state = net.state_size(T)
    assert isinstance(state, int) and not isinstance(state, bool) and state > 0
    assert isinstance(cls.description, str) and cls.description.strip()


# --- conf files: defaults written twice, in the YAML and in the dataclass ------------------

def conf_files(group: str) -> list[tuple[str, str]]:
    """(conf name, family) of every conf/<group>/*.yaml."""
    return [(name, (yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text()) or {})
             .get("family", name)) for name in choices(group)]


CONF_FILES = [(group, name, family) for group in ("task", "model")
              for name, family in conf_files(group)]


def families_of(group: str) -> dict:
    return task_families() if group == "task" else model_families()


@pytest.mark.parametrize("group,name,family", CONF_FILES,
                         ids=[f"{g}/{n}" for g, n, _ in CONF_FILES])
def test_every_conf_file_sets_fields_of_its_family_with_their_types(group, name, family):
    """A preset may set a value other than the default (hmm_paper's 512 positions): that is
    what it is for. What it may not do is name a field the family lacks, or give a value that
    composing converts into another one (a float for an int field, a string for a number). A
    key it leaves out takes the dataclass default."""
    assert family in families_of(group), f"conf/{group}/{name}.yaml: unknown family {family}"
    text = (CONF_DIR / group / f"{name}.yaml").read_text()
    assert text.startswith("# "), "the first line is the description `bench list` shows"
    values = yaml.safe_load(text)
    values.pop("family", None)
    schema = families_of(group)[family].Config
    hints = typing.get_type_hints(schema)
    assert set(values) <= set(hints), set(values) - set(hints)
    composed = getattr(compose([f"{group}={name}"]), group)
    for key, value in values.items():
        got = getattr(composed, key)
        assert got == value, (key, value, got)
        expected = hints[key]
        origin = typing.get_origin(expected) or expected
        if origin is float:
            assert isinstance(value, (int, float)) and not isinstance(value, bool), key
        elif origin in (int, str, bool):
            assert type(value) is origin, (key, value, expected)
        elif origin in (list, tuple):
            assert isinstance(value, list), (key, value, expected)


# conf files named after their family that are not its defaults, and why
PRESET_NAMED_AS_FAMILY = {
    "text": "task=text is any local corpus (corpus: local, data_dir: data/text); the family's "
            "defaults are WikiText-103's, conf/task/wikitext103.yaml"}


@pytest.mark.parametrize("group", ["task", "model"])
def test_every_family_has_a_conf_file_with_exactly_its_defaults(group):
    """The defaults are written twice, as the dataclass's and in a conf file, and must agree: for
    every family some conf file holds only default values (a key left out is the default). It is
    the file named after the family, except where that name is a preset of another purpose
    (PRESET_NAMED_AS_FAMILY)."""
    by_family: dict[str, list[str]] = {}
    for g, name, family in CONF_FILES:
        if g == group:
            by_family.setdefault(family, []).append(name)
    missing = set(families_of(group)) - set(by_family)
    assert not missing, f"families without a conf/{group} file: {sorted(missing)}"
    for family, names in by_family.items():
        defaults = dataclasses.asdict(families_of(group)[family].Config())
        differing = {}
        for name in names:
            values = yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text())
            values.pop("family", None)
            differing[name] = {k: (v, defaults[k]) for k, v in values.items() if defaults[k] != v}
        exact = [name for name, diff in differing.items() if not diff]
        assert exact, f"no conf file of {group} family {family} holds its defaults: {differing}"
        if family in names and family not in PRESET_NAMED_AS_FAMILY:
            assert not differing[family], (family, differing[family])


def test_every_lightning_hook_a_task_defines_reaches_it_through_the_data_module():
    """Tasks are not Lightning data modules (bench/training/datamodule.py adapts them): a
    LightningDataModule hook that a task family defines (the text task's prepare_data and
    setup) is one TaskData passes on, or Lightning would never call it."""
    import lightning as L

    from bench.training.datamodule import TaskData
    from tasks import task_families
    hooks = {name for name in dir(L.LightningDataModule)
             if not name.startswith("_") and callable(getattr(L.LightningDataModule, name))}
    for family, cls in task_families().items():
        defined = {name for klass in cls.__mro__ if klass is not object
                   for name in vars(klass) if name in hooks}
        missing = defined - set(vars(TaskData))
        assert not missing, f"{family} defines {sorted(missing)}, which TaskData does not pass on"
