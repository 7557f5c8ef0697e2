"""A checkpoint's text is opened once, at the entry point, into a `bertjax.Checkpoint` that is passed
down (docs/layout.md, "A checkpoint handle"): one opening per checkpoint and one metadata read per
orbax step in a whole run, and no library function below the entry points opens a text itself."""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from test_track import write_run

import bertjax
from bertjax import checkpoint as ckpt
from bertjax import pretrained

ROOT = Path(__file__).resolve().parents[1]

# Where a checkpoint's text is opened: the entry points (`analysis/*.py`, the training commands)
# and the API (`analysis/api/`), which are not scanned, and these functions, each the place its
# texts first become checkpoints.
BOUNDARIES = {
    # One text naming many checkpoints (a `--run` workdir, a `--ckpt` list of SOURCE@LABEL, a
    # `{step}` pattern) becomes its members here, in the track's `prepare`, each opened once and
    # handed down as a handle; `--with-init`'s init is a text read from a step's meta file.
    ("analysis/heads/series.py", "run_members"),
    ("analysis/heads/series.py", "series_members"),
    ("analysis/heads/series.py", "_resolve_step"),
    # `analysis.report RUN_DIR`: the checkpoint is a text read from the run's run.json (a result
    # held in memory hands the report the same record, without its handles).
    ("analysis/heads/report.py", "examples_data"),
    # The importable training runs, which the commands call: `train.init_from` (`init` for
    # fine-tuning) is a text of their typed config, read from a YAML file or a flag, opened once
    # there and handed to the trainer.
    ("train/pretraining.py", "_run"),
    ("train/finetuning.py", "_run"),
}
ENTRY_MODULES = {"train/pretrain.py", "train/finetune.py", "train/prepare.py"}
LOADERS = {"from_pretrained", "load_tokenizer"}


def _library_modules() -> list[Path]:
    """analysis/ and train/ below their entry points and the API."""
    found = []
    for path in sorted([*(ROOT / "analysis").rglob("*.py"), *(ROOT / "train").rglob("*.py")]):
        relative = path.relative_to(ROOT).as_posix()
        if path.parent == ROOT / "analysis" or relative.startswith("analysis/api/") or relative in ENTRY_MODULES:
            continue
        found.append(path)
    return found


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _opening_texts(path: Path) -> list[str]:
    """The functions of `path` that open a checkpoint's text (a call to the opener, or a loader
    given a step, which only a text needs) or take a `ckpt: str`, as `path:function: what`."""
    relative = path.relative_to(ROOT).as_posix()
    found = []
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = function.args
        for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if argument.arg == "ckpt" and argument.annotation is not None and "str" in ast.unparse(argument.annotation):
                found.append(f"{relative}:{function.name}: takes ckpt: {ast.unparse(argument.annotation)}")
        if (relative, function.name) in BOUNDARIES:
            continue
        for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
            name = _called(call)
            # `resolve` with an argument: not pathlib's `Path.resolve()`.
            opens = name == "open_checkpoint" or (name == "resolve" and call.args)
            if opens or (name in LOADERS and any(k.arg in ("step", "revision") for k in call.keywords)):
                found.append(f"{relative}:{function.name}: calls {ast.unparse(call)[:80]}")
    return found


def test_no_library_function_below_the_entry_points_opens_a_checkpoint_text():
    modules = _library_modules()
    assert any(p.name == "pipeline.py" for p in modules) and not any("api" in p.parts for p in modules)
    assert [line for path in modules for line in _opening_texts(path)] == []


def test_the_boundaries_named_exist():
    """An allowance for a function that is gone (renamed, moved) would hide its successor."""
    defined = set()
    for relative in {module for module, _ in BOUNDARIES}:
        tree = ast.parse((ROOT / relative).read_text())
        defined |= {(relative, n.name) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert defined >= BOUNDARIES


def test_the_scan_sees_an_opening(tmp_path, monkeypatch):
    """The scan's own check: a library function opening a text, or taking one, is named."""
    source = tmp_path / "analysis" / "heads" / "planted.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "def load(ckpt: str, step):\n    return from_pretrained(ckpt, step=step)\n\n"
        "def other(text):\n    return open_checkpoint(text)\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _opening_texts(source) == [
        "analysis/heads/planted.py:load: takes ckpt: str",
        "analysis/heads/planted.py:load: calls from_pretrained(ckpt, step=step)",
        "analysis/heads/planted.py:other: calls open_checkpoint(text)",
    ]


@pytest.fixture
def counted(monkeypatch):
    """Counts each checkpoint opened (by its path and step) and each step's metadata read, wherever
    the opener was imported."""
    opened, reads = collections.Counter(), collections.Counter()
    real_open, real_read = pretrained.open_checkpoint, ckpt.read_meta

    def counting_open(*args, **kwargs):
        checkpoint = real_open(*args, **kwargs)
        opened[(str(checkpoint.path), checkpoint.step)] += 1
        return checkpoint

    def counting_read(directory, step):
        reads[(str(directory), step)] += 1
        return real_read(directory, step)

    for module in list(sys.modules.values()):
        if getattr(module, "open_checkpoint", None) is real_open:
            monkeypatch.setattr(module, "open_checkpoint", counting_open)
    monkeypatch.setattr(ckpt, "read_meta", counting_read)
    return opened, reads


