"""`--out` under faults: a directory that appears there during a run, two runs on one `--out`,
SIGTERM and SIGKILL. The runs are real `python -m analysis.roles` processes, paused with SIGSTOP
at the moment that matters, so each race happens the same way every time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertjax import runinfo
from bertjax.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _roles(tiny_hf, shared_data, out: Path, n: int = 4) -> list[str]:
    return [sys.executable, "-m", "analysis.roles", "--ckpt", str(tiny_hf), "--task", "mrpc", "--roles", "local,cls",
            "--glue-dir", str(shared_data / "glue"), "--n", str(n), "--batch-size", "4", "--no-figures",
            "--out", str(out)]  # fmt: skip


def _temporaries(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.tmp-*"))


def _start_and_pause(command: list[str], out: Path) -> subprocess.Popen:
    """Starts a run and stops it (SIGSTOP) once its temporary output exists: it is then past its
    start-up checks and has not moved its output in."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not _temporaries(out):
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, "the run never created its temporary output"
        time.sleep(0.01)
    process.send_signal(signal.SIGSTOP)
    assert not out.exists(), "the run finished before it could be paused"
    return process


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    process.send_signal(signal.SIGCONT)
    _, err = process.communicate(timeout=300)
    return process.returncode, err


def test_a_directory_made_at_out_during_the_run_survives(tiny_hf, shared_data, tmp_path):
    out = tmp_path / "out"
    process = _start_and_pause(_roles(tiny_hf, shared_data, out), out)
    out.mkdir()
    (out / "precious.txt").write_text("data\n")
    code, err = _finish(process)
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"error: --out {out} was created by something else while this run wrote its output; "
        "it is left as it is and this run's output is discarded"
    )
    assert sorted(p.name for p in out.iterdir()) == ["precious.txt"]
    assert (out / "precious.txt").read_text() == "data\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary, no lock


