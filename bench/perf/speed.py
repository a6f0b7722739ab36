"""Throughput of a configured run: the training step for every kernel, precision and compile
setting that applies on this device, the task's sampler and references, and the share of a whole
run spent outside training (held-out set, references, the model's evaluation, scoring); and what
decides whether an accelerator would be starved, measurable on any machine: the sampler's aten
calls and time per batch (on the CPU, where training batches are sampled), and the aten calls and
host synchronisations of one whole training step as Lightning runs it (`step_profile`).

Timings exclude warm-up steps (allocation, lazy initialisation, compilation: its cost is reported
separately as the first step's time) and synchronise CUDA before reading the clock. Mixed
precision is timed as Lightning runs it: the forward pass and loss under torch.autocast (16-mixed
adds Lightning's loss scaling, a few elementwise operations, which is left out here)."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import os
import statistics
import sys
import tempfile
import time
import warnings
import weakref
from collections import Counter

import lightning as L
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from bench.config import RunConfig
from bench.records.store import thread_wait
from bench.training import reference_cache
from bench.training.datamodule import TaskData
from bench.training.devices import loader_workers
from bench.training.evaluate import masked_loss, reference_scores, score_predictions, token_scores
from bench.training.module import ICLModule, adamw_implementation
from bench.training.train import apply_tf32_policy, build, make_trainer, quiet_lightning
from models.ssd import mamba_ssm_available, resolve_kernel
from tasks.base import TRAIN_STREAM, make_generator


class HostSyncCounter:
    """Counts, within a `with` block, what would make the host wait for a GPU, by op: reading a
    value back (`_local_scalar_dense`: item, bool, int, float, and the reads C++ ops make
    inside; `tolist`), ops whose output size depends on the data (nonzero, masked_select,
    unique, indexing with a boolean mask), and blocking copies to the device: `Tensor.to`,
    `cuda()` or `copy_` of a host tensor without non_blocking=True (a tensor is the device's when
    it is in `resident`, the model's parameters, gradients and optimizer state, or an op in the
    block made it; any other is the host's, e.g. a batch from the loader), any copy between two
    devices, and `torch.tensor`/`as_tensor` with a device or `new_tensor` (Python data to the
    device). On the CPU nothing waits, so this is how a CPU run tells what a GPU run would wait
    for: every tensor counts, except `host` (ids of tensors that stay on the host in a GPU run
    too: the optimizer's step counters); on CUDA only reads of CUDA tensors count. Reads are
    seen at the dispatcher (torch_dispatch), calls and copies as Python makes them
    (torch_function)."""

    READS = {"_local_scalar_dense"}
    DATA_SHAPED = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
                   "_unique", "_unique2", "unique_dim", "nonzero_static"}
    CALLED_READS = {"tolist", "cpu"}
    CREATED = {"tensor", "as_tensor"}

    def __init__(self, host: set[int], resident: set[int] = frozenset()):
        self.host, self.resident, self.calls = host, resident, Counter()
        self.made: dict[int, weakref.ref] = {}  # tensors an op made in the block: the device's
        counter = self

        class Calls(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = getattr(func, "__name__", "")
                first = args[0] if args else None
                if counter._counts(first):
                    if name in counter.CALLED_READS or name == "new_tensor":
                        counter.calls[name] += 1
                    elif name in ("to", "cuda", "copy_") and counter._blocking_copy(
                            name, first, args[1:], kwargs):
                        counter.calls[f"{name} (blocking)"] += 1
                elif name in counter.CREATED and kwargs.get("device") is not None:
                    counter.calls[name] += 1
                return func(*args, **kwargs)

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                first = args[0] if args else None
                if counter._counts(first):
                    boolean_index = name == "index" and len(args) > 1 and any(
                        isinstance(i, torch.Tensor) and i.dtype == torch.bool
                        for i in args[1] if i is not None)
                    if name in counter.READS or name in counter.DATA_SHAPED or boolean_index:
                        counter.calls[name if not boolean_index else "index (boolean mask)"] += 1
                out = func(*args, **(kwargs or {}))
                for tensor in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(tensor, torch.Tensor):
                        counter.made[id(tensor)] = weakref.ref(tensor)
                return out

        self.modes = (Calls(), Dispatch())

    def _counts(self, tensor) -> bool:
        return (isinstance(tensor, torch.Tensor) and id(tensor) not in self.host
                and (tensor.is_cuda or not torch.cuda.is_initialized()))

    def _blocking_copy(self, name: str, source: torch.Tensor, args: tuple, kwargs: dict) -> bool:
        """Whether source.to / .cuda / .copy_(*args, **kwargs) would make the host wait: it
        moves data between devices, or a host tensor to the device, without non_blocking."""
        if kwargs.get("non_blocking", False) or any(a is True for a in args):
            return False
        if name == "copy_":
            other = args[0] if args else kwargs.get("src")
            return isinstance(other, torch.Tensor) and other.device != source.device
        if name == "cuda":
            target = torch.device("cuda")
        else:
            target = kwargs.get("device")
            for a in args:
                if isinstance(a, torch.Tensor):
                    target = a.device
                elif isinstance(a, (torch.device, str)) or (isinstance(a, int)
                                                           and not isinstance(a, bool)):
                    target = a
            if target is None:
                return False  # a change of dtype only
            target = torch.device(target) if not isinstance(target, int) \
                else torch.device("cuda", target)
        if target.type != source.device.type:
            return True
        made = self.made.get(id(source))
        return id(source) not in self.resident and (made is None or made() is not source)

    def __enter__(self):
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self.modes):
            mode.__exit__(*exc)
        return False


AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def speed_device(config: RunConfig) -> torch.device:
    accelerator = config.trainer.accelerator
    return torch.device("cuda" if accelerator in ("gpu", "cuda", "auto")
                        and torch.cuda.is_available() else "cpu")


def settings(config: RunConfig, device: torch.device, kernels: str, precisions: str,
             compiles: str) -> list[dict]:
    """The (kernel, precision, compile) settings to time: `all` means every one that applies
    here (the mamba_ssm kernel on CUDA when it imports, 16-mixed on CUDA only); one value means
    that one. A model without an SSD scan has kernel None."""
    has_kernel = hasattr(config.model, "kernel")
    if not has_kernel:
        kernel_list = [None]
    elif kernels == "all":
        kernel_list = ["torch"] + (["mamba_ssm"] if device.type == "cuda"
                                   and mamba_ssm_available() else [])
    else:
        kernel_list = [kernels]
    precision_list = (["32-true", "bf16-mixed"] + (["16-mixed"] if device.type == "cuda" else [])
                      if precisions == "all" else [precisions])
    compile_list = [False, True] if compiles == "all" else [compiles == "on"]
    return [{"kernel": k, "precision": p, "compile": c}
            for k, p, c in itertools.product(kernel_list, precision_list, compile_list)]


def configured(config: RunConfig, setting: dict) -> RunConfig:
    model = config.model
    if setting["kernel"] is not None:
        model = dataclasses.replace(model, kernel=setting["kernel"])
    trainer = dataclasses.replace(config.trainer, precision=setting["precision"],
                                  compile=setting["compile"],  # in the run's mode, if compiled
                                  compile_mode=(config.trainer.compile_mode if setting["compile"]
                                                else "default"))
    return dataclasses.replace(config, model=model, trainer=trainer)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, repeats: int, device: torch.device, warmup: int = 3) -> tuple[float, float]:
    """(seconds of the first call, seconds per call after `warmup` calls)."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return first, (time.perf_counter() - start) / repeats


def _autocast(precision: str, device: torch.device):
    dtype = AUTOCAST.get(precision)
    return (torch.autocast(device.type, dtype=dtype) if dtype is not None
            else contextlib.nullcontext())


def time_training(config: RunConfig, device: torch.device, steps: int) -> dict:
    """ms/step of forward + backward + AdamW on one batch of the configured global size."""
    task, model = build(config)
    model.to(device)
    batch = task.training_batch(0).to(device)
    inputs = batch.inputs
    if config.trainer.precision in ("64-true", "64"):
        model.double()
        inputs = inputs.double() if task.kind == "vectors" else inputs
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.trainer.lr, betas=(0.9, 0.95),
                                  **adamw_implementation(config.trainer))

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with _autocast(config.trainer.precision, device):
            loss = masked_loss(task, model(inputs), batch)
        loss.backward()
        optimizer.step()

    first, step_s = _timed(train_step, steps, device)
    return {"first_step_s": first, "step_s": step_s,
            "tokens_per_s": config.trainer.batch_size * task.seq_len / step_s}


def time_outside_training(config: RunConfig, device: torch.device) -> dict:
    """Seconds of the evaluation of one run as bench/training/train.py does it: the held-out set,
    the references (computed, and loaded from the cache), the model's predictions in evaluation
    batches, and the scoring."""
    task, model = build(config)
    model.to(device)
    n, size = config.trainer.eval_sequences, config.trainer.eval_batch_size
    times = {}
    start = time.perf_counter()
    batch = task.held_out(n)
    times["held_out"] = time.perf_counter() - start
    start = time.perf_counter()
    references = reference_scores(task, batch)
    times["references"] = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as scratch:
        reference_cache.save(scratch, task, n, batch, references)
        start = time.perf_counter()
        cached = reference_cache.load(scratch, task, n)
        times["cache_load"] = time.perf_counter() - start
    assert cached is not None
    n = len(batch)  # text: the evaluation split decides
    _sync(device)
    start = time.perf_counter()
    prediction = scores = None
    with torch.no_grad(), _autocast(config.trainer.precision, device):
        if task.scoring == "gap":
            prediction = torch.cat([model.predict(batch.inputs[i:i + size].to(device)).float()
                                    .cpu() for i in range(0, n, size)]).double()
        else:
            parts = [token_scores(model, batch.select(slice(i, i + size)).to(device),
                                  task.output_dim) for i in range(0, n, size)]
            scores = {"loss": torch.cat([p[0].cpu() for p in parts]).double(),
                      "correct": torch.cat([p[1].cpu() for p in parts])}
    _sync(device)
    times["model"] = time.perf_counter() - start
    start = time.perf_counter()
    score_predictions(task, batch, prediction, config.trainer.bootstrap, references, scores)
    times["scoring"] = time.perf_counter() - start
    return times, n


@contextlib.contextmanager
def without_profiler_chatter():
    """The process's own stderr (file descriptor 2, where C++ writes) kept aside inside, and
    written back without the lines of torch's profiler library ("USDT:... profiler_start"), which
    it prints at every profile however the Python side is set: noise in `speed`'s output."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no file descriptor 2 (an embedding host): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            kept.seek(0)
            lines = kept.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not line.startswith("USDT:")))
            sys.stderr.flush()


def profile_ops(fn) -> Counter:
    """How many times each aten op ran in fn() (torch's profiler, forward and backward ops, nested
    calls included)."""
    with without_profiler_chatter(), \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return Counter({event.key: event.count for event in prof.key_averages()
                    if event.key.startswith("aten::")})


def sampler_cost(task, repeats: int = 10) -> dict:
    """A training batch as the run samples it (Task.training_batch, on the CPU): seconds (the
    median of `repeats` after a warm-up that also draws a pool of tasks, if any) and aten calls."""
    counter = itertools.count()
    task.training_batch(next(counter))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        task.training_batch(next(counter))
        times.append(time.perf_counter() - start)
    calls = sum(profile_ops(lambda: task.training_batch(next(counter))).values())
    return {"batch_s": sorted(times)[len(times) // 2], "aten_calls": calls}


def _short_fit(config: RunConfig, callback, **trainer_changes):
    """A short fit of config as a run makes it (progress bar on, the run's logger), its log in a
    scratch folder and its bar swallowed, with `callback` added and `trainer_changes` applied;
    no checkpoints, no validation. Returns the Trainer."""
    quiet_lightning()
    apply_tf32_policy(config.trainer.tf32)
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stderr(io.StringIO()):
        config = dataclasses.replace(config, out_dir=scratch, trainer=dataclasses.replace(
            config.trainer, progress=True, checkpoint_every=0, val_every=0, **trainer_changes))
        task, model = build(config)
        module = ICLModule(model, task, config.trainer)
        trainer = make_trainer(config, "short-fit")
        trainer.callbacks.append(callback)
        trainer.fit(module, datamodule=TaskData(task))
    return trainer


def step_profile(config: RunConfig, steps: int = 4) -> dict:
    """The aten calls and host synchronisations of one whole training step away from logging
    steps, as Lightning runs it: from the end of one step to the end of the next, so the batch
    fetch, its copy to the device, forward, loss, backward, clipping, AdamW, the callbacks, the
    progress bar and the logger's end of the batch are all in it (a short fit with log_every
    beyond its steps, its log in a scratch folder). On CUDA also the synchronisations
    torch.cuda.set_sync_debug_mode("warn") reports in that step."""
    probe_step = steps - 2  # the step profiled: neither the first (a logging step) nor the last
    found: dict = {}

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            # global_step counts the steps made: probe_step when the one before it has ended
            if trainer.global_step == probe_step:
                self.profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU])
                self.profiler.__enter__()
                counters = {id(state["step"]) for optimizer in trainer.optimizers
                            for state in optimizer.state.values() if "step" in state}
                resident = {id(t) for t in [*module.parameters(), *module.buffers()]}
                resident |= {id(p.grad) for p in module.parameters() if p.grad is not None}
                resident |= {id(v) for optimizer in trainer.optimizers
                             for state in optimizer.state.values() for v in state.values()
                             if isinstance(v, torch.Tensor)}
                self.syncs = HostSyncCounter(counters, resident - counters)
                self.syncs.__enter__()
                self.caught = warnings.catch_warnings(record=True)
                found["warnings"] = self.caught.__enter__()
                warnings.simplefilter("always")
                if module.device.type == "cuda":
                    torch.cuda.set_sync_debug_mode("warn")
            elif trainer.global_step == probe_step + 1:
                if module.device.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
                self.caught.__exit__(None, None, None)
                self.syncs.__exit__(None, None, None)
                found["syncs"] = dict(self.syncs.calls)
                self.profiler.__exit__(None, None, None)
                found["ops"] = Counter({e.key: e.count for e in self.profiler.key_averages()
                                        if e.key.startswith("aten::")})

    # the batches sampled in a loader worker, as on a GPU: the sampler's own ops are CPU work
    # there, never the device's
    with without_profiler_chatter():
        trainer = _short_fit(config, Probe(), max_steps=steps, log_every=steps + 1,
                             loader_workers=max(1, config.trainer.loader_workers))
    ops = found["ops"]
    cuda_syncs = [str(w.message).splitlines()[0] for w in found["warnings"]
                  if "synchroniz" in str(w.message)]
    return {"aten_calls": sum(ops.values()), "host_syncs": sum(found["syncs"].values()),
            "progress_bar": any(isinstance(c, L.pytorch.callbacks.ProgressBar)
                                for c in trainer.callbacks),
            "sync_ops": found["syncs"], "cuda_sync_warnings": len(cuda_syncs),
            "cuda_sync_examples": sorted(set(cuda_syncs))[:5]}


def lightning_step_time(config: RunConfig, steps: int = 30) -> dict:
    """Seconds of a training step as Lightning runs it (fetch, copy, step, callbacks, progress
    bar, logger): the median time between consecutive step ends after 5 warm-up steps, logging
    steps left out, with the device synchronised at each step end (a measurement's sync, not
    the run's); and the share of it between one step's end and the next step's start, i.e.
    waiting for the next batch and its copy (what loader workers are for)."""
    marks: dict[str, list] = {"start": [], "end": []}

    class Clock(L.Callback):
        def _mark(self, trainer, module, kind):
            if module.device.type == "cuda":
                torch.cuda.synchronize(module.device)
            marks[kind].append((trainer.global_step, time.perf_counter()))

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self._mark(trainer, module, "start")

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self._mark(trainer, module, "end")

    _short_fit(config, Clock(), max_steps=steps)
    log_every = config.trainer.log_every
    starts = dict(marks["start"])  # global_step at a step's start -> time
    ends = dict((step - 1, t) for step, t in marks["end"])  # the step that ended -> time
    whole, waiting = [], []
    for step in range(6, steps - 1):
        if step % log_every and (step - 1) % log_every and step - 1 in ends and step in ends:
            whole.append(ends[step] - ends[step - 1])
            waiting.append(starts[step] - ends[step - 1])
    if not whole:
        return {"lightning_step_s": None, "batch_wait_share": None, "steps_timed": 0}
    step_s = statistics.median(whole)
    return {"lightning_step_s": step_s, "batch_wait_share": statistics.median(waiting) / step_s,
            "steps_timed": len(whole)}


def measure(config: RunConfig, steps: int = 20, kernels: str = "all", precisions: str = "all",
            compiles: str = "off", progress=print) -> dict:
    apply_tf32_policy(config.trainer.tf32)
    device = speed_device(config)
    task, model = build(dataclasses.replace(config, trainer=dataclasses.replace(
        config.trainer, compile=False, compile_mode="default")))
    result = {"task": config.task_name, "model": config.model_name, "device": str(device),
              "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                              else "cpu"),
              "threads": torch.get_num_threads(), "thread_wait": thread_wait(),
              "tf32": config.trainer.tf32, "batch_size": config.trainer.batch_size,
              "seq_len": task.seq_len, "params": model.num_parameters(),
              "torch": torch.__version__, "steps": steps, "training": []}
    for setting in settings(config, device, kernels, precisions, compiles):
        progress(f"timing {setting_label(setting)} ...")
        result["training"].append({**setting, **time_training(configured(config, setting),
                                                             device, steps)})
    tokens = config.trainer.batch_size * task.seq_len
    sampler = sampler_cost(task, max(3, steps // 4))
    sample_s = sampler["batch_s"]
    result["sampler"] = sampler
    result["sampler_tokens_per_s"] = tokens / sample_s
    progress("profiling one training step ...")
    result["step_profile"] = step_profile(config)
    progress("timing training steps as Lightning runs them ...")
    result["lightning_step"] = lightning_step_time(config, max(12, steps))
    batch = task.sample(config.trainer.batch_size, make_generator(TRAIN_STREAM, config.seed, 0, 0))
    result["reference_tokens_per_s"] = {
        name: tokens / _timed(lambda r=ref: (r.predict or r.loss)(batch), max(3, steps // 4),
                              torch.device("cpu"))[1]
        for name, ref in task.references().items()}
    # The share of a run outside training, for the run as configured (its precision, compile
    # and the model's own kernel setting)
    progress("timing the evaluation of a run ...")
    kernel = getattr(config.model, "kernel", None)
    run_setting = {"kernel": resolve_kernel(kernel, device) if kernel else None,
                   "precision": config.trainer.precision, "compile": config.trainer.compile}
    trained = next((t for t in result["training"]
                    if all(t[k] == v for k, v in run_setting.items())), None) \
        or {**run_setting, **time_training(config, device, steps)}
    outside, sequences = time_outside_training(config, device)
    # in-process sampling (no loader workers: the CPU) sits between steps; workers overlap it
    workers = loader_workers(config)
    result["loader_workers"] = workers
    in_path = sample_s if workers == 0 else max(0.0, sample_s / workers - trained["step_s"])
    training_s = config.trainer.max_steps * (trained["step_s"] + in_path) + trained["first_step_s"]
    fresh = outside["held_out"] + outside["references"] + outside["model"] + outside["scoring"]
    cached = outside["cache_load"] + outside["model"] + outside["scoring"]
    result["run"] = {**run_setting, "max_steps": config.trainer.max_steps,
                     "eval_sequences": sequences, "training_s": training_s,
                     "evaluation_s": outside,
                     "outside_training_s": {"computed": fresh, "cached": cached},
                     "share_outside_training": {"computed": fresh / (training_s + fresh),
                                                "cached": cached / (training_s + cached)}}
    return result


def setting_label(setting: dict) -> str:
    kernel = f"kernel={setting['kernel']} " if setting["kernel"] else ""
    return f"{kernel}precision={setting['precision']} compile={'on' if setting['compile'] else 'off'}"


def print_speed(r: dict) -> None:
    wait = "".join(f" {key}={value}" for key, value in r.get("thread_wait", {}).items())
    print(f"{r['model']} on {r['task']} ({r['device_name']}, {r['threads']} threads{wait}, torch "
          f"{r['torch']}): batch {r['batch_size']} x {r['seq_len']} positions, {r['params']:,} "
          f"parameters; {r['steps']} timed steps (forward + backward + AdamW)")
    print(f"  {'kernel':<10} {'precision':<11} {'compile':<8} {'ms/step':>9} {'tokens/s':>12} "
          f"{'first step':>11}")
    for t in r["training"]:
        print(f"  {t['kernel'] or '-':<10} {t['precision']:<11} {'on' if t['compile'] else 'off':<8} "
              f"{t['step_s'] * 1e3:>9.1f} {t['tokens_per_s']:>12,.0f} {t['first_step_s']:>10.1f}s")
    sampler, step = r["sampler"], r["step_profile"]
    print(f"  sampler    {r['sampler_tokens_per_s']:>12,.0f} tokens/s: "
          f"{sampler['batch_s'] * 1e3:.1f} ms and {sampler['aten_calls']:,} aten calls a batch "
          f"(on the CPU, {r['loader_workers']} loader workers)")
    syncs = ", ".join(f"{op} {n}" for op, n in step["sync_ops"].items())
    cuda = (f"; CUDA sync warnings {step['cuda_sync_warnings']}"
            if r["device"].startswith("cuda") else "")
    print(f"  a training step (Lightning, not a logging step): {step['aten_calls']:,} aten calls, "
          f"{step['host_syncs']} host synchronisations{f' ({syncs})' if syncs else ''}{cuda}")
    lightning = r.get("lightning_step") or {}
    if lightning.get("lightning_step_s"):
        print(f"  a training step as Lightning runs it ({setting_label(r['run'])}): "
              f"{lightning['lightning_step_s'] * 1e3:.1f} ms, {lightning['batch_wait_share']:.1%} "
              f"of it waiting for the next batch")
    for name, rate in r["reference_tokens_per_s"].items():
        print(f"  {name:<10} {rate:>12,.0f} tokens/s   (reference, CPU float64)")
    run = r["run"]
    e, share = run["evaluation_s"], run["share_outside_training"]
    print(f"  a run of {run['max_steps']} steps ({setting_label(run)}): training (sampling "
          f"included) "
          f"{run['training_s']:.1f} s; evaluation on {run['eval_sequences']} sequences: held-out "
          f"set {e['held_out']:.2f} s, references {e['references']:.2f} s (cached: "
          f"{e['cache_load']:.2f} s), model {e['model']:.2f} s, scoring {e['scoring']:.2f} s")
    print(f"  share of the run outside training: {share['computed']:.1%} computing the "
          f"references, {share['cached']:.1%} with them cached")