def _flags(shared_data: Path, tmp_path: Path) -> list[str]:
    return ["--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "8", "--batch-size", "8",
            "--max-length", "32", "--cache-dir", str(tmp_path / "parses"), "--no-figures"]  # fmt: skip


def test_a_roles_run_opens_its_checkpoint_once(shared_data, tmp_path, counted):
    from analysis import roles

    run = write_run(tmp_path / "run", shared_data, (2,))
    opened, reads = counted
    roles.main(["--ckpt", str(run), "--out", str(tmp_path / "out"), *_flags(shared_data, tmp_path)])
    step = (str(run / ckpt.CHECKPOINTS), 2)
    assert dict(opened) == {step: 1}
    assert dict(reads) == {step: 1}


def test_a_track_run_opens_each_checkpoint_once(shared_data, tmp_path, counted):
    from analysis import track

    run = write_run(tmp_path / "run", shared_data, (1, 3))
    opened, reads = counted
    track.main(["--run", str(run), "--out", str(tmp_path / "out"), *_flags(shared_data, tmp_path)])
    directory = str(run.resolve() / ckpt.CHECKPOINTS)
    assert dict(opened) == {(directory, 1): 1, (directory, 3): 1}
    assert dict(reads) == {(directory, 1): 1, (directory, 3): 1}


def test_from_pretrained_takes_a_handle_and_refuses_a_second_step(shared_data, tmp_path):
    run = write_run(tmp_path / "run", shared_data, (1, 3))
    checkpoint = bertjax.open_checkpoint(run, step=1)
    assert (checkpoint.kind, checkpoint.step, checkpoint.config.num_hidden_layers) == ("orbax", 1, 2)
    assert checkpoint.tokenizer_directory == run / "tokenizer"
    model = bertjax.from_pretrained(checkpoint)
    assert model.config == checkpoint.config
    assert len(bertjax.load_tokenizer(checkpoint)) == checkpoint.config.vocab_size
    with pytest.raises(bertjax.UserError, match=r"an opened checkpoint names its own step and revision; give neither$"):
        bertjax.from_pretrained(checkpoint, step=3)


@pytest.mark.parametrize("empty_folder", [False, True], ids=["new-workdir", "empty-checkpoints-folder"])
def test_a_pretraining_run_opens_its_init_once_and_a_resume_not_at_all(empty_folder, shared_data, tmp_path, counted):
    """`train.init_from` is opened once, by the run's entry, in a new workdir and in one whose
    checkpoints folder holds no step; the run starts from its params (a zero learning rate keeps
    them), and a rerun, which resumes, never opens it."""
    from bertjax.settings import load_config
    from train import pretrain

    init = write_run(tmp_path / "init", shared_data, (1, 2))
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "alice.txt").symlink_to(shared_data / "gutenberg" / "carroll-alice.txt")
    overrides = {
        "data.corpora": f"[{{name: books, source: local, path: {tmp_path / 'books'}, kind: gutenberg}}]",
        "data.vocab_file": str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"),
        "data.max_seq_length": "32", "data.max_predictions_per_seq": "5", "train.steps": "1",
        "train.global_batch_size": "8", "optimizer.learning_rate": "0", "checkpoint.every": "0",
        "checkpoint.log_spaced": "0", "train.init_from": str(init), "train.init_step": "1",
    }  # fmt: skip
    config = load_config(
        pretrain.PretrainConfig, ROOT / "configs/pretrain/tiny.yaml", [f"{k}={v}" for k, v in overrides.items()]
    )
    workdir = tmp_path / "work"
    if empty_folder:
        (workdir / ckpt.CHECKPOINTS).mkdir(parents=True)
    opened, reads = counted
    pretrain.run(config, workdir)
    step = (str(init / ckpt.CHECKPOINTS), 1)
    assert dict(opened) == {step: 1}
    assert dict(reads) == {step: 1}

    opened.clear()
    reads.clear()
    pretrain.run(config, workdir)
    assert dict(opened) == {} and step not in reads
    trained = bertjax.from_pretrained(workdir, bertjax.BertForPreTraining)
    started = bertjax.from_pretrained(init, bertjax.BertForPreTraining, step=1)
    for (name, value), (_, expected) in zip(nnx.to_flat_state(nnx.state(trained, nnx.Param)),
                                            nnx.to_flat_state(nnx.state(started, nnx.Param)), strict=True):  # fmt: skip
        np.testing.assert_array_equal(value.get_value(), expected.get_value(), err_msg=str(name))


def test_a_finetuning_run_opens_its_init_once(shared_data, tmp_path, counted):
    from test_finetune import QUICK

    from train import finetune

    init = write_run(tmp_path / "init", shared_data, (1, 3))
    opened, reads = counted
    finetune.main(["--task", "mrpc", "--ckpt", str(init), "--workdir", str(tmp_path / "work"), "--glue-dir",
                   str(shared_data / "glue"), *QUICK, "train.epochs=1", "init_step=1"])  # fmt: skip
    step = (str(init / ckpt.CHECKPOINTS), 1)
    assert dict(opened) == {step: 1}
    assert dict(reads) == {step: 1}
