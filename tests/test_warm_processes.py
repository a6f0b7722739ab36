"""tests/warm_processes.py, the harness of the tests' warm processes: what a test reads of one is
what it would read of `subprocess.Popen`."""
import os
import signal
import time

from warm_processes import WarmProcess

WRITER = """import os, sys
print(os.getcwd(), os.environ["WARM_TEST"], sys.argv[1:])
for i in range(300):
    print("out", i, flush=True)
    print("err", i, file=sys.stderr, flush=True)
sys.exit(3)
"""


def test_exit_status_output_cwd_environment_and_arguments(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "WARM_TEST": "given"}
    apart = WarmProcess(["a", "b=1"], tmp_path, env, script)
    out, err = apart.communicate(timeout=120)
    assert apart.returncode == 3 and apart.poll() == 3
    first, *rest = out.splitlines()
    assert first == f"{tmp_path} given ['a', 'b=1']"
    assert rest == [f"out {i}" for i in range(300)]
    assert err.splitlines() == [f"err {i}" for i in range(300)]
    # merged, as stderr=STDOUT: one file, the lines in the order they were written
    merged = WarmProcess([], tmp_path, env, script, merge_stderr=True)
    out, err = merged.communicate(timeout=120)
    assert err is None
    assert out.splitlines()[1:] == [f"{kind} {i}" for i in range(300) for kind in ("out", "err")]


def test_a_signal_ends_it_as_it_ends_a_popen(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import pathlib, time\npathlib.Path('up').touch()\ntime.sleep(600)\n")
    process = WarmProcess([], tmp_path, dict(os.environ), script)
    deadline = time.monotonic() + 120
    while not (tmp_path / "up").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM
