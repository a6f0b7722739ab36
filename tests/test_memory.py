"""The pre-run memory estimate (bench/training/memory.py; bench/training/checks.py compares it with what is free):
passes measured in the precision and with the SSD kernel that will run (a small CPU run's on
real tensors, any other on models without storage, the two agreeing), the training loss of a
large vocabulary, the GPU and the host each compared with their own free memory, text evaluation
sized by the windows it scores, and the GPU a DDP rank asks about."""
import pytest
import torch

from bench.training import checks
from bench.training import memory
from bench.config import CheckFailed
from bench.training.memory import GIB, Allocations, memory_estimate, model_footprint
from bench.training.checks import compose_checked
from bench.config import ConfigError, compose
from bench.training.evaluate import masked_loss
from models import build_model
from models import ssd
from models.backbone import IOSpec
from tasks import task_families
from tasks.base import Batch


def task_of(config):
    return task_families()[config.task_family](config.task, batch_size=config.trainer.batch_size,
                                               seed=config.seed)


def test_a_measured_step_is_the_real_steps_allocation_peak():
    """The fake training step allocates what a real one does (the boolean mask's selection,
    which fake tensors cannot size, is the same copy through an index of every row)."""
    config = compose(["model=transformer", "model.d_model=16", "task.vocab_size=3000",
                      "task.seq_len=16", "trainer.batch_size=4"])
    task = task_of(config)
    measured = model_footprint(config, task, None, eval_rows=4, device="cuda")
    model = build_model(config.model_family, config.model,
                        IOSpec(task.kind, task.input_dim, task.output_dim, task.seq_len))
    tokens = torch.randint(3000, (4, 17))
    batch = Batch(tokens[:, :-1], tokens[:, 1:], torch.ones(4, 16, dtype=torch.bool))
    with Allocations() as real:
        masked_loss(task, model(batch.inputs), batch).backward()
    # the selection's index (arange, or the mask's nonzero: 2 int64 a position) may differ
    assert abs(measured.backward - real.peak) <= 16 * 4 * 16


def test_the_loss_of_a_large_vocabulary_is_counted():
    """model=transformer_lm14m's 64 x 256 positions over 50,257 tokens: the logits, their
    selected and float32 copies, log-softmax and its gradient, 12 bytes a logit at the peak
    (~10 GB; the loss was left out before and the whole step estimated at 0.8 GiB)."""
    def activations(vocab):
        config = compose(["model=transformer", "model.d_model=16", f"task.vocab_size={vocab}",
                          "task.seq_len=64", "trainer.batch_size=8"])
        return model_footprint(config, task_of(config), None, eval_rows=8, device="cuda").backward

    logits = 8 * 64 * 50257
    assert 11.9 * logits <= activations(50257) - activations(2) <= 13 * logits


def measured_on(monkeypatch):
    """Which tensors each measurement of the passes ran on ("real" or "fake"), as it happens."""
    seen, measure = [], memory._measure_passes

    def spy(*args, real):
        found = measure(*args, real=real)
        seen.append(("real" if real else "fake", found))
        return found

    monkeypatch.setattr(memory, "_measure_passes", spy)
    monkeypatch.setattr(memory, "_measured", {})
    return seen


@pytest.mark.parametrize("argv", [[], ["model=transformer"], ["task=linreg", "model=gd_ssm"],
                                  ["task=lgssm", "model=selective_ssm"],
                                  ["model=mamba", "trainer.precision=64-true"]])
def test_a_small_cpu_run_is_measured_on_real_tensors_as_on_fake_ones(monkeypatch, argv):
    """A CPU run's small model runs its passes for real, in milliseconds and without Dynamo's
    import; they allocate what the same passes on fake tensors (a GPU run's measurement) do, and
    the global generator is left as it was (the run draws its weights from it)."""
    config = compose(argv)
    task = task_of(config)
    seen = measured_on(monkeypatch)
    state = torch.get_rng_state()
    on_cpu = model_footprint(config, task, "torch", eval_rows=64, device="cpu")
    assert torch.equal(torch.get_rng_state(), state)
    on_gpu = model_footprint(config, task, "torch", eval_rows=64, device="cuda")
    assert [kind for kind, _ in seen] == ["real", "fake"]
    assert on_cpu == on_gpu and on_cpu.backward > on_cpu.forward > 0


