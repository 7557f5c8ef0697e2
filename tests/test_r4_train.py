"""Round four of the reliability probe, training's share (issue 52): a signal ends a run within
seconds where no loop reads the flag (a model traced, data generated), a second Ctrl-C leaves no
traceback, and a workdir's derived files (the tokenizer, metrics.jsonl) belong to the run that
uses them, on a full disk and after a kill too."""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_pretrain_checks import write_micro

from bertjax import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _ctrl_c_as_in_a_terminal():
    """pytest-xdist starts its workers with SIGINT ignored, which `cli.run` keeps ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _signal_in(seconds: float, signum: int) -> None:
    threading.Timer(seconds, os.kill, (os.getpid(), signum)).start()


@pytest.mark.parametrize("work", ["python", "sleep"])
def test_sigterm_ends_work_that_reads_no_flag(capsys, work):
    """Probe 52: SIGTERM while a model was traced (Python that reads no flag) or while the run
    waited in C (a sleep, a lock) was ignored until the work ended, over 60 s. Here the work takes
    60 s unless the signal ends it."""
    finished = []

    def main(argv):
        _signal_in(0.5, signal.SIGTERM)
        if work == "sleep":
            time.sleep(60)
        else:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                sum(range(100))
        finished.append(work)

    with pytest.raises(SystemExit) as exit_info:
        cli.run(main, [])
    assert exit_info.value.code == 143 and finished == []
    assert capsys.readouterr().err.strip().splitlines() == ["error: terminated"]


def test_a_second_ctrl_c_in_a_garbage_collection_callback_exits_without_a_traceback(capsys):
    """Probe 52: the second Ctrl-C, raised at once, landed in JAX's `_xla_gc_callback` and was
    printed as `Exception ignored in: <function _xla_gc_callback …>` with its traceback; the run
    went on. Here the first Ctrl-C is pending in a loop that reads no flag, the second comes
    inside a garbage-collection callback."""
    finished = []

    def in_the_collector(phase, info):
        if phase == "start":
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))

    def main(argv):
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
        gc.callbacks.append(in_the_collector)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(in_the_collector)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:  # within the first signal's grace: only the second ends it
            sum(range(100))
        finished.append(True)

    with pytest.raises(SystemExit) as exit_info:
        cli.run(main, [])
    assert exit_info.value.code == 130 and finished == []
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: interrupted"], err


def test_a_trainer_step_longer_than_the_grace_still_saves_at_sigterm(capsys):
    """The watcher leaves alone a loop that reads the flag after each item, however long the item
    (the trainer's step, then its preemption checkpoint)."""
    steps = []

    def main(argv):
        with cli.reading_the_flag():
            _signal_in(0.2, signal.SIGTERM)
            time.sleep(cli.GRACE_S + 1)  # one long step
            steps.append("saved" if cli.terminated() else "not told")

    with pytest.raises(SystemExit) as exit_info:
        cli.run(main, [])
    assert exit_info.value.code == 143 and steps == ["saved"]


def _terminate_when(command: list[str], ready, bound: float = 20.0) -> subprocess.CompletedProcess:
    """Runs `command`, sends it SIGTERM once `ready(pid)` holds, and returns how it ended; it must end
    within `bound` seconds of the signal (well under CI's timeout). Without the compilation cache,
    so that what is compiled takes its time every run."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"})  # fmt: skip
    deadline = time.monotonic() + 300
    while not ready(process.pid):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    try:
        out, err = process.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"still running {bound} s after SIGTERM")
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def test_sigterm_ends_synthetic_data_generation_within_seconds(tmp_path):
    """Probe 52: `train.synthetic --tokens 100000000000` ignored SIGTERM for over 60 s."""
    started = time.monotonic()
    done = _terminate_when(
        [sys.executable, "-m", "train.synthetic", "--out", str(tmp_path / "text"), "--tokens", "100000000000"],
        lambda pid: time.monotonic() - started > 3,  # imports done, generating
    )
    assert done.returncode == 143 and done.stderr.strip().splitlines()[-1:] == ["error: terminated"], done.stderr
    assert not (tmp_path / "text").exists()


@pytest.mark.slow  # traces a 48-layer model: ~30 s of CPU
def test_sigterm_while_the_model_is_traced_ends_the_run_without_a_step(tmp_path):
    """Probe 52: SIGTERM while the trainer traced and compiled a large model waited for the first
    step to end (its checkpoint then saved): here it ends the run before any step is taken."""
    config = write_micro(tmp_path)
    workdir = tmp_path / "w"
    command = [sys.executable, "-m", "train.pretrain", "--config", str(config), "--workdir", str(workdir),
               "model.num_hidden_layers=48", "train.steps=2", "checkpoint.every=1"]  # fmt: skip
    # The tokenizer is written once the model's shapes are traced.
    done = _terminate_when(command, lambda pid: (workdir / "tokenizer").is_dir())
    assert done.returncode == 143 and done.stderr.strip().splitlines()[-1] == "error: terminated", done.stderr[-3000:]
    assert not list(workdir.glob("checkpoints/[0-9]*"))


def _distinct_words_text(path: Path, words: int) -> None:
    """`words` distinct random words, each twice, 40 to a line: read in seconds, while the
    trainer's merges over them take tens of seconds."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(6, 13, words)
    letters = (rng.integers(0, 26, int(lengths.sum())) + ord("a")).astype(np.uint8).tobytes().decode()
    ends = np.cumsum(lengths)
    vocabulary = [letters[end - length : end] for end, length in zip(ends.tolist(), lengths.tolist(), strict=True)]
    text = [vocabulary[i] for i in rng.permutation(np.tile(np.arange(words), 2))]
    path.write_text("\n".join(" ".join(text[i : i + 40]) for i in range(0, len(text), 40)) + "\n")


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


@pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").is_file(),
    reason="reads the run's child processes in /proc",
)
def test_sigterm_ends_the_vocabulary_trainer_within_seconds(tmp_path):
    """SIGTERM while the Rust trainer reads or merges (it reads no flag and held the thread a
    signal's exception is raised in, so the run waited for the vocabulary: minutes here on 2
    cores): the run ends within seconds with one line, and the workdir holds no data."""
    text = tmp_path / "words.txt"
    _distinct_words_text(text, 600_000)
    config = tmp_path / "vocab.yaml"
    config.write_text(write_micro(tmp_path).read_text().replace(str(tmp_path / "text" / "train.txt"), str(text))
                      .replace("vocab_size: 160", "vocab_size: 300000"))  # fmt: skip
    workdir = tmp_path / "w"
    since = []

    def training(pid: int) -> bool:  # the trainer's process fed for 5 s: reading or merging, both to be ended
        if _children(pid) and not since:
            since.append(time.monotonic())
        return bool(since) and time.monotonic() - since[0] > 5

    command = [sys.executable, "-m", "train.pretrain", "--config", str(config), "--workdir", str(workdir)]
    done = _terminate_when(command, training, bound=15.0)
    assert done.returncode == 143, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == "error: terminated" and "Traceback" not in done.stderr
    assert not list(workdir.glob("*data*")), sorted(p.name for p in workdir.iterdir())


