"""Where the time of a CPU training step goes:

    python -m bench.perf.profile_step [steps=30] [threads=0] [key=value ...]   (a run's overrides)

Three views of the configured run (the default benchmark without overrides), on this machine:

1. The step as a run takes it: Lightning's median ms per step, logging steps left out
   (speed.lightning_step_time), and the share spent waiting for the next batch.
2. The bare step, the same arithmetic without Lightning: sampling a batch, forward, loss,
   backward, gradient clipping and the run's AdamW (its parameter groups and schedule), each
   timed on its own (medians); what Lightning adds is (1) minus the bare step's median.
3. The ops of the bare step (torch.profiler, self CPU time, so nested calls count once), by
   phase and by kind: matrix products, convolution, elementwise arithmetic, reductions and
   scans, copies and layout, and the rest; the chunked SSD scan's forward is its own phase.

Printed as a table and, with out=<file.json>, written as JSON. The numbers are this machine's
at this moment: run it on idle cores, and say what else ran."""
from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict

import torch

import models.ssd
from bench.config import ConfigError
from bench.perf.speed import lightning_step_time, without_profiler_chatter
from bench.records.store import output_path, write_json
from bench.training.checks import compose_checked
from bench.training.evaluate import masked_loss
from bench.training.module import ICLModule
from bench.training.train import build

PHASES = ("sample", "forward", "loss", "backward", "clip", "optimizer")
SCAN = "ssd_chunked"  # the phase of the chunked scan's forward, inside `forward`
# Op kinds by aten name: what each costs differs (arithmetic-bound products; memory-bound rest)
MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::dot",
          "aten::mv", "aten::addmv")
CONVOLUTION = ("aten::_convolution", "aten::convolution", "aten::mkldnn_convolution",
               "aten::_slow_conv2d_forward", "aten::convolution_backward",
               "aten::_convolution_depthwise2d", "aten::thnn_conv2d")
REDUCTION = ("sum", "mean", "cumsum", "cumprod", "max", "min", "norm", "logsumexp", "softmax",
             "_log_softmax", "amax", "var", "std", "prod", "nll_loss", "_foreach_norm")
LAYOUT = ("copy_", "contiguous", "clone", "cat", "stack", "to", "_to_copy", "empty", "zeros",
          "ones", "fill_", "zero_", "new_zeros", "new_empty", "empty_strided", "index",
          "index_select", "gather", "scatter", "pad", "constant_pad_nd", "flip", "repeat",
          "expand", "view", "reshape", "permute", "transpose", "t", "select", "slice",
          "unsqueeze", "squeeze", "as_strided", "split", "chunk", "unbind", "narrow", "detach",
          "_unsafe_view", "alias", "resize_", "set_", "lift_fresh", "masked_fill", "where",
          "tril", "triu", "embedding", "embedding_dense_backward", "_reshape_alias",
          "diagonal", "movedim", "unfold")


def kind_of(op: str) -> str:
    if op in MATMUL:
        return "matmul"
    if op in CONVOLUTION:
        return "convolution"
    base = op.removeprefix("aten::").rstrip("_")
    if any(base == name or base.startswith(name + "_") or base.endswith("_" + name)
           for name in REDUCTION) or "backward_data" in base and "softmax" in base:
        return "reduction/scan"
    if base in LAYOUT or op.removeprefix("aten::") in LAYOUT:
        return "copy/layout"
    if op.startswith("aten::"):
        return "elementwise"
    return "other"


class BareStep:
    """The run's arithmetic of one training step without Lightning, each phase in a
    torch.profiler range: a batch sampled as the run samples it (on the CPU), forward, loss,
    backward, clipping at trainer.grad_clip, and the optimizer and schedule the run's module
    configures."""

    def __init__(self, config):
        self.config = config
        self.task, self.model = build(config)
        module = ICLModule(self.model, self.task, config.trainer)
        configured = module.configure_optimizers()
        self.optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
        scheduler = configured.get("lr_scheduler") if isinstance(configured, dict) else None
        self.scheduler = scheduler.get("scheduler") if isinstance(scheduler, dict) else scheduler
        self.step_index = 0
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def _phase(self, name, fn):
        start = time.perf_counter()
        with torch.profiler.record_function(name):
            out = fn()
        self.seconds[name].append(time.perf_counter() - start)
        return out

    def __call__(self):
        start = time.perf_counter()
        self._step()
        self.seconds["step"].append(time.perf_counter() - start)

    def _step(self):
        batch = self._phase("sample", lambda: self.task.training_batch(self.step_index))
        self.step_index += 1
        self.optimizer.zero_grad(set_to_none=True)
        out = self._phase("forward", lambda: self.model(batch.inputs))
        loss = self._phase("loss", lambda: masked_loss(self.task, out, batch))
        self._phase("backward", loss.backward)
        if self.config.trainer.grad_clip:
            self._phase("clip", lambda: torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), self.config.trainer.grad_clip))
        self._phase("optimizer", self._optimizer_step)

    def _optimizer_step(self):
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()


