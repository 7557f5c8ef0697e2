"""SIGTERM always ends a run, with status 143 and the same clean-up as Ctrl-C (130): both handlers set
a flag that the loops read (a handler that raised lost the signal where Python ran a
garbage-collection callback), and a run that cannot write its metrics stops with one line instead
of waiting."""

from __future__ import annotations

import gc
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_pretrain_checks import write_micro

from bertjax import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _ctrl_c_as_in_a_terminal():
    """pytest-xdist starts its workers with SIGINT ignored, which `cli.run` keeps ignored (a shell's
    background job); these tests send Ctrl-C as a terminal would, to a process that takes it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    ("signum", "status", "line"),
    [(signal.SIGTERM, 143, "error: terminated"), (signal.SIGINT, 130, "error: interrupted")],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_inside_a_garbage_collection_callback_still_ends_the_run(capsys, signum, status, line):
    """Probe 7.1: the signal came while JAX's `_xla_gc_callback` ran; `Terminated` (or Ctrl-C's
    `KeyboardInterrupt`), raised from the handler there, was printed as "Exception ignored" and
    dropped, and the run exited 0."""

    def in_the_collector(phase, info):
        if phase == "start":
            os.kill(os.getpid(), signum)
            sum(range(1000))  # Python code, where the handler runs

    def main(argv):
        gc.callbacks.append(in_the_collector)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(in_the_collector)

    with pytest.raises(SystemExit) as exit_info:
        cli.run(main, [])
    assert exit_info.value.code == status
    captured = capsys.readouterr().err
    assert captured.strip().splitlines()[-1] == line and "Exception ignored" not in captured
    assert not cli.terminated() and not cli.interrupted()  # the next run in this process starts afresh


def test_a_loop_stops_at_its_next_check_and_a_second_ctrl_c_at_once(capsys):
    """One design for both signals: the first only sets the flag, read at the loop's next check;
    a second Ctrl-C, for a wait that no loop checks, raises where the run is."""
    checks = []

    def main(argv):
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # the handler has run: no exception
        checks.append("after the first")
        try:
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))
        except KeyboardInterrupt:
            checks.append("the second raised")
        cli.stop_if_terminated()
        checks.append("not reached")

    with pytest.raises(SystemExit) as exit_info:
        cli.run(main, [])
    assert exit_info.value.code == 130 and checks == ["after the first", "the second raised"]
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: interrupted"


def _terminated_at_random(command: list[str], tries: int, seed: int) -> list[tuple[float, int, list[str]]]:
    """(delay, exit status, stderr's last line) of each of `tries` runs of `command` (its `{i}`
    filled with the try) sent SIGTERM after a random delay within the time an uninterrupted run
    takes (timed on a second run: the first fills the compilation cache). A run that ended before
    its delay was up is tried again with the shorter time it took: on a loaded machine (CI's other
    test worker) one run can take twice as long as the next."""
    for name in ("first", "timed"):
        clock = time.monotonic()
        subprocess.run([c.format(i=name) for c in command], cwd=ROOT, check=True, capture_output=True, timeout=600)
    full = time.monotonic() - clock
    rng = random.Random(seed)
    results, attempts = [], 0
    while len(results) < tries and attempts < 3 * tries:
        attempts += 1
        delay = rng.uniform(0.02, 0.95) * full
        clock = time.monotonic()
        process = subprocess.Popen([c.format(i=attempts) for c in command], cwd=ROOT, stderr=subprocess.PIPE,
                                   text=True)  # fmt: skip
        time.sleep(delay)
        running = process.poll() is None
        if running:
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=600)
        if running:
            results.append((round(delay, 2), process.returncode, err.strip().splitlines()[-1:]))
        else:
            full = min(full, time.monotonic() - clock)
    assert len(results) == tries, f"the runs ended before their signals: {results}"
    return results


def _accepted(status: int, last: list[str]) -> bool:
    # 143 with one line; or -15 when the signal came before the handler was in place (the
    # interpreter starting) or after it was taken away (the run over, the process ending).
    return (status == 143 and last == ["error: terminated"]) or status == -signal.SIGTERM


@pytest.mark.slow
def test_sigterm_at_random_moments_always_ends_roles_with_status_143(tiny_hf, shared_data, tmp_path):
    command = [sys.executable, "-m", "analysis.roles", "--ckpt", str(tiny_hf), "--task", "mrpc",
               "--glue-dir", str(shared_data / "glue"), "--n", "24", "--batch-size", "4", "--max-length", "64",
               "--no-figures", "--out", str(tmp_path / "out-{i}")]  # fmt: skip
    results = _terminated_at_random(command, tries=4, seed=1)
    assert all(_accepted(status, last) for _, status, last in results), results


@pytest.mark.slow
def test_sigterm_at_random_moments_always_ends_pretraining_with_status_143(tmp_path):
    config = write_micro(tmp_path)
    command = [sys.executable, "-m", "train.pretrain", "--config", str(config), "--workdir", str(tmp_path / "w-{i}"),
               "train.steps=20", "checkpoint.every=5"]  # fmt: skip
    results = _terminated_at_random(command, tries=2, seed=2)
    assert all(_accepted(status, last) for _, status, last in results), results


@pytest.mark.slow
def test_ctrl_c_stops_pretraining_after_its_step_with_status_130(tmp_path):
    """Ctrl-C, read by the trainer after each step as SIGTERM is: the run stops there with 130 and
    no checkpoint of its own (SIGTERM's preemption saves one)."""
    config = write_micro(tmp_path)
    workdir = tmp_path / "w"
    # A background process starts with Ctrl-C ignored, which Python keeps: restored first.
    command = [sys.executable, "-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv[0] = 'pretrain'; runpy.run_module('train.pretrain', run_name='__main__')",
               "--config", str(config), "--workdir", str(workdir), "train.steps=400", "checkpoint.every=2"]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (workdir / "checkpoints" / "2").is_dir():
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130 and err.strip().splitlines()[-1] == "error: interrupted", err[-2000:]
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and saved[-1] < 400 and all(step % 2 == 0 for step in saved)


def test_metrics_that_cannot_be_written_stop_the_run_with_one_line(tmp_path):
    """Probe 4.23: on a full disk tensorboardX's writer thread died (`OSError: File too large`) and
    the trainer then waited on its queue forever. Here every file is capped at 20 kB, as a full disk
    would; before the fix this process never ended (the timeout fails the test)."""
    script = (
        "import sys; from pathlib import Path; from bertjax import cli; from train.metrics import MetricsWriter\n"
        "def main(argv):\n"
        "    writer = MetricsWriter(Path(argv[0]), enabled=True)\n"
        "    try:\n"
        "        for step in range(100000):\n"
        "            writer.write(step, {'loss': 1.0 / (step + 1), 'grad_norm': 2.0, 'learning_rate': 1e-3})\n"
        "    finally:\n"
        "        writer.close()\n"
        "cli.run(main, sys.argv[1:])\n"
    )
    limit = 20000
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    written = [
        p for p in [tmp_path / "metrics.jsonl", *(tmp_path / "tensorboard").iterdir()] if p.stat().st_size == limit
    ]
    assert done.stderr.strip().splitlines() == [
        f"error: cannot write the training metrics to {written[0]} (File too large); stopping"
    ]


@pytest.mark.slow
def test_pretraining_that_cannot_write_its_metrics_stops_with_one_line(tmp_path):
    """Probe 4.23 end to end: `prlimit --fsize=20000 python -m train.pretrain … train.log_every=1`
    hung after tensorboardX's `OSError: [Errno 27] File too large` (the timeout fails it before the
    fix); the data is prepared beforehand, without the limit."""
    config = write_micro(tmp_path)
    prepared = tmp_path / "prepared"
    subprocess.run([sys.executable, "-m", "train.pretrain", "--config", str(config), "--workdir", str(prepared),
                    "--prepare-only"], cwd=ROOT, check=True, capture_output=True, timeout=600)  # fmt: skip
    workdir = tmp_path / "w"
    limit = 20000
    done = subprocess.run(
        [sys.executable, "-m", "train.pretrain", "--config", str(config), "--workdir", str(workdir),
         f"data_dir={prepared / 'data-T32'}", "train.steps=400", "checkpoint.every=300", "train.log_every=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"},  # an entry cut short would warn later
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    # The TensorBoard file (an event per scalar) reaches the limit before metrics.jsonl.
    last = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        f"error: cannot write the training metrics to {re.escape(str(workdir))}/"
        r"(metrics\.jsonl|tensorboard/events\.out\.tfevents\.[^ ]+) \(File too large\); stopping",
        last,
    ), done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_the_wait_for_the_figure_workers_reads_the_flag(capsys):
    """The pool's wait was `Queue.join()`, which a flag never ends: SIGTERM during the figures
    waited for all of them to be drawn. Here the one figure takes 60 s (`time.sleep`), and the
    signal, 1 s into the wait, ends the run at once with 143; the worker is killed."""
    import threading

    from analysis.common.figures import FigurePool

    pools = []

    def main(argv):
        with FigurePool(1) as pool:
            pools.append(pool)
            pool.submit([(time.sleep, (60,))])
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
            pool.results()

    with pytest.raises(SystemExit) as exit_info:
        cli.run(main, [])
    assert exit_info.value.code == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: terminated"
    assert pools[0]._processes == []  # closed: the worker killed, not left drawing
