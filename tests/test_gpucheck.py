"""python -m bench gpucheck drives its sections within a budget; on a machine without a GPU the
environment section still reports, and the GPU sections are skipped or fail inside their own
process, never taking the driver down."""
import importlib.util
import json

from bench.__main__ import main


def test_the_environment_section_reports_and_a_section_without_time_is_skipped(tmp_path, capsys):
    assert main(["gpucheck", "sections=env,paper", "budget=60", f"out={tmp_path}"]) == 0
    result = json.loads((tmp_path / "gpucheck.json").read_text())
    env = result["sections"]["env"]
    assert env["torch"] and env["provenance"]["torch"] == env["torch"]
    assert "kernel_import_error" in env and env["section_s"] > 0
    assert "skipped" in result["sections"]["paper"]  # needs ~150 s, 60 were given
    if all(importlib.util.find_spec(m) for m in ("mamba_ssm", "triton", "einops")):
        # The CUDA-less install of mamba-ssm imports, plainly, with the harness's stand-ins.
        assert env["kernel_import_error"] is None, (env["kernel_import_error"], result["stand_ins"])


def test_bad_options_are_one_line_errors(tmp_path, capsys):
    assert main(["gpucheck", "sections=env,warp", f"out={tmp_path}"]) == 2
    assert "unknown section(s) warp" in capsys.readouterr().err
    assert main(["gpucheck", "colour=blue"]) == 2
    err = capsys.readouterr().err
    assert "unknown or empty option 'colour=blue'" in err and err.count("\n") == 1