def _innermost_phase(event, ranges: list) -> str | None:
    """The innermost of our ranges that holds the event in time (its thread's)."""
    found, width = None, None
    start, end = event.time_range.start, event.time_range.end
    for name, r_start, r_end in ranges:
        if r_start <= start and end <= r_end and (width is None or r_end - r_start < width):
            found, width = name, r_end - r_start
    return found


def op_profile(step: BareStep, steps: int) -> dict:
    """Self CPU milliseconds per step by (phase, kind), over `steps` profiled bare steps."""
    real = models.ssd.ssd_chunked

    def ranged(*args, **kwargs):  # the scan's forward as a phase of its own
        with torch.profiler.record_function(SCAN):
            return real(*args, **kwargs)

    models.ssd.ssd_chunked = ranged
    try:
        with without_profiler_chatter(), \
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
    finally:
        models.ssd.ssd_chunked = real
    events = list(prof.events())
    ranges = [(e.name, e.time_range.start, e.time_range.end) for e in events
              if e.name in (*PHASES, SCAN)]
    table: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    calls: dict[str, int] = defaultdict(int)
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        phase = _innermost_phase(event, ranges)
        if phase is None:  # backward ops run on autograd's thread: by time, not by stack
            phase = "backward"
        table[phase][kind_of(event.name)] += event.self_cpu_time_total / 1000 / steps
        calls[phase] += 1
    return {"ms": {phase: dict(kinds) for phase, kinds in table.items()},
            "aten_calls_per_step": {phase: n / steps for phase, n in calls.items()}}


def profile(argv: list[str], steps: int = 30, threads: int = 0) -> dict:
    if threads:
        torch.set_num_threads(threads)
    config = compose_checked([*argv, "trainer.accelerator=cpu"])
    torch.manual_seed(config.seed)
    lightning = lightning_step_time(config, steps=steps)
    step = BareStep(config)
    for _ in range(5):  # warm-up: allocation, first-call work
        step()
    step.seconds.clear()
    for _ in range(steps):
        step()
    bare_s = statistics.median(step.seconds.pop("step"))
    phases = {name: statistics.median(values) * 1000 for name, values in step.seconds.items()}
    ops = op_profile(step, min(steps, 10))
    tokens = config.trainer.batch_size * step.task.seq_len
    return {"argv": argv, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "params": sum(p.numel() for p in step.model.parameters()),
            "tokens_per_step": tokens,
            "lightning_ms": (lightning["lightning_step_s"] or float("nan")) * 1000,
            "batch_wait_share": lightning["batch_wait_share"], "bare_ms": bare_s * 1000,
            "phase_ms": phases, "ops": ops}


def print_profile(result: dict) -> None:
    print(f"{' '.join(result['argv']) or '(the default run)'}: {result['params']} parameters, "
          f"{result['tokens_per_step']} tokens a step, {result['threads']} threads, "
          f"torch {result['torch']}")
    lightning, bare = result["lightning_ms"], result["bare_ms"]
    print(f"step as a run takes it (Lightning)  {lightning:8.2f} ms")
    print(f"bare step (same arithmetic)         {bare:8.2f} ms   Lightning adds "
          f"{lightning - bare:.2f} ms ({(lightning - bare) / lightning:.0%})")
    print("phases of the bare step (median ms):  " + ", ".join(
        f"{name} {ms:.2f}" for name, ms in result["phase_ms"].items()))
    kinds = sorted({k for phase in result["ops"]["ms"].values() for k in phase})
    print(f"{'ops, self ms/step':<18}" + "".join(f"{k:>15}" for k in kinds) + f"{'total':>9}"
          + f"{'aten calls':>12}")
    for phase in [*PHASES[:2], SCAN, *PHASES[2:]]:
        row = result["ops"]["ms"].get(phase)
        if not row:
            continue
        calls = result["ops"]["aten_calls_per_step"].get(phase, 0)
        print(f"{phase:<18}" + "".join(f"{row.get(k, 0.0):15.2f}" for k in kinds)
              + f"{sum(row.values()):9.2f}{calls:12.0f}")


def main(argv: list[str]) -> int:
    options = {"steps": "30", "threads": "0", "out": ""}
    rest = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in options:
            options[key] = value
        else:
            rest.append(arg)
    try:
        steps, threads = int(options["steps"]), int(options["threads"])
        if steps < 5 or threads < 0:
            raise ValueError
    except ValueError:
        print("error: steps must be an integer >= 5 and threads >= 0", file=sys.stderr)
        return 2
    try:
        if options["out"]:
            output_path(options["out"])  # refused now, not after the minutes of measuring
        result = profile(rest, steps, threads)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print_profile(result)
    if options["out"]:
        write_json(options["out"], result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