def test_past_its_limits_the_real_measurement_gives_way_to_fake_tensors(monkeypatch):
    """Weights or a pass's live tensors over REAL_BYTES stop the real measurement at the op that
    went past it; parameters times positions over REAL_WORK skip it: fake tensors measure."""
    config = compose(["model=mamba", "model.d_model=32"])
    task = task_of(config)
    expected = model_footprint(config, task, "torch", eval_rows=8, device="cuda")
    with pytest.raises(memory.OverLimit), Allocations(limit=1000):
        torch.ones(1000)
    # over REAL_BYTES the real measurement raises (the spy records nothing); over REAL_WORK it
    # answers None before any pass
    for limit, work, kinds in ((1 << 20, memory.REAL_WORK, ["fake"]),
                               (memory.REAL_BYTES, 1000, ["real", "fake"])):
        seen = measured_on(monkeypatch)
        monkeypatch.setattr(memory, "REAL_BYTES", limit)
        monkeypatch.setattr(memory, "REAL_WORK", work)
        assert model_footprint(config, task, "torch", eval_rows=8, device="cpu") == expected
        assert [kind for kind, _ in seen] == kinds
        assert seen[-1] == ("fake", (expected, False))


def mamba_estimate(kernel, precision="bf16-mixed"):
    config = compose(["model=mamba", "model.d_model=64", "model.n_layers=2", "model.chunk_size=16",
                      "task.seq_len=64", f"trainer.precision={precision}"])
    estimate = memory_estimate(config, task_of(config), "cuda", kernel=kernel)
    return {t.what: t.bytes for t in estimate.parts("device", "training")}


def test_the_kernel_path_saves_less_than_the_chunked_scan():
    """On CUDA model.kernel=auto runs mamba_ssm's kernel, which keeps no per-chunk (L x L) decay
    matrices: measured through its stand-in, the activations are smaller than ssd_chunked's,
    and bf16-mixed's smaller than float32's."""
    kernel, chunked = mamba_estimate("mamba_ssm"), mamba_estimate("torch")
    assert kernel["activations and loss"] < 0.8 * chunked["activations and loss"]
    assert kernel["weights, gradients and AdamW state"] == \
        chunked["weights, gradients and AdamW state"]
    assert kernel["activations and loss"] < 0.8 * mamba_estimate("mamba_ssm", "32-true")[
        "activations and loss"]


def test_the_kernel_stand_in_is_scoped_and_shaped_like_the_kernel():
    x, dt = torch.randn(2, 40, 4, 8, requires_grad=True), torch.rand(2, 40, 4)
    A, B, C = -torch.rand(4), torch.randn(2, 40, 1, 16), torch.randn(2, 40, 1, 16)
    with ssd.scan_override(ssd.kernel_footprint):
        y, final = ssd.ssd_scan(x, dt, A, B, C, kernel="torch")
        assert y.grad_fn.name().endswith("_KernelFootprintBackward")
        y.sum().backward()
    assert (y.shape, final.shape, x.grad.shape) == (x.shape, (2, 4, 8, 16), x.shape)
    with pytest.raises(RuntimeError), ssd.scan_override(ssd.kernel_footprint):
        raise RuntimeError
    reference, _ = ssd.ssd_chunked(x, dt, A, B, C)  # the override is gone after either exit
    assert torch.equal(ssd.ssd_scan(x, dt, A, B, C, kernel="torch")[0], reference)


def test_the_gpu_and_the_host_each_hold_their_part():
    """Training state, activations and the evaluation's forward pass are on the GPU; the
    held-out set, float64 predictions and bootstrap on the host. A CPU run has one side, the host,
    where both add up."""
    config = compose(["model=mamba", "model.d_model=32"])
    task = task_of(config)
    gpu, cpu = (memory_estimate(config, task, device) for device in ("cuda", "cpu"))
    assert gpu.sides == ("device", "host") and cpu.sides == ("host",)
    on = {side: {t.what for t in gpu.terms if t.side == side} for side in ("device", "host")}
    assert {"activations and loss", "an evaluation batch's forward pass"} <= on["device"]
    assert {"the bootstrap", "the references' float64 predictions"} <= on["host"]
    assert not on["device"] & on["host"]
    for phase in ("training", "evaluation"):
        assert cpu.need("host", phase) == sum(t.bytes for t in cpu.terms if t.phase == phase)
        assert gpu.need("device", phase) + gpu.need("host", phase) > cpu.need("host", phase)


