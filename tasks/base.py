"""The task contract: a distribution over sequences plus the predictors it is judged against.

A task samples batches of sequences together with the hidden parameters that generated them
(`latent`), and names its reference predictors: `bayes` (the exact posterior predictive),
`bound` (a clairvoyant predictor that knows `latent`; a lower bound on the Bayes loss) and
`baseline` (a classical in-context estimator). Models and references are scored by the same
per-position loss, so the Bayes gap is a paired comparison on identical sequences.

Predictions, of models and references alike:
- kind "tokens":  log-probabilities of the next token, shape (B, T, V);
- kind "vectors": the predicted mean of the target, shape (B, T, d_out).
"""
from __future__ import annotations

import abc
import dataclasses
import itertools
import multiprocessing
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterator, Literal

import torch
from torch import Tensor

Kind = Literal["tokens", "vectors"]
# A reference's role: `bayes` the optimum, `bound` out of any model's reach (it knows the latent),
# `baseline` a predictor a model should beat, `replicate` one independent Monte Carlo run of an
# estimated Bayes reference (its spread is that reference's error; no model is measured by it).
Role = Literal["bayes", "bound", "baseline", "replicate"]

# Stream tags keep the training, validation and test streams of random numbers disjoint.
TRAIN_STREAM, VAL_STREAM, TEST_STREAM = 1, 2, 3
POOL_STREAM = 5  # the finite pool of training tasks (num_tasks > 0); 4 is linreg's tuning sample
_MASK64 = (1 << 64) - 1


