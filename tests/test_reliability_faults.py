"""Faults a long job meets and inputs the issue's probe did not list (docs/errors.md): a full disk
(a file-size limit on the process), a checkpoint path that is a file, Ctrl-C."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _roles(ckpt: Path, shared_data: Path, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "analysis.roles", "--ckpt", str(ckpt), "--task", "mrpc", "--roles", "local,cls",
            "--glue-dir", str(shared_data / "glue"), "--n", "4", "--batch-size", "4", "--no-figures",
            "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]  # fmt: skip


def test_a_full_disk_is_one_line_and_leaves_nothing(tiny_hf, shared_data, tmp_path):
    # RLIMIT_FSIZE stands in for a full disk: the output's files (run.json is ~2.7 kB) pass it,
    # while Python ignores SIGXFSZ, so the write fails with EFBIG as it would with ENOSPC.
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))

    result = subprocess.run(_roles(tiny_hf, shared_data, tmp_path), preexec_fn=limit, capture_output=True,
                            text=True, timeout=300, check=False, cwd=ROOT)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: no space left writing the output (File too large); --out {tmp_path / 'out'} was not written"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_path_that_is_a_file_is_one_line(tiny_hf, shared_data, tmp_path, cli_error):
    from analysis import roles

    argv = _roles(tiny_hf / "config.json", shared_data, tmp_path)[3:]
    assert (
        cli_error(roles.main, argv)
        == f"error: {tiny_hf / 'config.json'}: no bertjax checkpoints found (expected checkpoints/<step>/)"
    )
    assert not (tmp_path / "out").exists()


def _interrupted_run(tiny_hf, shared_data, tmp_path) -> tuple[int, str]:
    """(exit status, stderr) of a roles run given one Ctrl-C once its temporary output exists."""
    # A shell's background job starts with SIGINT ignored, which Python keeps: restore Ctrl-C first.
    command = _roles(tiny_hf, shared_data, tmp_path)
    command[1:3] = ["-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                          "sys.argv[0] = 'roles'; runpy.run_module('analysis.roles', run_name='__main__')"]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list(tmp_path.glob(".out.tmp-*")):
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    return process.returncode, err


def test_ctrl_c_cleans_up_and_exits_130(tiny_hf, shared_data, tmp_path):
    status, err = _interrupted_run(tiny_hf, shared_data, tmp_path / "first")
    if status == 0:
        # Once, in a full test run on 2 loaded cores, the Ctrl-C was lost and the run completed.
        # CPython raises a signal's KeyboardInterrupt wherever the main thread is, and inside a
        # finaliser or a garbage-collection callback it is printed ("Exception ignored") and
        # dropped: the likeliest cause. A user presses it again; the test tries once more (a
        # Ctrl-C that is always ignored still fails it).
        status, err = _interrupted_run(tiny_hf, shared_data, tmp_path / "again")
    assert status == 130 and err.strip().splitlines()[-1] == "error: interrupted", err[-2000:]
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