def test_of_two_runs_on_one_out_the_second_refuses(tiny_hf, shared_data, tmp_path):
    out = tmp_path / "out"
    first = _start_and_pause(_roles(tiny_hf, shared_data, out, n=4), out)
    second = subprocess.run(
        _roles(tiny_hf, shared_data, out, n=6), check=False, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 2
    assert second.stderr.strip().splitlines()[-1] == (
        f"error: --out {out} is being written by another run (pid {first.pid}); wait for it to end or choose another --out"
    )
    assert len(_temporaries(out)) == 1 and not out.exists()
    code, err = _finish(first)
    assert code == 0, err
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["n"] == 4  # the first run's output, whole
    assert {"roles.csv", "scores.npz", "run.json"} <= {p.name for p in out.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_sigterm_cleans_up_and_exits_143(tiny_hf, shared_data, tmp_path):
    out = tmp_path / "out"
    process = _start_and_pause(_roles(tiny_hf, shared_data, out), out)
    process.send_signal(signal.SIGTERM)  # delivered when it continues
    code, err = _finish(process)
    assert code == 143
    assert err.strip().splitlines()[-1] == "error: terminated"
    assert list(tmp_path.iterdir()) == []


def test_a_killed_runs_temporary_is_removed_by_the_next_run(tiny_hf, shared_data, tmp_path):
    out = tmp_path / "out"
    process = _start_and_pause(_roles(tiny_hf, shared_data, out), out)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert len(_temporaries(out)) == 1
    subprocess.run(_roles(tiny_hf, shared_data, out), cwd=ROOT, check=True, capture_output=True, timeout=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "run.json").is_file()


# The same rules, checked in-process on `atomic_out` itself.


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_atomic_out_keeps_what_appeared_and_removes_its_own_temporary(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UserError, match="was created by something else"), runinfo.atomic_out(out) as tmp:
        (tmp / "roles.csv").write_text("mine\n")
        out.mkdir()
        (out / "theirs.txt").write_text("theirs\n")
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_out_with_overwrite_still_replaces_only_its_own_kind_at_the_end(tmp_path):
    out = tmp_path / "out"
    with runinfo.atomic_out(out) as tmp:
        (tmp / "a.txt").write_text("1\n")
    with runinfo.atomic_out(out, overwrite=True) as tmp:  # an earlier output: replaced
        (tmp / "b.txt").write_text("2\n")
    assert sorted(p.name for p in out.iterdir()) == [runinfo.OUTPUT_MARKER, "b.txt"]
    with (
        pytest.raises(UserError, match="was created by something else"),
        runinfo.atomic_out(out, overwrite=True) as tmp,
    ):
        (out / runinfo.OUTPUT_MARKER).unlink()  # replaced meanwhile by something that is not an output
        (out / "notes.txt").write_text("keep\n")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt", "notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_out_refuses_a_second_writer_while_the_first_holds_out(tmp_path):
    out = tmp_path / "out"
    with runinfo.atomic_out(out) as tmp:
        (tmp / "x").write_text("")
        with (
            pytest.raises(UserError, match=rf"being written by another run \(pid {os.getpid()}\)"),
            runinfo.atomic_out(out),
        ):
            pass
    assert sorted(p.name for p in out.iterdir()) == [runinfo.OUTPUT_MARKER, "x"]
    with runinfo.atomic_out(tmp_path / "other"):  # the lock is gone with the run that held it
        pass


def test_only_stale_temporaries_of_the_same_kind_are_removed(tmp_path):
    out = tmp_path / "out"
    dead, alive = _dead_pid(), os.getpid()
    stale = tmp_path / f".out.tmp-{dead}-aaaa"
    running = tmp_path / f".out.tmp-{alive}-bbbb"
    other_kind = tmp_path / f".out.tmp-{dead}-cccc"
    no_pid = tmp_path / ".out.tmp-dddd"
    empty = tmp_path / f".out.tmp-{dead}-eeee"  # killed before it wrote its marker
    for directory, kind in ((stale, runinfo.ANALYSIS_OUTPUT), (running, runinfo.ANALYSIS_OUTPUT),
                            (other_kind, "prepared pre-training data"), (no_pid, runinfo.ANALYSIS_OUTPUT)):  # fmt: skip
        directory.mkdir()
        (directory / runinfo.OUTPUT_MARKER).write_text(kind + "\n")
    empty.mkdir()
    with runinfo.atomic_out(out):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", running.name, other_kind.name, no_pid.name])


# -- symbolic links planted where a file is to be written (issue 30) ---------------------------


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


def test_a_symlink_at_the_out_lock_is_refused_and_its_target_untouched(tiny_hf, shared_data, tmp_path, cli_error):
    from analysis import roles

    victim = _victim(tmp_path)
    scratch = tmp_path / "s"
    scratch.mkdir()
    (scratch / ".x.lock").symlink_to(victim)
    out = scratch / "x"
    message = cli_error(roles.main, _roles(tiny_hf, shared_data, out)[3:])
    assert message == (
        f"error: --out {out}: its lock {scratch / '.x.lock'} is a symbolic link; refusing to write through it (remove it)"
    )
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in scratch.iterdir()) == [".x.lock"]


def test_a_dangling_symlink_at_the_lock_creates_nothing(tmp_path):
    (tmp_path / ".out.lock").symlink_to(tmp_path / "would-be-created")
    with pytest.raises(UserError, match="is a symbolic link"), runinfo.atomic_out(tmp_path / "out"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock"]


def test_atomic_file_refuses_a_symlink_and_never_writes_through_one(tmp_path):
    victim = _victim(tmp_path)
    (tmp_path / "config.yaml").symlink_to(victim)
    with (
        pytest.raises(UserError, match=r"config\.yaml is a symbolic link; refusing to write through it"),
        runinfo.atomic_file(tmp_path / "config.yaml") as f,
    ):
        f.write("mine\n")
    assert victim.read_text() == "precious\n"
    # The temporary's name is random (O_EXCL): a link at the old fixed name is left alone.
    (tmp_path / "run.json.tmp").symlink_to(victim)
    (tmp_path / ".run.json.tmp").symlink_to(victim)
    with runinfo.atomic_file(tmp_path / "run.json") as f:
        f.write("{}\n")
    assert (tmp_path / "run.json").read_text() == "{}\n" and victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.json.tmp", "config.yaml", "run.json", "run.json.tmp", "victim.txt"]  # fmt: skip


def test_atomic_file_leaves_the_old_file_when_the_writer_fails(tmp_path):
    (tmp_path / "a.txt").write_text("old\n")
    with pytest.raises(ValueError), runinfo.atomic_file(tmp_path / "a.txt", overwrite=True) as f:
        f.write("half")
        raise ValueError
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"] and (tmp_path / "a.txt").read_text() == "old\n"


def test_appended_logs_refuse_a_symlink(tmp_path):
    from train.metrics import MetricsWriter

    victim = _victim(tmp_path)
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(UserError, match=r"metrics\.jsonl is a symbolic link"):
        MetricsWriter(tmp_path, enabled=True)
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("target", ["config.yaml", "scores", "parses", "config.json"])
def test_the_tools_own_files_refuse_a_symlink(target, tmp_path):
    """The resolved config, a scores-cache entry, the parse cache and a saved model's config.json."""
    import bertjax
    from analysis.heads import tracking
    from bertjax import settings as config_lib
    from sieves.parse import SpacyParser
    from train.pretrain import PretrainConfig

    victim = _victim(tmp_path)
    if target == "config.yaml":
        path = tmp_path / "config.yaml"
        path.symlink_to(victim)
        write = lambda: config_lib.save_resolved(PretrainConfig(), path)
    elif target == "scores":
        path = tmp_path / "step-000000001-0123456789abcdef.npz"
        path.symlink_to(victim)
        write = lambda: tracking.save_scores(path, {}, {}, {"step": 1})
    elif target == "parses":
        parser = SpacyParser(cache_dir=tmp_path)
        path = parser.cache_path
        path.symlink_to(victim)
        write = lambda: parser.parse(["A text."])
    else:
        path = tmp_path / "config.json"
        path.symlink_to(victim)
        write = lambda: bertjax.preset("tiny").to_json_file(path)
    with pytest.raises(UserError, match=f"{re.escape(path.name)} is a symbolic link; refusing to write through it"):
        write()
    assert victim.read_text() == "precious\n"