def stream_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (splitmix64 chained over the keys): stable across runs,
    processes and platforms, unlike Python's hash(), and well mixed for adjacent keys."""
    state = 0x9E3779B97F4A7C15
    for key in keys:
        state = (state + (key & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


def make_generator(*keys: int, device: torch.device | str = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(stream_seed(*keys))
    return generator


@dataclass
class Batch:
    """inputs: (B, T) long tokens or (B, T, d_in) floats; targets: (B, T) long or (B, T, d_out);
    loss_mask: (B, T) bool, the scored positions; latent: the hidden task parameters."""

    inputs: Tensor
    targets: Tensor
    loss_mask: Tensor
    latent: dict[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """A copy on `device`. non_blocking=True (what a training step's copy uses): a copy
        from page-locked memory to a GPU is queued without making the host wait, so the
        pinned memory of the training loader buys its overlap; from pageable memory it is
        still safe. (Never for copies back to the host, whose values would be read early.)"""
        def move(t: Tensor) -> Tensor:
            return t.to(device, non_blocking=non_blocking)
        return Batch(move(self.inputs), move(self.targets), move(self.loss_mask),
                     {k: move(v) for k, v in self.latent.items()})

    def pin_memory(self) -> "Batch":
        """A copy in page-locked memory (a DataLoader with pin_memory=True calls this), so the
        copy to the GPU is asynchronous."""
        return Batch(self.inputs.pin_memory(), self.targets.pin_memory(),
                     self.loss_mask.pin_memory(), {k: v.pin_memory() for k, v in self.latent.items()})

    def select(self, index: slice | Tensor) -> "Batch":
        """The sub-batch of sequences `index` (latent tensors are indexed on their first axis)."""
        return Batch(self.inputs[index], self.targets[index], self.loss_mask[index],
                     {k: v[index] for k, v in self.latent.items()})


@dataclass(frozen=True)
class Reference:
    """A reference predictor: `predict` maps a Batch to predictions in the task's prediction
    format. Where full predictions are too large to hold (text: a 50k-token vocabulary), `loss`
    maps it to the per-position loss (B, T) instead (float64, 0 where unscored)."""

    name: str
    role: Role
    description: str
    predict: Callable[[Batch], Tensor] | None = None
    loss: Callable[[Batch], Tensor] | None = None


class TrainingBatches(torch.utils.data.Dataset):
    """Training batch number `step` of one rank, sampled on the CPU from the generator of
    (seed, rank, step), whatever device trains: a batch is the same on every device, and it can
    be made in DataLoader worker processes, off an accelerator's critical path (a sampler's
    few hundred small ops would otherwise be kernel launches between training steps). Batches
    carry no latent (training never reads it; it would only be copied)."""

    def __init__(self, task: "Task", rank: int, pool: dict[str, Tensor] | None = None):
        self.task, self.rank, self.pool = task, rank, pool

    def __getitem__(self, micro_step: int) -> Batch:
        """Micro-batch `micro_step`: part j of step s's batch (s, j = divmod(micro_step, k), k =
        task.micro_batches), so that accumulating gradients over k micro-batches trains on the
        very sequences one batch would. Each part samples the whole batch of its step and keeps
        its slice: k times the sampling, never a different batch."""
        step, part = divmod(micro_step, self.task.micro_batches)
        batch = self.task.training_batch(step, self.rank, self.pool)
        if self.task.micro_batches > 1:
            size = self.task.micro_batch_size
            # copies: a slice would carry the whole batch's storage to the training process
            batch = Batch(*(t[part * size:(part + 1) * size].clone() for t in
                            (batch.inputs, batch.targets, batch.loss_mask)))
        return Batch(batch.inputs, batch.targets, batch.loss_mask)


class Steps(torch.utils.data.Sampler):
    """The (micro-)step numbers start, start + 1, ...: endless, training stops at max_steps."""

    def __init__(self, start: int = 0):
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.count(self.start)


class Task(abc.ABC):
    """Base class of every task family. A subclass sets the class attributes and implements
    `sample`, `references`, `input_dim` and `output_dim`; the family is found by its `family`
    name (tasks/__init__.py discovers subclasses), its defaults are in conf/task/<name>.yaml."""

    family: ClassVar[str]
    kind: ClassVar[Kind]
    Config: ClassVar[type]  # a dataclass: the task's typed, defaulted parameters
    description: ClassVar[str]  # `bench list` shows it for a conf file without a first comment
    # "gap": scored against a bayes/bound reference (the Bayes gap); "perplexity": a task with
    # no Bayes predictor (text), scored by perplexity, its references labelled baselines
    scoring: ClassVar[str] = "gap"
    # names of model probes (per-position internals, models/backbone.py Backbone.probe) the task
    # summarises in the record's metrics.probe (summarize_probes), when the model has them
    probes: ClassVar[tuple[str, ...]] = ()
    # the option that sets how many held-out sequences evaluation scores (held_out_size), which
    # the memory check names when evaluation does not fit
    eval_size_option: ClassVar[str] = "trainer.eval_sequences"

    def __init__(self, config=None, *, batch_size: int = 32, seed: int = 0):
        super().__init__()
        self.config = config if config is not None else self.Config()
        self.batch_size = batch_size
        self.seed = seed

    # --- the contract --------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        """Number of positions T of a sampled sequence (inputs.shape[1])."""
        return self.config.seq_len

    @property
    @abc.abstractmethod
    def input_dim(self) -> int:
        """Vocabulary size (tokens) or input vector size (vectors)."""

    @property
    @abc.abstractmethod
    def output_dim(self) -> int:
        """Vocabulary size (tokens) or target vector size (vectors)."""

    @abc.abstractmethod
    def sample(self, n: int, generator: torch.Generator) -> Batch:
        """n sequences on generator.device, drawn with generator only (reproducible)."""

    @abc.abstractmethod
    def references(self) -> dict[str, Reference]:
        """{name: Reference}, with at least one `bayes` or `bound` reference."""

    # --- the training batches -------------------------------------------------------------
    @property
    def num_tasks(self) -> int:
        """Size of the pool of training tasks; 0: a fresh task for every training sequence (a
        LatentTask's Config may set it)."""
        return getattr(self.config, "num_tasks", 0)

    def pool_bytes(self) -> int:
        """Bytes the pool of training tasks holds, for the memory estimate: none here."""
        return 0

    def training_pool(self, device: torch.device | str) -> dict[str, Tensor] | None:
        """The pool of training tasks, drawn on `device`; None: every training sequence draws a
        fresh task (here always; a LatentTask with num_tasks > 0 has one)."""
        return None

    def sample_train(self, n: int, generator: torch.Generator,
                     pool: dict[str, Tensor] | None = None) -> Batch:
        """A training batch: `sample` (a LatentTask with num_tasks > 0 draws from its pool)."""
        return self.sample(n, generator)

    # --- shared by all tasks -------------------------------------------------------------
    def position_loss(self, prediction: Tensor, targets: Tensor) -> Tensor:
        """Per-position loss (B, T): cross-entropy in nats of log-probabilities, or the squared
        error averaged over the target's coordinates."""
        if self.kind == "tokens":
            return -prediction.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return (prediction - targets).pow(2).mean(-1)

    def summarize(self, batch: Batch, losses: dict[str, Tensor],
                  scores: dict[str, dict[str, Tensor]] | None = None) -> dict:
        """Task-specific extra metrics for the run record (JSON-serialisable), computed from the
        per-position losses (B, T) of the model ("model") and of every reference on the held-out
        batch, and from their other per-position scores (`scores[name]`: "loss", and for tokens
        "correct", the top-1 hits, and "l1", the L1 distance to the gap reference's
        distribution, for vectors "error", the signed errors (B, T, d_out); bench/training/evaluate.py
        position_scores; None when not known). The runner already records mean losses, gaps
        with CIs and per-position curves."""
        return {}

    def summarize_sequences(self, batch: Batch, scores: dict[str, dict[str, Tensor]]) -> dict:
        """The per-sequence values behind those of summarize's metrics that are means over the
        held-out sequences, or functions of such means, for comparisons paired by sequence
        between records of one held-out set (bench/reports/claims): nested dicts whose leaves
        are tensors (B,), one value per held-out sequence, or plain numbers. Recorded under
        per_sequence.task; {} where the task has none."""
        return {}

    def summarize_probes(self, batch: Batch, probes: dict[str, Tensor]) -> dict:
        """The record's metrics.probe from the model's probes on the held-out batch: `probes` holds
        those of the names in `probes` (the class attribute) that the model has, each (B, T, ...)
        on the CPU. The task knows what its positions mean, the model what its internals mean."""
        return {}

    def summarize_predictor(self, predict: Callable[[Tensor], Tensor], batch_size: int) -> dict:
        """Measures of the trained predictor as a function, on inputs the task builds itself
        (not the held-out set), for the record's metrics.probe: `predict` maps inputs (B, T, d)
        to predictions (B, T, ...) on the CPU, `batch_size` sequences at a time at most, and
        autograd can differentiate it in its inputs (work under torch.no_grad where no gradient
        is wanted). The model is a black box here, so a measure holds for every architecture."""
        return {}

    def latent_floats(self) -> int:
        """Floats of hidden parameters (and per-sequence reference workspace beyond the
        predictions) one sequence needs: the part of the memory estimate made before a run
        (bench/training/memory.py) that only the family knows. Override where it can be large."""
        return 0

    def memory_per_sequence(self) -> int:
        """Bytes one sampled sequence holds: inputs, targets, mask and latent, in 8-byte units."""
        width = 1 if self.kind == "tokens" else self.input_dim + self.output_dim
        return 8 * ((self.seq_len + 1) * (width + 1) + self.latent_floats())

    def held_out_size(self, n: int) -> int:
        """The number of sequences held_out(n) will hold, known before it is drawn (for the
        memory estimate): n. A task whose data decides (text) overrides it."""
        return n

    @property
    def held_out_from_prior(self) -> bool:
        """Whether the held-out set is drawn from the training distribution. Only then is the
        `bayes` reference optimal on it, and a model beating it beyond the interval a bug."""
        return True

    def held_out(self, n: int, split: int = TEST_STREAM) -> Batch:
        """The fixed evaluation set: sampled on the CPU from a seed that depends only on the split,
        so every model (and every device) is scored on the same sequences."""
        return self.sample(n, make_generator(split, 0))

    def cache_identity(self) -> dict:
        """What the held-out set and reference scores depend on beyond the config and the code
        (bench/training/reference_cache.py), e.g. the files of a text corpus. Nothing for synthetic tasks."""
        return {}

    def config_dict(self) -> dict:
        return dataclasses.asdict(self.config)

    # --- loaders: training batches are sampled on the CPU, in loader workers. The Lightning
    # data module that hands them to a Trainer is bench.training.datamodule.TaskData, so that
    # a task (and `run print_config=true`, which builds one) does not import Lightning.
    loader_workers: int = 0  # processes sampling training batches (bench sets it per run)
    micro_batches: int = 1  # trainer.accumulate_grad_batches (bench.training.devices.rank_task sets it)

    @property
    def micro_batch_size(self) -> int:
        """Sequences of one forward pass: this rank's batch over the micro-batches of a step."""
        return self.batch_size // self.micro_batches
    PREFETCH = 4  # batches each loader worker keeps ready

    def prepare_data(self) -> None:
        """Once per node before training (bench.training.datamodule calls it where Lightning
        asks): what is fetched or computed once per machine (the text task tokenizes its splits
        there). Nothing by default."""

    def setup(self, stage: str) -> None:
        """On every rank after prepare_data, before the first step or evaluation (the text task
        checks its splits' exact sizes there). Nothing by default."""

    def training_batch(self, step: int, rank: int = 0,
                       pool: dict[str, Tensor] | None = None) -> Batch:
        """Training batch number `step` of DDP rank `rank` (this rank's share of the global
        batch), from the CPU generator of (seed, rank, step): reproducible and resumable."""
        generator = make_generator(TRAIN_STREAM, self.seed, rank, step)
        return self.sample_train(self.batch_size, generator, pool)

    def train_loader(self, steps_done: int = 0, rank: int = 0,
                     device: torch.device = torch.device("cpu")):
        """Batches from optimizer step `steps_done` on (a resumed run continues the stream),
        sampled in `loader_workers` worker processes (0: in this process) and pinned for the copy
        to a GPU. A pool of training tasks is drawn once, on the training device (fast for large
        pools), and the workers sample from a CPU copy of it."""
        start = steps_done * self.micro_batches  # each step is micro_batches batches
        pool = self.training_pool(device)
        pool = {name: value.cpu() for name, value in pool.items()} if pool is not None else None
        workers = self.loader_workers
        # fork: the workers inherit the task (and its pool) and sample on the CPU only; "spawn"
        # would pickle the task with its trainer.
        context = ("fork" if workers and "fork" in multiprocessing.get_all_start_methods()
                   else None)
        return torch.utils.data.DataLoader(
            TrainingBatches(self, rank, pool), batch_size=None, sampler=Steps(start),
            num_workers=workers, pin_memory=device.type == "cuda",
            prefetch_factor=self.PREFETCH if workers else None, multiprocessing_context=context)

    def set_held_out(self, n: int, batch_size: int, batch: Batch | None = None) -> Batch:
        """Fix the held-out set that `test_loader` shards (the trainer's test): `batch` when
        given (the cached set), else held_out(n); returns it."""
        self.held_out_batch = batch if batch is not None else self.held_out(n)
        self.eval_batch_size = batch_size
        return self.held_out_batch

    def test_loader(self, rank: int = 0, world: int = 1):
        """This rank's shard of the held-out set: sequences rank, rank + world, ... (disjoint
        across ranks, together all of them), as batches of sequence indices (held_out_rows
        turns them into sequences on the device)."""
        shard = torch.arange(rank, len(self.held_out_batch), world)
        return torch.utils.data.DataLoader(shard, batch_size=self.eval_batch_size)

    def held_out_rows(self, index: Tensor) -> Batch:
        """The held-out sequences at `index`, on index's device."""
        return self.held_out_batch.select(index.cpu()).to(index.device)


class LatentTask(Task):
    """A family whose sequences follow from a task drawn from the prior (its hidden parameters,
    `draw_latent`): its `sample(n, g)` is `sample_given(draw_latent(n, g), g)` by construction,
    and it can train on a finite pool of tasks (paper 004 Fig. 2 left). With `num_tasks` = N > 0
    the training batches (sample_train) draw each sequence's latent uniformly from N tasks drawn
    once; `sample`, and so the held-out set, still draws a fresh task per sequence from the
    prior."""

    def sample(self, n: int, generator: torch.Generator) -> Batch:
        return self.sample_given(self.draw_latent(n, generator), generator)

    @abc.abstractmethod
    def draw_latent(self, n: int, generator: torch.Generator) -> dict[str, Tensor]:
        """The hidden parameters of n tasks drawn from the prior (first axis n)."""

    @abc.abstractmethod
    def sample_given(self, latent: dict[str, Tensor], generator: torch.Generator) -> Batch:
        """One sequence per task of `latent` (as drawn by draw_latent)."""

    def training_pool(self, device: torch.device | str) -> dict[str, Tensor] | None:
        return self.task_pool(device) if self.num_tasks else None

    def task_pool(self, device: torch.device | str) -> dict[str, Tensor]:
        """The num_tasks training tasks, drawn once on `device` from (POOL_STREAM, run seed), as
        the training batches are drawn on the training device: the same pool on every DDP rank
        (they share a device type), and a large pool is drawn where the sampler is fastest (on
        one CPU core 2,000 of paper 004's HMMs take ~14 s, so its 50,000 ~6 minutes)."""
        pools = self.__dict__.setdefault("_task_pools", {})
        key = str(torch.device(device))
        if key not in pools:
            pools[key] = self._draw_pool(torch.device(device))
        return pools[key]

    def _draw_pool(self, device: torch.device, chunk_floats: int = 1 << 24) -> dict[str, Tensor]:
        """num_tasks tasks from one generator, in consecutive chunks of ~chunk_floats floats so
        that a large pool's sampling temporaries stay small (a pool that fits in one chunk is
        draw_latent(num_tasks) from that generator)."""
        generator = make_generator(POOL_STREAM, self.seed, device=device)
        per_task = sum(v.numel() for v in self.draw_latent(1, torch.Generator()).values())
        chunk = max(1, chunk_floats // max(1, per_task))
        parts = [self.draw_latent(min(chunk, self.num_tasks - start), generator)
                 for start in range(0, self.num_tasks, chunk)]
        return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}

    def pool_bytes(self) -> int:
        if self.num_tasks == 0:
            return 0
        one = self.draw_latent(1, torch.Generator())
        return self.num_tasks * sum(v.numel() * v.element_size() for v in one.values())

    def sample_train(self, n: int, generator: torch.Generator,
                     pool: dict[str, Tensor] | None = None) -> Batch:
        """With num_tasks > 0, sequences of tasks drawn uniformly (with replacement) from the
        pool (`pool`, else the one drawn on the generator's device)."""
        if self.num_tasks == 0:
            return self.sample(n, generator)
        pool = pool if pool is not None else self.task_pool(generator.device)
        index = torch.randint(self.num_tasks, (n,), generator=generator, device=generator.device)
        return self.sample_given({name: value[index] for name, value in pool.items()}, generator)


# Context-length bins of the per-position scores (lgssm, lgssm_colored, hmm, markov summaries).
def context_bins(ks: list[int], length: int, device: torch.device | str = "cpu") -> Tensor:
    """(len(ks), length) float64 indicators: row r marks the positions whose context length
    (position index + 1: the loss at index i predicts from i + 1 observations) lies in
    (k_r // 2, k_r]. For k = 1, 2, 4, ... the bins tile the axis on a log scale."""
    bins = torch.zeros(len(ks), length, dtype=torch.float64, device=device)
    for row, k in enumerate(ks):
        bins[row, k // 2:k] = 1.0
    return bins


def doubling_lengths(first: int, last: int) -> list[int]:
    """first, 2·first, 4·first, ... up to last."""
    ks, k = [], first
    while k <= last:
        ks.append(k)
        k *= 2
    return ks
