"""The memory a run needs, estimated before anything runs (bench/training/checks.py compares it with
what each side has free).

The model's passes are measured as they will run (precision, SSD kernel): a training step's
forward pass, loss and backward pass and an evaluation call, following every allocation to its
peak. A CPU run's small model (the default one, most synthetic tasks) is measured on real
tensors, in milliseconds; any other is built under FakeTensorMode (shapes and dtypes without
storage), so a model that would need 100 GB is measured in a fraction of a second, at about
0.5 ms an op. With the buffers it counts, the estimate is per side, the training device of this
rank and the host."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bench.config import CheckFailed, first_line
from bench.training.devices import loader_workers, local_rank, world_size
from bench.training.evaluate import masked_loss, token_scores
from models import build_model
from models.backbone import IOSpec
from models.ssd import kernel_footprint, mamba_ssm_available, scan_override
from tasks.base import Batch, Task
from tasks.processes import host_available_bytes

GIB = 2**30
MIB = 2**20


def available_bytes(side: str) -> int | None:
    """Free memory of `side`: "cuda", this rank's GPU (LOCAL_RANK; asking opens a CUDA context on
    that GPU only), or "host", the node's available RAM; None when it cannot be read."""
    if side == "cuda":
        free, _ = torch.cuda.mem_get_info(local_rank())
        return int(free)
    return host_available_bytes()


# Allowances for what a run allocates beyond the tensors measured here, after the checks. Host:
# Lightning's loops, the threads' malloc arenas, allocator slack (the default run's peak RSS is
# 155 MB above its RSS when checked, with ~40 MB of tensors). CUDA: the host memory of the
# libraries a run's first kernels load (cuBLAS, cuDNN), and on the GPU their workspaces and the
# caching allocator's rounding (neither measured: no GPU was lent to this work).
HOST_RUNTIME = 256 * MIB
CUDA_HOST_RUNTIME = GIB
CUDA_RUNTIME = 512 * MIB


# the *-mixed precisions' autocast dtypes: activations in 2 bytes, weights in float32
AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def parameter_bytes(precision: str) -> int:
    """Bytes of a parameter, a gradient or an AdamW moment: float64 under 64-true, else float32
    (*-mixed keeps float32 weights and computes under autocast)."""
    return 8 if precision in ("64-true", "64") else 4


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None):
    """torch's default floating dtype set to `dtype` inside (None: unchanged), restored after."""
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def precision_context(precision: str):
    """The forward context Lightning's precision plugin gives a step: autocast for *-mixed (on the
    CPU device type, where the fake tensors live; as on CUDA, matmuls run in half precision and
    losses and reductions in float32), float64 as the default dtype for 64-true."""
    half = AUTOCAST_DTYPES.get(precision)
    if half is not None:
        with torch.autocast("cpu", dtype=half):
            yield
    elif parameter_bytes(precision) == 8:
        with default_dtype(torch.float64):
            yield
    else:
        yield


class OverLimit(Exception):
    """Allocations went past its limit: the measurement on real tensors stops there."""