def _pretrain(config: Path, workdir: Path, *overrides: str, **kwargs) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "train.pretrain", "--config", str(config), "--workdir", str(workdir), *overrides]
    return subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=600, **kwargs)


def _vocab(tokenizer_dir: Path) -> dict[str, int]:
    return json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]


def _data_vocab(data_dir: Path) -> dict[str, int]:
    return {token: i for i, token in enumerate((data_dir / "vocab.txt").read_text().splitlines())}


@pytest.mark.slow  # three micro pre-trainings: ~40 s of CPU
def test_a_reused_workdir_gets_the_new_runs_tokenizer_and_a_resume_keeps_its_own(tmp_path):
    """Probe 52: a workdir re-used for a run that trains another vocabulary of the same size kept
    the old `tokenizer/`, and every analysis of the run tokenised with it."""
    (tmp_path / "a").mkdir()
    first = write_micro(tmp_path / "a")
    other_text = tmp_path / "b"
    other_text.mkdir()
    from train import synthetic

    synthetic.write(other_text / "text", words=80, successors=2, tokens=6000, seed=5, heldout_tokens=1000)
    second = tmp_path / "b" / "micro.yaml"
    second.write_text(first.read_text().replace(str(first.parent / "text"), str(other_text / "text")))

    workdir = tmp_path / "w"
    assert _pretrain(first, workdir, "train.steps=2").returncode == 0
    old_vocab = _vocab(workdir / "tokenizer")
    # The user clears the run's checkpoints and data, and keeps the rest.
    for name in ("checkpoints", "data-T32"):
        subprocess.run(["rm", "-r", str(workdir / name)], check=True)
    done = _pretrain(second, workdir, "train.steps=2")
    assert done.returncode == 0, done.stderr[-3000:]
    new_vocab = _data_vocab(workdir / "data-T32")
    assert len(new_vocab) == len(old_vocab) and new_vocab != old_vocab
    assert _vocab(workdir / "tokenizer") == new_vocab

    # A resume (here of the finished run) keeps the tokenizer its checkpoints were trained with.
    (workdir / "tokenizer" / "marker").write_text("kept")
    done = _pretrain(second, workdir, "train.steps=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (workdir / "tokenizer" / "marker").is_file()


def test_write_tokenizer_replaces_another_runs_and_keeps_a_resumed_runs(tmp_path):
    """Probe 52's `tokenizer` link too: replaced by the run's own, not written through."""
    from transformers import BertTokenizerFast

    from train.pretraining import write_tokenizer

    def tokenizer(words: list[str]) -> BertTokenizerFast:
        vocab = tmp_path / "vocab.txt"
        vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
        return BertTokenizerFast(vocab=str(vocab), do_lower_case=True)

    target = tmp_path / "tokenizer"
    write_tokenizer(tokenizer(["aa", "bb"]), target, resumed=False)
    write_tokenizer(tokenizer(["cc", "dd"]), target, resumed=True)
    assert "aa" in _vocab(target)
    write_tokenizer(tokenizer(["cc", "dd"]), target, resumed=False)
    assert "cc" in _vocab(target) and "aa" not in _vocab(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer", "vocab.txt"]  # no temporary left

    elsewhere = tmp_path / "elsewhere"
    target.rename(elsewhere)
    target.symlink_to(elsewhere)
    write_tokenizer(tokenizer(["ee", "ff"]), target, resumed=False)
    assert not target.is_symlink() and "ee" in _vocab(target) and "cc" in _vocab(elsewhere)


def test_shards_prepared_from_a_corpus_since_rewritten_are_refused(tmp_path, cli_error):
    """Probe 52's class: a workdir's shards (and the vocabulary trained with them) were reused for a
    corpus rewritten at the same path, since only the settings were compared."""
    from train import pretrain

    config = write_micro(tmp_path)
    workdir = tmp_path / "w"
    pretrain.main(["--config", str(config), "--workdir", str(workdir), "--prepare-only"])
    text = tmp_path / "text" / "train.txt"
    before = text.stat().st_size
    text.write_text(text.read_text() + "\nA new document .\n")
    message = cli_error(pretrain.main, ["--config", str(config), "--workdir", str(workdir)])
    assert message == (
        f"error: {workdir / 'data-T32'}: prepared with other data settings ({text}: {before} bytes then, "
        f"{text.stat().st_size} bytes now); delete it to prepare again, or set data_dir to shards prepared with "
        "these settings"
    )


def _limited(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.slow  # prepares, then traces the model: ~25 s of CPU
def test_a_full_disk_while_the_tokenizer_is_written_is_one_line_and_removes_the_workdir(tmp_path, shared_data):
    """Probe 52: ENOSPC in `tokenizer.save_pretrained` was a traceback and left the workdir. Here the
    bert-base vocabulary's tokenizer.json (~700 kB) does not pass a 50 kB file-size limit that
    config.yaml passes; the data is prepared beforehand, without the limit."""
    config = write_micro(tmp_path)
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    data = [f"data.vocab_file={vocab}", "data.train_vocab=false", "data.vocab_size=30522"]
    prepared = tmp_path / "prepared"
    assert _pretrain(config, prepared, *data, "--prepare-only").returncode == 0
    workdir = tmp_path / "runs" / "w"
    done = _pretrain(
        config,
        workdir,
        *data,
        f"data_dir={prepared / 'data-T32'}",
        preexec_fn=_limited(50_000),
        env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"},
    )  # its entries pass no limit
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: no space left writing the tokenizer into {workdir / 'tokenizer'} (File too large); make room and "
        "run the same command again"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # fine-tunes the tiny model until the tokenizer is written: ~20 s of CPU
def test_a_full_disk_while_finetuning_writes_the_tokenizer_is_one_line_and_removes_the_workdir(
    tiny_hf, shared_data, tmp_path
):
    workdir = tmp_path / "runs" / "w"
    command = [sys.executable, "-m", "train.finetune", "--task", "mrpc", "--ckpt", str(tiny_hf), "--workdir",
               str(workdir), "--glue-dir", str(shared_data / "glue"), "data.max_train_examples=16",
               "data.max_seq_length=32", "train.global_batch_size=8", "train.epochs=1"]  # fmt: skip
    done = subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          preexec_fn=_limited(50_000), env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"})  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: no space left writing the tokenizer into {workdir / 'tokenizer'} (File too large); make room and "
        "run the same command again"
    )
    assert not (tmp_path / "runs").exists()


def test_metrics_are_truncated_to_the_resumed_step_without_a_torn_line(tmp_path):
    """Probe 52: after SIGKILL and a resume metrics.jsonl held the rows between the checkpoint and
    the kill twice, and the next row was appended to a torn last line."""
    from train.metrics import MetricsWriter

    rows = [{"step": s, "loss": 1.0} for s in (1, 2, 2, 3, 4)]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "lo'
    (tmp_path / "metrics.jsonl").write_text(text)
    writer = MetricsWriter(tmp_path, enabled=True, start=2)
    writer.write(3, {"loss": 0.5})
    writer.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 2, 3]


def test_a_resumed_finetunings_first_evaluation_drops_the_killed_runs_rows(tmp_path, monkeypatch):
    """eval.jsonl, like metrics.jsonl: the rows a run killed after its checkpoint wrote, and a line
    the kill tore, are not kept beside the resumed run's (summarise_evaluations refused the torn one)."""
    from types import SimpleNamespace

    import numpy as np

    from train import finetuning

    rows = [{"task": "mrpc", "split": "dev", "step": s, "accuracy": 0.5} for s in (10, 20, 30)]
    path = tmp_path / finetuning.EVAL_ROWS
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"task": "mrpc", "st')
    evaluator = finetuning.Evaluator.__new__(finetuning.Evaluator)
    labels = np.array([0, 1])
    evaluator.__dict__.update(
        trainer=SimpleNamespace(is_main=True, workdir=tmp_path, mesh=None), arrays={"labels": labels},
        spec=SimpleNamespace(name="mrpc", metrics=("accuracy",)), split="dev", batch_size=2, batches_per_epoch=10,
        seconds=0.0, first=True, forward=lambda params, batch: np.eye(2, dtype=np.float32),
    )  # fmt: skip
    monkeypatch.setattr(finetuning, "eval_batches", lambda *a: [{}])
    monkeypatch.setattr(finetuning.sharding, "global_batch", lambda batch, mesh: batch)
    evaluator(20, {})  # resumed from step 10: its first evaluation is at 20
    evaluator(30, {})
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [10, 20, 30]


def _purges(workdir: Path) -> list[int]:
    """The steps of the TensorBoard restarts (`SessionLog.START`: TensorBoard hides the earlier
    files' events from that step on), in the order of the event files."""
    from tensorboardX.proto import event_pb2

    steps = []
    for path in sorted((workdir / "tensorboard").glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            length = int.from_bytes(data[offset : offset + 8], "little")
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            if event.session_log.status == event_pb2.SessionLog.START:
                steps.append(event.step)
    return steps


@pytest.mark.slow  # a micro pre-training, killed, then resumed: ~30 s of CPU
def test_metrics_after_sigkill_and_resume_hold_each_step_once_from_step_one(tmp_path):
    """Probe 52: rows logged between the checkpoint and a SIGKILL came twice after the resume, the
    next row was appended to a line the kill tore, and step 1 (and the resume's first step) was
    never logged. Killed once step 12 is logged, after the checkpoint of step 10 or later."""
    from test_probe import tensorboard_scalars

    config = write_micro(tmp_path)
    overrides = ["train.steps=60", "train.log_every=3", "checkpoint.every=10", "checkpoint.keep=10"]
    workdir = tmp_path / "w"
    process = subprocess.Popen([sys.executable, "-m", "train.pretrain", "--config", str(config), "--workdir",
                                str(workdir), *overrides], cwd=ROOT, stderr=subprocess.DEVNULL)  # fmt: skip
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (
        (workdir / "checkpoints" / "10").is_dir() and metrics.is_file() and '"step": 12,' in metrics.read_text()
    ):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before step 12"
        time.sleep(0.01)
    process.kill()
    process.wait()
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    with metrics.open("a") as f:
        f.write('{"step": 13, "lo')  # as a kill mid-write leaves it
    done = _pretrain(config, workdir, *overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps[0] == 1 and steps == sorted(set(steps)), steps
    assert saved + 1 in steps and 60 in steps
    assert set(tensorboard_scalars(workdir)["loss"]) >= set(steps)
    assert _purges(workdir) == [1, saved + 1]