@pytest.mark.parametrize("short, where", [("device", "on cuda:0"), ("host", "on the host")])
def test_each_side_is_compared_with_its_own_free_memory(monkeypatch, short, where):
    free = {"cuda": 40 * GIB, "host": 40 * GIB, {"device": "cuda"}.get(short, short): GIB // 4}
    monkeypatch.setattr(memory, "available_bytes", lambda side: free[side])
    config = compose(["model=mamba", "model.d_model=32"])
    with pytest.raises(CheckFailed, match=f"GiB for [a-z]+ {where} but it has 0.2 GiB free"):
        checks.check_memory(config, task_of(config), "cuda")
    free[{"device": "cuda"}.get(short, short)] = 40 * GIB
    checks.check_memory(config, task_of(config), "cuda")


def test_a_ddp_rank_asks_about_its_own_gpu_only(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: asked.append(device) or (1, 2))
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert memory.available_bytes("cuda") == 1 and asked == [3]
    monkeypatch.delenv("LOCAL_RANK")
    assert memory.available_bytes("cuda") == 1 and asked == [3, 0]


WORDS = "the cat sat on the mat while a dog ran after the ball in the old park".split()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    generator = torch.Generator().manual_seed(0)
    for split, words in (("train", 3000), ("validation", 2000), ("test", 100)):
        index = torch.randint(len(WORDS), (words,), generator=generator)
        (folder / f"{split}.txt").write_text(" ".join(WORDS[i] for i in index))
    return folder


def text_config(corpus_dir, *extra):
    defaults = {"task.seq_len": "32", "model.d_model": "16"}
    defaults.update(arg.split("=", 1) for arg in extra)
    return compose(["task=text", f"task.data_dir={corpus_dir}", "task.tokenizer=byte",
                    *(f"{key}={value}" for key, value in defaults.items())])


def test_the_window_count_is_the_windows_evaluation_builds():
    from tasks.corpora.windows import evaluation_starts, evaluation_window_count
    for n_tokens in (2, 17, 33, 34, 100, 257, 1000):
        for seq_len, stride, cap in ((16, None, None), (16, 5, None), (16, 1, 7), (32, 32, 3)):
            assert evaluation_window_count(n_tokens, seq_len, stride, cap) == \
                len(evaluation_starts(n_tokens, seq_len, stride, cap)[0])


def test_text_evaluation_is_sized_by_the_windows_it_scores(corpus_dir):
    """The held-out set of text is the split's windows (trainer.eval_sequences does not apply):
    counted before tokenizing from a bound on the split's tokens, exactly once it is cached, and
    capped by task.eval_windows."""
    task = task_of(text_config(corpus_dir))
    bound = task.held_out_size(512)
    task.progress = False
    windows = len(task.held_out(0))
    assert windows <= bound <= 1.1 * windows and task.held_out_size(512) == windows
    assert task.held_out_size(7) == windows
    assert task_of(text_config(corpus_dir, "task.eval_windows=10")).held_out_size(512) == 10
    every, ten = (memory_estimate(config, task_of(config), "cpu").need("host", "evaluation")
                  for config in (text_config(corpus_dir, "trainer.eval_sequences=2"),
                                 text_config(corpus_dir, "task.eval_windows=10",
                                             "trainer.eval_sequences=100000")))
    assert every > ten


def test_a_byte_level_text_run_is_not_refused(corpus_dir):
    """The text_cpu suite's model on bytes was refused at "19.0 GiB" (an evaluation batch of
    8192 windows) and peaks at 0.9 GiB: its estimate is now under 1 GiB on the host."""
    config = text_config(corpus_dir, "model.d_model=64", "model.n_layers=2", "task.seq_len=128")
    estimate = memory_estimate(config, task_of(config), "cpu")
    assert max(estimate.need("host", phase) for phase in ("training", "evaluation")) < GIB


def test_a_refused_text_evaluation_names_task_eval_windows(corpus_dir, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda side: 300 * 2**20)
    with pytest.raises(ConfigError, match=r"for evaluation on the host .* task\.eval_windows$"):
        compose_checked(["task=text", f"task.data_dir={corpus_dir}", "task.tokenizer=byte",
                         "task.seq_len=32", "task.eval_stride=1", "model.d_model=16",
                         "out_dir=/tmp"])


@pytest.mark.parametrize("task", ["markov", "linreg"])
def test_a_float64_run_is_checked_like_any_other(task):
    """64-true: the model without storage is built in float64 (module.double() cannot swap the
    parameters of fake tensors), and its weights count 8 bytes each."""
    from bench.training.checks import compose_checked
    from bench.training.memory import memory_estimate
    from tasks import task_families
    config = compose_checked([f"task={task}", "trainer.precision=64-true"])  # the whole check runs
    single = compose_checked([f"task={task}"])
    sampled = task_families()[config.task_family](config.task, batch_size=32)

    def weights(c) -> int:
        return next(t.bytes for t in memory_estimate(c, sampled, "cpu").terms
                    if t.what == "weights, gradients and AdamW state")

    assert weights(config) == 2 * weights(single)
