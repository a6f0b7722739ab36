"""python -m bench speed: one row per applicable (kernel, precision, compile) setting, and the
share of a run outside training, consistent with its parts."""
import json

import pytest

from bench.cli.main import main
from bench.config import ConfigError

SMALL = ["steps=2", "task.seq_len=16", "trainer.batch_size=4", "trainer.max_steps=10",
         "trainer.eval_sequences=8", "trainer.eval_batch_size=4", "trainer.bootstrap=50"]


def test_speed_times_every_applicable_setting_and_the_run_outside_training(tmp_path, capsys):
    out = tmp_path / "speed.json"
    assert main(["speed", *SMALL, "compile=off", f"out={out}"]) == 0
    result = json.loads(out.read_text())
    # on the CPU: the torch scan (mamba_ssm needs CUDA), fp32 and bf16 (16-mixed needs CUDA)
    assert [(t["kernel"], t["precision"], t["compile"]) for t in result["training"]] == [
        ("torch", "32-true", False), ("torch", "bf16-mixed", False)]
    for t in result["training"]:
        assert t["step_s"] > 0 and t["tokens_per_s"] == pytest.approx(4 * 16 / t["step_s"])
    run = result["run"]
    e = run["evaluation_s"]
    assert run["outside_training_s"]["computed"] == pytest.approx(
        e["held_out"] + e["references"] + e["model"] + e["scoring"])
    assert run["outside_training_s"]["cached"] == pytest.approx(
        e["cache_load"] + e["model"] + e["scoring"])
    for how in ("computed", "cached"):
        outside = run["outside_training_s"][how]
        assert run["share_outside_training"][how] == pytest.approx(
            outside / (outside + run["training_s"]))
    printed = capsys.readouterr().out
    assert "share of the run outside training" in printed and "bf16-mixed" in printed
    # the step as Lightning runs it: the bare loop's step and more (fetch, copy, callbacks)
    lightning = result["lightning_step"]
    assert lightning["steps_timed"] > 0 and 0 <= lightning["batch_wait_share"] < 1
    assert lightning["lightning_step_s"] > 0 and "waiting for the next batch" in printed


def test_a_model_without_a_scan_has_no_kernel_column(tmp_path):
    out = tmp_path / "speed.json"
    assert main(["speed", *SMALL, "model=lstm", "compile=off", "precisions=32-true",
                 f"out={out}"]) == 0
    assert [t["kernel"] for t in json.loads(out.read_text())["training"]] == [None]


@pytest.mark.parametrize("args, message", [
    (["kernels=mamba_ssm"], "runs only on a CUDA GPU"),
    (["precisions=16-mixed"], "16-mixed needs a CUDA GPU"),
    (["kernels=fast"], "kernels: invalid value 'fast'"),
    (["compile=maybe"], "compile: invalid value 'maybe'"),
    (["model=lstm", "kernels=torch"], "has no SSD kernel"),
    (["out=/nonexistent/dir/s.json"], "not writable"),
])
def test_bad_speed_options_are_one_line_config_errors(args, message, capsys):
    assert main(["speed", *SMALL, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_step_profile_splits_the_bare_step_by_phase_and_kind():
    """bench.perf.profile_step: every phase of the bare step is timed and profiled, the chunked
    scan's forward is a phase of its own, products count as matmul, and the scan's function is
    the real one again afterwards."""
    import models.ssd
    from bench.perf import profile_step
    real = models.ssd.ssd_chunked
    assert profile_step.kind_of("aten::bmm") == "matmul"
    assert profile_step.kind_of("aten::cumsum") == "reduction/scan"
    assert profile_step.kind_of("aten::copy_") == "copy/layout"
    assert profile_step.kind_of("aten::mul") == "elementwise"
    result = profile_step.profile(["task.seq_len=32", "trainer.batch_size=4",
                                   "trainer.max_steps=20", "trainer.progress=false"], steps=5)
    assert models.ssd.ssd_chunked is real
    assert set(result["phase_ms"]) == set(profile_step.PHASES)
    ops = result["ops"]["ms"]
    assert {"forward", "ssd_chunked", "backward", "optimizer"} <= set(ops)
    assert ops["forward"]["matmul"] > 0 and result["bare_ms"] > 0
    assert result["tokens_per_step"] == 4 * 32


def test_the_lm_loss_measurement_compares_both_losses_in_both_precisions(capsys):
    """bench.perf.lm_loss on the CPU preset and a small vocabulary (the 14.5M preset took 70 s
    here, its bf16 steps 10 s each): a row per precision and loss, and in bf16 the chunked loss
    allocates less than torch's (no float32 copy of the logits); a bad option is a ConfigError
    (one line, exit code 2, when run as a script)."""
    from bench.perf import lm_loss
    result = lm_loss.measure("mamba_lm_cpu", batch=2, seq_len=128, vocab=8192, reps=1)
    assert set(result["steps"]) == {f"{p} {loss}" for p in lm_loss.PRECISIONS
                                    for loss in lm_loss.LOSSES}
    steps = result["steps"]
    assert all(entry["ms_per_step"] > 0 for entry in steps.values())
    assert steps["bf16-mixed chunked"]["peak_allocated_mib"] \
        < steps["bf16-mixed torch"]["peak_allocated_mib"]
    with pytest.raises(ConfigError, match="lm_loss takes"):
        lm_loss.main(["steps=3"])


def test_the_perf_tools_refuse_an_out_file_they_cannot_write_before_measuring(tmp_path,
                                                                            monkeypatch, capsys):
    """profile_step and lm_loss write their JSON at the end: a folder that does not exist is one
    line and exit code 2 at the start (it was a traceback after minutes of measuring)."""
    from bench.perf import lm_loss, profile_step

    def measured(*args, **kwargs):
        raise AssertionError("measured before its out= was checked")

    monkeypatch.setattr(profile_step, "profile", measured)
    monkeypatch.setattr(lm_loss, "measure", measured)
    missing = str(tmp_path / "no-such-folder" / "out.json")
    assert profile_step.main([f"out={missing}"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1
    with pytest.raises(ConfigError, match="does not exist"):
        lm_loss.main([f"out={missing}"])


def test_the_profilers_own_lines_are_kept_out_of_stderr(capfd):
    """torch's profiler library prints "USDT:... profiler_start" on file descriptor 2 at every
    profile (speed printed four); other lines written there come through."""
    import os
    import sys

    import torch

    from bench.perf.speed import profile_ops, without_profiler_chatter
    with without_profiler_chatter():
        os.write(2, b"USDT:2026-11-28 04:39:08 1:1 SyncActivityProfilerHandler.cpp:52] start\n")
        os.write(2, b"a real message\n")
        print("from python", file=sys.stderr)
    # (under pytest, Python's sys.stderr is pytest's, not file descriptor 2: order aside)
    assert sorted(capfd.readouterr().err.splitlines()) == ["a real message", "from python"]
    assert profile_ops(lambda: torch.ones(2) + 1)["aten::add"] == 1
    assert "USDT" not in capfd.readouterr().err