class _CountAllocations:
    """Allocations' dispatch, on a base of its own: TorchDispatchMode wraps a subclass's own
    __torch_dispatch__ in torch._dynamo.disable, whose first call imports Dynamo (1.1 s of
    `run print_config=true`'s 3 s here). Nothing this counts runs under torch.compile."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        for result, declared in zip(out if len(returns) > 1 else (out,), returns):
            if declared.alias_info is None:
                for tensor in tree_leaves(result):
                    if isinstance(tensor, torch.Tensor):
                        storage = tensor.untyped_storage()
                        size = storage.nbytes()
                        self.live += size
                        weakref.finalize(storage, self._free, size)
        self.peak = max(self.peak, self.live)
        if self.limit is not None and self.live > self.limit:
            raise OverLimit
        return out


class Allocations(_CountAllocations, TorchDispatchMode):
    """Bytes of the tensors that ops allocate while it is active: `live` now, `peak` so far;
    past `limit` live bytes (if given) the op that went past it raises OverLimit.

    A storage counts from the op that creates it until it is freed (a weak reference's
    callback), so what autograd saves counts until the backward pass releases it; results that
    alias an input (views, in-place ops: the op's schema says so) allocate nothing. On fake
    tensors it measures a model's peak without its memory."""

    def __init__(self, limit: int | None = None):
        super().__init__()
        self.live = self.peak = 0
        self.limit = limit

    def _free(self, size: int) -> None:
        self.live -= size


@dataclasses.dataclass(frozen=True)
class Footprint:
    """A model's parameters, and the peak bytes its passes allocate on one rank (_measure): the
    training forward pass with its loss, that and the backward pass (the new gradients
    included), and one evaluation call (an evaluation batch; for text, the first chunk of it,
    bench/training/evaluate.py token_scores)."""

    params: int
    forward: int = 0
    backward: int = 0
    evaluation: int = 0


def scan_kernel(config, device: str, mamba_ssm: bool | None = None) -> str | None:
    """The SSD scan the run's model will use on `device` (models.ssd.resolve_kernel): "auto" is
    the mamba_ssm kernel on CUDA when it imports (`mamba_ssm`: whether it does, default: ask
    this machine) and the precision is not float64. None for a model without an SSD scan."""
    kernel = getattr(config.model, "kernel", None)
    if kernel != "auto":
        return kernel
    if device != "cuda" or parameter_bytes(config.trainer.precision) == 8:
        return "torch"
    if mamba_ssm is None:
        mamba_ssm = mamba_ssm_available()
    return "mamba_ssm" if mamba_ssm else "torch"


def model_footprint(config, task, kernel: str | None, eval_rows: int, device: str,
                    budget: int | None = None) -> Footprint:
    """The Footprint of the run's model at one rank's batch, with the SSD scan `kernel`, for
    training on `device` ("cpu": a small model's passes run as they will, _measure). A deep
    model is measured at depths 1 and 2 and extrapolated linearly (its layers are identical), so
    10^5 layers cost no more to check than 2."""
    depth = getattr(config.model, "n_layers", None)
    if not isinstance(depth, int) or depth <= 2:
        return _footprint(config, config.model, task, kernel, eval_rows, device, budget)
    # the budget's checks hold at depths 1 and 2 a fortiori: fewer weights, the same output
    one, two = (_footprint(config, dataclasses.replace(config.model, n_layers=layers), task, kernel,
                           eval_rows, device, budget) for layers in (1, 2))
    if (one.forward == 0) != (two.forward == 0):  # the weights' check cut depth 2 short alone
        return Footprint(one.params + (depth - 1) * (two.params - one.params))
    return Footprint(*(a + (depth - 1) * (b - a)
                       for a, b in zip(dataclasses.astuple(one), dataclasses.astuple(two))))


# Measured footprints by what they depend on: a suite's seeds of one config (or a sweep's) measure
# the model once, not 0.3 s an entry (a 1,000-entry suite checked for 280 s)
_measured: dict[str, Footprint] = {}


def _footprint_key(config, model_config, task, kernel: str | None, eval_rows: int,
                   device: str) -> str:
    """Everything a footprint can depend on: the whole config but the seed and names (the seed
    draws the data, never a shape), the model config measured, the task as built, the pass and
    the device."""
    described = {k: v for k, v in config.describe().items()
                 if k in ("task", "model", "trainer")}
    return json.dumps([described, dataclasses.asdict(model_config), type(task).__qualname__,
                       task.kind, task.input_dim, task.output_dim, task.seq_len,
                       task.micro_batch_size, task.scoring, kernel, eval_rows, device],
                      sort_keys=True, default=repr)


def _footprint(config, model_config, task, kernel: str | None, eval_rows: int, device: str,
               budget: int | None) -> Footprint:
    """Builds the model and measures its passes (Allocations, _measure); a model
    constructor's ValueError (a model that does not fit the task) becomes CheckFailed. The passes
    are skipped when the weights, gradients and AdamW state alone, or the training pass's output
    alone, exceed `budget` bytes (a lower bound that refuses the run all the same), and
    measure nothing for a model whose forward pass depends on the data (no estimate). A footprint
    measured in full is kept for the next config that differs only in seed or names."""
    key = _footprint_key(config, model_config, task, kernel, eval_rows, device)
    if key in _measured:
        return _measured[key]
    found, cut_short = _measure(config, model_config, task, kernel, eval_rows, device, budget)
    if not cut_short:  # a budget's early answer is not what a larger budget would measure
        _measured[key] = found
    return found


# A CPU run's model is measured on real tensors, running the kernels the run will run, when its
# weights and each pass's live tensors stay under REAL_BYTES and its parameters times the
# positions of the passes under REAL_WORK: the default model's passes then take ~40 ms, where
# fake tensors cost ~0.5 ms an op (0.5 s for the default model) and FakeTensorMode imports
# Dynamo (1 s).
# Anything larger, a GPU run's model, or anything the host cannot run is measured on fake
# tensors. The two agree where the CPU's kernels allocate what their meta functions say
# (tests/test_memory.py); where not, the real one is the run's (nn.LSTM's CPU kernel keeps a
# workspace its meta function leaves out: 37 against 5.5 MB for the default task).
REAL_BYTES = 256 * MIB
REAL_WORK = 2 * 10**9


def _measure(config, model_config, task, kernel: str | None, eval_rows: int, device: str,
             budget: int | None) -> tuple[Footprint, bool]:
    """_footprint's measurement, and whether `budget` cut it short: on real tensors for a small
    model of a CPU run (REAL_BYTES, REAL_WORK), else on fake ones."""
    if device == "cpu":
        try:
            # the global generator as it was: building a model draws its initial weights
            with torch.random.fork_rng(devices=[]):
                found = _measure_passes(config, model_config, task, kernel, eval_rows, budget,
                                        real=True)
            if found is not None:
                return found
        except Exception:  # past the limits, or anything else: fake tensors measure and decide
            pass
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        return _measure_passes(config, model_config, task, kernel, eval_rows, budget, real=False)


def _measure_passes(config, model_config, task, kernel: str | None, eval_rows: int,
                    budget: int | None, real: bool) -> tuple[Footprint, bool] | None:
    """Builds the model and measures its passes (on fake tensors when called under
    FakeTensorMode). `real`: tensors with storage, bounded by REAL_BYTES (OverLimit) and
    REAL_WORK (None: measure it on fake tensors)."""
    precision = config.trainer.precision
    io = IOSpec(task.kind, task.input_dim, task.output_dim, task.seq_len)
    limit = REAL_BYTES if real else None
    try:
        # a float64 run's model is built in float64: module.double() cannot swap the
        # parameters of a model without storage
        with default_dtype(torch.float64 if parameter_bytes(precision) == 8 else None), \
                (Allocations(limit) if real else contextlib.nullcontext()):  # weights' bound
            model = build_model(config.model_family, model_config, io)
    except ValueError as error:
        if real:  # fake tensors decide what is the config's fault
            raise
        raise CheckFailed(f"model {config.model_name} cannot be built for task "
                          f"{config.task_name}: {first_line(error) or type(error).__name__}") from None
    params = sum(p.numel() for p in model.parameters())
    if budget is not None and 4 * parameter_bytes(precision) * params > budget:
        return Footprint(params), True
    # Every training forward pass ends in the model's output (rows, T, output_dim), its
    # gradient beside it: past the budget the run cannot fit, whatever else it holds, and
    # measuring it would walk a loss chunked over ~10^5 chunks op by op (trainer.batch_size=10^9
    # took 6 minutes to be refused).
    output = (task.micro_batch_size * task.seq_len * task.output_dim
              * (2 if precision in AUTOCAST_DTYPES else parameter_bytes(precision)))
    if budget is not None and output > budget:
        return Footprint(params, output, 2 * output), True
    if real and params * (task.micro_batch_size + eval_rows) * task.seq_len > REAL_WORK:
        return None

    def batch(rows: int) -> Batch:
        shape = (rows, task.seq_len)
        inputs = (torch.zeros(shape, dtype=torch.long) if task.kind == "tokens"
                  else torch.zeros(*shape, task.input_dim))
        targets = (torch.zeros(shape, dtype=torch.long) if task.kind == "tokens"
                   else torch.zeros(*shape, task.output_dim))
        return Batch(inputs, targets, torch.ones(shape, dtype=torch.bool))

    # an op that cannot run on fake tensors logs a traceback before raising: not for users
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level, fake_log.level = fake_log.level, logging.CRITICAL
    scan = scan_override(kernel_footprint) if kernel == "mamba_ssm" else contextlib.nullcontext()
    try:
        with scan, precision_context(precision):
            train = batch(task.micro_batch_size)
            with Allocations(limit) as allocated:
                output = model(train.inputs)
                loss = masked_loss(task, output, train)  # the run's loss, no data-sized op
                del output
                forward = allocated.peak
                loss.backward()
                backward = allocated.peak
            held_out = batch(eval_rows)
            model.eval()
            with torch.no_grad(), Allocations(limit) as allocated:
                if task.scoring == "perplexity":
                    token_scores(model, held_out, task.output_dim)
                else:
                    model.predict(held_out.inputs).float()
            return Footprint(params, forward, backward, allocated.peak), False
    except Exception as error:
        if real:  # fake tensors decide what is the config's fault
            raise
        if isinstance(error, ValueError):
            raise CheckFailed(f"model {config.model_name} does not fit task {config.task_name}: "
                              f"{first_line(error) or type(error).__name__}") from None
        # a data-dependent forward pass cannot run without data: no estimate
        return Footprint(params), False
    finally:
        fake_log.setLevel(level)


@dataclasses.dataclass(frozen=True)
class Term:
    """A part of the estimate: bytes that live on `side` ("device": one rank's training device;
    "host": the node's RAM, every rank on it) during `phase` ("training" or "evaluation"), what
    they hold, and the option that shrinks them (named when the run does not fit)."""

    side: str
    phase: str
    what: str
    option: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A run's memory at the peak of each phase on each side: a CUDA run's "device" (one rank's
    GPU) and "host"; a CPU run has only the host, where the device terms of its `ranks`
    processes add to the host's."""

    device: str
    params: int
    ranks: int  # training processes on this node
    terms: tuple[Term, ...]

    @property
    def sides(self) -> tuple[str, ...]:
        return ("device", "host") if self.device == "cuda" else ("host",)

    def parts(self, side: str, phase: str) -> list[Term]:
        """The terms of `phase` on `side`, largest first."""
        if self.device == "cuda":
            parts = [t for t in self.terms if t.phase == phase and t.side == side]
        else:
            parts = [dataclasses.replace(t, bytes=t.bytes * self.ranks) if t.side == "device"
                     else t for t in self.terms if t.phase == phase]
        return sorted(parts, key=lambda t: -t.bytes)

    def need(self, side: str, phase: str) -> int:
        return sum(t.bytes for t in self.parts(side, phase))


def pool_peak_bytes(task, probe: int = 64, chunk_floats: int = 1 << 24) -> int:
    """Peak bytes of drawing the pool of training tasks (tasks/base.py LatentTask `_draw_pool`),
    not just of holding it: the chunks and their concatenation live together (twice the pool),
    and the chunk being drawn has its sampling temporaries, measured on a draw of `probe` tasks
    and scaled to a chunk (`chunk_floats`, _draw_pool's default). Counting the pool once let
    linreg num_tasks=10^9 (18.6 GiB held, 37 GiB at the peak) past the check on a 21 GiB host,
    where the kernel killed it with no record."""
    pool = task.pool_bytes()
    if pool == 0:
        return 0
    generator = torch.Generator().manual_seed(0)
    with Allocations() as allocated:
        drawn = task.draw_latent(probe, generator)
    kept = sum(v.numel() * v.element_size() for v in drawn.values())
    per_task = max(0, allocated.peak - kept) / probe
    floats = max(1, sum(v[0].numel() for v in drawn.values()))
    chunk = min(task.num_tasks, max(1, chunk_floats // floats))
    return 2 * pool + int(per_task * chunk)


def batches_in_flight(config) -> int:
    """Training batches of one rank alive on the host at once: each loader worker's prefetch
    and the pinned copy, or the one being made and the one training when sampled in-process."""
    workers = loader_workers(config)
    return 2 if workers == 0 else workers * Task.PREFETCH + 1


def memory_estimate(config, task, device: str, kernel: str | None = None,
                    budget: int | None = None) -> Estimate:
    """Bytes the run needs at its peaks (an upper estimate from measured passes and counted
    buffers), for training on `device` ("cpu" or "cuda": this machine need not have it) at the
    configured precision, with the SSD scan `kernel` (default: scan_kernel on this machine).

    Device, per rank. Training: weights, gradients and two AdamW moments (the last step's
    gradients live until the next backward pass; AdamW's foreach step adds a parameter-sized
    temporary), DDP's gradient buckets, the activations and loss measured at their peak, the
    batch and the pool of training tasks. Evaluation: weights and gradients, one evaluation
    call, the model outputs gathered from every rank (and their sorted float32 and float64
    copies).
    Host, per node. Training: the batches the loader prefetches. Evaluation: on every rank the
    held-out set, the gathered predictions in float64 and the AdamW state (and on a GPU, the
    model), which Lightning moves to the host after fitting; on rank 0 the references' float64
    predictions (and a few same-sized intermediates) and the bootstrap's resampled index.
    Both sides and phases: the allowances for what is not a tensor counted here (HOST_RUNTIME,
    CUDA_HOST_RUNTIME, CUDA_RUNTIME)."""
    t = config.trainer
    kernel = kernel if kernel is not None else scan_kernel(config, device)
    world = world_size(config)
    ranks = world // t.num_nodes
    held_out = task.held_out_size(t.eval_sequences)
    eval_rows = max(1, min(t.eval_batch_size, -(-held_out // world)))
    model = model_footprint(config, task, kernel, eval_rows, device, budget)
    weights = parameter_bytes(t.precision) * model.params  # one parameter-sized buffer
    per_sequence = task.memory_per_sequence()
    size = task.eval_size_option
    if task.scoring == "perplexity":  # per-position losses and top-1 hits, never distributions
        outputs, prediction = 2, task.seq_len * 16
    else:
        outputs, prediction = task.output_dim, task.seq_len * task.output_dim * 8
    predictors = len(task.references()) + 1
    runtime = HOST_RUNTIME + (CUDA_HOST_RUNTIME if device == "cuda" else 0)
    activations = max(model.forward, model.backward - weights, weights)
    terms = [
        Term("device", "training", "weights, gradients and AdamW state", "the model size",
             (5 if world > 1 else 4) * weights),
        Term("device", "training", "activations and loss",
             "trainer.batch_size, task.seq_len or trainer.accumulate_grad_batches", activations),
        Term("device", "training", "the batch", "trainer.batch_size",
             task.micro_batch_size * per_sequence),
        Term("device", "training", "the pool of training tasks", "task.num_tasks",
             pool_peak_bytes(task)),
        Term("device", "evaluation", "weights and gradients", "the model size", 2 * weights),
        Term("device", "evaluation", "an evaluation batch's forward pass",
             "trainer.eval_batch_size", model.evaluation),
        Term("device", "evaluation", "the gathered model outputs", size,
             24 * held_out * task.seq_len * outputs),
        Term("host", "training", "the processes' runtime", "", ranks * runtime),
        Term("host", "training", "training batches sampled ahead (loader workers, pinned)",
             "trainer.batch_size or trainer.loader_workers",
             ranks * batches_in_flight(config) * (t.batch_size // world) * per_sequence),
        Term("host", "evaluation", "the processes' runtime", "", ranks * runtime),
        Term("host", "evaluation", "the AdamW state (and a GPU run's model) after fitting",
             "the model size", ranks * (4 if device == "cuda" else 2) * weights),
        Term("host", "evaluation", "the held-out set and predictions on every rank", size,
             ranks * held_out * (per_sequence + prediction)),
        Term("host", "evaluation", "the references' float64 predictions", size,
             held_out * 3 * predictors * prediction),
        Term("host", "evaluation", "the bootstrap", f"trainer.bootstrap or {size}",
             24 * t.bootstrap * held_out),
    ]
    if t.val_every > 0:  # bench/training/validation.py keeps it on rank 0 for the whole of training
        val = min(t.val_sequences, task.held_out_size(t.val_sequences))
        terms.append(Term("host", "training", "the live-validation set, its references' scores "
                          "and their bootstrap", "trainer.val_sequences",
                          val * (per_sequence + prediction * (1 + 3 * predictors))
                          + 24 * t.bootstrap * val))
    if device == "cuda":
        terms += [Term("device", phase, "CUDA workspaces", "", CUDA_RUNTIME)
                  for phase in ("training", "evaluation")]
    return Estimate(device, model.params, ranks, tuple(terms))


def free_memory(device: str) -> dict[str, int | None]:
    """What each side a run on `device` uses has free, in bytes (None: cannot be read)."""
    free = {"host": available_bytes("host")}
    if device == "cuda":
        free["device"] = available_bytes("cuda")
    return free
