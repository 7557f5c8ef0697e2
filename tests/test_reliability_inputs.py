"""Bad inputs a user can hand the CLIs (a broken config.json, an unsafe pytorch_model.bin, a
truncated orbax checkpoint, a short CoNLL-U line, a NaN learning rate): each is one line naming the
file or setting, a non-zero exit, and nothing written."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bertjax
from bertjax.config import BertConfig
from bertjax.errors import UserError
from sieves.parse import read_conllu

ROOT = Path(__file__).resolve().parents[1]


def _with_config(tiny_hf: Path, tmp_path: Path, edit) -> Path:
    """A copy of the tiny checkpoint whose config.json is `edit(config)` (a dict), as JSON."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    for file in tiny_hf.iterdir():
        (directory / file.name).symlink_to(file)
    (directory / "config.json").unlink()
    (directory / "config.json").write_text(json.dumps(edit(json.loads((tiny_hf / "config.json").read_text()))))
    return directory


# -- config.json values (defect 5) ------------------------------------------------------------


def _set(key, value):
    return lambda config: {**config, key: value}


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (_set("num_attention_heads", "twelve"), "num_attention_heads must be an integer ≥ 1, got 'twelve'"),
        (_set("num_attention_heads", 12.0), "num_attention_heads must be an integer ≥ 1, got 12.0"),
        (_set("num_attention_heads", 0), "num_attention_heads must be an integer ≥ 1, got 0"),
        (_set("num_attention_heads", None), "num_attention_heads must be an integer ≥ 1, got None"),
        (_set("num_attention_heads", True), "num_attention_heads must be an integer ≥ 1, got True"),
        (_set("vocab_size", "30522"), "vocab_size must be an integer ≥ 1, got '30522'"),
        (_set("hidden_dropout_prob", 1.5), "hidden_dropout_prob must be a number in [0, 1), got 1.5"),
        (_set("layer_norm_eps", "1e-12"), "layer_norm_eps must be a number > 0, got '1e-12'"),
        (_set("pad_token_id", 40000), "pad_token_id must be an integer in [0, vocab_size 30522), got 40000"),
        (_set("hidden_act", 3), "hidden_act must be a string, got 3"),
        (_set("id2label", 3), "id2label must be an object of label names, got 3"),
        (lambda config: [config], "not a JSON object of config fields (it is a JSON list)"),
    ],
)
def test_a_config_json_of_the_wrong_type_or_range_is_one_line(edit, expected, tiny_hf, tmp_path):
    directory = _with_config(tiny_hf, tmp_path, edit)
    with pytest.raises(UserError) as error:
        BertConfig.from_json_file(directory / "config.json")
    assert str(error.value) == f"{directory / 'config.json'}: {expected}"


def test_analysis_and_finetune_refuse_a_bad_config_json_with_one_line(tiny_hf, shared_data, tmp_path, cli_error):
    from analysis import roles
    from train import finetune

    directory = _with_config(tiny_hf, tmp_path, _set("num_attention_heads", "twelve"))
    expected = f"error: {directory / 'config.json'}: num_attention_heads must be an integer ≥ 1, got 'twelve'"
    out = tmp_path / "out"
    argv = ["--ckpt", str(directory), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--out", str(out)]
    assert cli_error(roles.main, argv) == expected
    workdir = tmp_path / "ft"
    argv = [
        "--task",
        "mrpc",
        "--ckpt",
        str(directory),
        "--workdir",
        str(workdir),
        "--glue-dir",
        str(shared_data / "glue"),
    ]
    assert cli_error(finetune.main, argv) == expected
    assert not out.exists() and not workdir.exists()


# -- pytorch_model.bin that weights_only refuses (defect 7) ------------------------------------


class _Payload:
    """What a malicious pickle carries: any class, here a harmless one."""

    def __reduce__(self):
        return (print, ("this ran from a checkpoint",))


def _torch_dir(tiny_hf: Path, tmp_path: Path, write) -> Path:
    directory = tmp_path / "torch_ckpt"
    directory.mkdir()
    (directory / "config.json").write_bytes((tiny_hf / "config.json").read_bytes())
    write(directory / "pytorch_model.bin")
    return directory


@pytest.mark.parametrize("form", ["pickle_payload", "legacy_raw_pickle"])
def test_an_unsafe_pytorch_bin_is_refused_with_one_line(form, tiny_hf, tmp_path, capsys):
    torch = pytest.importorskip("torch")

    def write(path: Path) -> None:
        if form == "pickle_payload":
            torch.save({"embeddings.word_embeddings.weight": torch.zeros(2), "x": _Payload()}, path)
        else:
            path.write_bytes(pickle.dumps({"x": _Payload()}))

    directory = _torch_dir(tiny_hf, tmp_path, write)
    with pytest.raises(UserError) as error:
        bertjax.from_pretrained(directory)
    assert str(error.value) == (
        f"{directory / 'pytorch_model.bin'}: cannot be loaded safely (it holds Python objects, not only tensors); "
        "convert it to model.safetensors where you trust it"
    )
    assert "this ran" not in capsys.readouterr().out


def test_a_truncated_pytorch_bin_is_one_line(tiny_hf, tmp_path):
    torch = pytest.importorskip("torch")

    def write(path: Path) -> None:
        torch.save({"embeddings.word_embeddings.weight": torch.zeros(64)}, path)
        path.write_bytes(path.read_bytes()[:200])

    directory = _torch_dir(tiny_hf, tmp_path, write)
    with pytest.raises(UserError, match=r"pytorch_model.bin: unreadable \("):
        bertjax.from_pretrained(directory)


# -- a truncated orbax checkpoint (defect 4) ---------------------------------------------------


TRUNCATE_AND_LOAD = """
import sys
from pathlib import Path
import orbax.checkpoint as ocp
from flax import nnx
import bertjax
from bertjax import checkpoint as ckpt, cli

workdir = Path(sys.argv[1])
model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=64), seed=0)
manager = ocp.CheckpointManager(workdir / ckpt.CHECKPOINTS, item_names=(ckpt.PARAMS, ckpt.META))
params = ckpt.flatten_params(nnx.state(model, nnx.Param))
manager.save(3, args=ocp.args.Composite(**ckpt.save_args(params, ckpt.make_meta(model, "tok", {}))))
manager.wait_until_finished()
manager.close()
largest = max((p for p in (workdir / "checkpoints/3/params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
cli.run(lambda argv: bertjax.from_pretrained(workdir))
"""


def test_a_truncated_orbax_checkpoint_is_one_line_naming_step_and_array(tmp_path):
    # A subprocess: the failure printed ~220 lines, some from orbax threads at interpreter exit.
    result = subprocess.run([sys.executable, "-c", TRUNCATE_AND_LOAD, str(tmp_path / "run")], capture_output=True,
                            text=True, timeout=300, check=False, cwd=ROOT)  # fmt: skip
    assert result.returncode == 2
    # Reads of the other arrays, in flight when TensorStore fails one, complete on the event loop
    # orbax has closed, and orbax's unfinished read coroutines are collected with their error: each
    # was reported as unraisable, a `RuntimeError: Event loop is closed` traceback or an "Exception
    # ignored in: <coroutine object _read_array_index_and_device_put ...>" (1 run in 4 before
    # `bertjax.checkpoint.orbax_race_reports_held`). Now the error's line is all.
    lines = [line for line in result.stderr.splitlines() if " INFO " not in line and " WARNING " not in line]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"error: {tmp_path / 'run' / 'checkpoints' / '3'}: checkpoint step 3 is unreadable: ")
    assert "array embeddings/word_embeddings/embedding (" in lines[0]  # the largest array
    assert "meta_path" not in result.stderr


# -- CoNLL-U token lines with too few columns (defect 6) --------------------------------------


def test_a_conllu_line_with_too_few_columns_names_file_and_line(tmp_path):
    path = tmp_path / "short.conllu"
    path.write_text(
        "# text = Dogs bark.\n1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n2\tbark\tbark\tVERB\tVBP\t_\t0\troot\n\n"
    )
    with pytest.raises(UserError) as error:
        read_conllu(path)
    assert str(error.value) == (
        f"{path}:3: a token line needs 10 tab-separated columns "
        "(ID, FORM, LEMMA, UPOS, XPOS, FEATS, HEAD, DEPREL, DEPS, MISC); this one has 8"
    )


# -- a learning rate that cannot train (defect 10) ---------------------------------------------


@pytest.mark.parametrize("value", ["nan", ".inf", "-1e-4"])
def test_a_non_finite_or_negative_learning_rate_is_refused_before_anything_is_written(value, tmp_path, cli_error):
    from train import finetune, pretrain

    workdir = tmp_path / "run"
    argv = [
        "--config",
        str(ROOT / "configs/pretrain/tiny.yaml"),
        "--workdir",
        str(workdir),
        f"optimizer.learning_rate={value}",
    ]
    expected = f"error: optimizer.learning_rate: must be a finite number ≥ 0, got {float(value.lstrip('.'))}"
    assert cli_error(pretrain.main, argv) == expected
    argv = ["--task", "mrpc", "--ckpt", "unused", "--workdir", str(workdir), f"optimizer.end_learning_rate={value}"]
    assert cli_error(finetune.main, argv) == expected.replace("learning_rate", "end_learning_rate")
    assert not workdir.exists()


# -- one writer per workdir, settings checked before any work (issue 30) ------------------------


def _pretrain_argv(workdir: Path, *overrides: str) -> list[str]:
    return ["--config", str(ROOT / "configs/pretrain/tiny.yaml"), "--workdir", str(workdir), *overrides]


def test_a_second_pretraining_run_on_a_workdir_stops_at_once(tmp_path, cli_error):
    import os

    from bertjax import runinfo
    from train import pretrain

    workdir = tmp_path / "work"
    with runinfo.one_writer(workdir):  # the first run, as the lock sees it
        message = cli_error(pretrain.main, _pretrain_argv(workdir))
    assert message == (
        f"error: --workdir {workdir} is being written by another run (pid {os.getpid()}); "
        "wait for it to end or choose another --workdir"
    )
    assert list(tmp_path.iterdir()) == []  # the lock went with its holder; no workdir was made


def test_a_second_finetuning_run_on_a_workdir_stops_at_once(tmp_path, cli_error):
    import os

    from bertjax import runinfo
    from train import finetune

    workdir = tmp_path / "work"
    with runinfo.one_writer(workdir):  # the first run; the second stops before reading --ckpt
        message = cli_error(finetune.main, ["--task", "mrpc", "--ckpt", "unused", "--workdir", str(workdir)])
    assert message == (
        f"error: --workdir {workdir} is being written by another run (pid {os.getpid()}); "
        "wait for it to end or choose another --workdir"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_refused_run_keeps_a_workdir_holding_a_fine_tuning_seeds_checkpoint(tmp_path):
    from bertjax import runinfo

    workdir = tmp_path / "work"
    with pytest.raises(UserError), runinfo.one_writer(workdir):
        (workdir / "seed-1" / "checkpoints" / "3").mkdir(parents=True)  # seed 1 trained, seed 2 refused
        raise UserError("refused")
    assert (workdir / "seed-1" / "checkpoints" / "3").is_dir()
    with pytest.raises(UserError), runinfo.one_writer(tmp_path / "other"):
        (tmp_path / "other" / "seed-1" / "checkpoints").mkdir(parents=True)  # nothing saved yet
        raise UserError("refused")
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.global_batch_size=0", "train.global_batch_size: must be an integer ≥ 1, got 0"),
        ("train.global_batch_size=-8", "train.global_batch_size: must be an integer ≥ 1, got -8"),
        ("checkpoint.every=-1", "checkpoint.every: must be an integer ≥ 0 (0: no periodic saves), got -1"),
    ],
)
def test_pretraining_settings_are_refused_before_any_work(override, expected, tmp_path, cli_error):
    from train import pretrain

    assert cli_error(pretrain.main, _pretrain_argv(tmp_path / "work", override)) == f"error: {expected}"
    assert list(tmp_path.iterdir()) == []


def test_a_yaml_syntax_error_is_one_line(tmp_path, cli_error):
    from train import finetune, pretrain

    config = tmp_path / "bad.yaml"
    config.write_text("train:\n  steps: 3\n   seed: [\n")
    expected = f"error: {config}: not valid YAML (line 3, column 8: mapping values are not allowed in this context)"
    argv = ["--config", str(config), "--workdir", str(tmp_path / "work")]
    assert cli_error(pretrain.main, argv) == expected
    assert cli_error(finetune.main, ["--task", "mrpc", "--ckpt", "unused", *argv]) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_a_run_refused_after_its_start_leaves_no_workdir_it_created(tmp_path, cli_error):
    from train import pretrain

    workdir = tmp_path / "new" / "work"
    missing = tmp_path / "does-not-exist.txt"
    argv = _pretrain_argv(workdir, "data.train_vocab=false", f"data.vocab_file={missing}")
    assert cli_error(pretrain.main, argv) == f"error: {missing}: vocab_file does not exist"
    assert list(tmp_path.iterdir()) == []


def test_a_batch_larger_than_the_data_is_refused_once_the_data_is_prepared(shared_data, tmp_path, cli_error):
    """Refused before the tokenizer, config.yaml or checkpoints/ are written: a workdir the run made
    is removed, and one the user made keeps only the prepared shards (complete, and reused)."""
    from train import pretrain

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes((shared_data / "gutenberg" / "blake-poems.txt").read_bytes()[:20000])
    settings = (
        f"data.corpora=[{{name: books, source: local, path: {corpus}, kind: gutenberg}}]", "data.train_vocab=true",
        "data.vocab_size=300", "data.max_seq_length=64", "data.max_predictions_per_seq=10",
        "data.segmenter=sentencizer", "model.max_position_embeddings=64", "train.global_batch_size=100000",
    )  # fmt: skip
    (tmp_path / "mine").mkdir()
    for workdir in (tmp_path / "new" / "work", tmp_path / "mine"):
        message = cli_error(pretrain.main, _pretrain_argv(workdir, *settings))
        # About 124 sequences: the trained vocabulary, and so the count, may differ from run to run
        # (the WordPiece trainer breaks ties between equally frequent merges in hash-map order).
        assert re.fullmatch(
            rf"error: train\.global_batch_size: 100000 exceeds the 1[12]\d sequences prepared in "
            rf"{re.escape(str(workdir / 'data-T64'))}; lower it, or give the run more text",
            message,
        ), message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "mine"]
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["data-T64"]


def test_more_heldout_sequences_than_prepared_are_refused_before_anything_else_is_written(
    shared_data, tmp_path, cli_error
):
    from train import pretrain

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes((shared_data / "gutenberg" / "blake-poems.txt").read_bytes()[:20000])
    heldout = tmp_path / "heldout.txt"
    heldout.write_bytes((shared_data / "gutenberg" / "blake-poems.txt").read_bytes()[20000:26000])
    settings = (
        f"data.corpora=[{{name: books, source: local, path: {corpus}, kind: gutenberg}}]", "data.train_vocab=true",
        "data.vocab_size=300", "data.max_seq_length=64", "data.max_predictions_per_seq=10",
        "data.segmenter=sentencizer", "model.max_position_embeddings=64", "train.global_batch_size=8",
        f"heldout.corpora=[{{name: held, source: local, path: {heldout}, kind: plain}}]",
        "heldout.batch_size=8", "heldout.sequences=4096",
    )  # fmt: skip
    workdir = tmp_path / "mine"
    workdir.mkdir()
    message = cli_error(pretrain.main, _pretrain_argv(workdir, *settings))
    assert message.startswith("error: heldout.sequences: 4096 must lie in [heldout.batch_size 8, the ")
    assert message.endswith(f" instances of {workdir / 'heldout-T64'}]")
    # Only the prepared data: no config.yaml, tokenizer/ or checkpoints/.
    assert sorted(p.name for p in workdir.iterdir()) == ["data-T64", "heldout-T64"]


# -- weights and vocabularies that would give silent wrong results (issue 30) -------------------


def _copy_of(tiny_hf: Path, tmp_path: Path) -> Path:
    import shutil

    directory = tmp_path / "ckpt"
    shutil.copytree(tiny_hf, directory)
    return directory


def _roles_argv(ckpt: Path, shared_data: Path, out: Path, *extra: str) -> list[str]:
    return ["--ckpt", str(ckpt), "--task", "mrpc", "--roles", "local,cls", "--glue-dir", str(shared_data / "glue"),
            "--n", "4", "--batch-size", "4", "--no-figures", "--out", str(out), *extra]  # fmt: skip


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_first_tensor(value, tiny_hf, shared_data, tmp_path, cli_error):
    from safetensors.numpy import load_file, save_file

    from analysis import roles

    directory = _copy_of(tiny_hf, tmp_path)
    tensors = load_file(directory / "model.safetensors")
    for name in ("encoder.layer.1.attention.self.query.weight", "encoder.layer.0.output.dense.bias"):
        tensors[name][0, ...] = value  # the second in the model's order is the first named
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    expected = (
        f"error: {directory / 'model.safetensors'}: tensor encoder.layer.0.output.dense.bias holds 1 non-finite "
        "value(s) (NaN or ±Inf), and 1 other tensor(s) do too; refusing to load it "
        "(the analyses take --allow-nonfinite to go on)"
    )
    assert cli_error(roles.main, _roles_argv(directory, shared_data, out)) == expected
    assert not out.exists()


def test_allow_nonfinite_analyses_with_a_warning(tiny_hf, shared_data, tmp_path, caplog):
    from safetensors.numpy import load_file, save_file

    from analysis import roles

    directory = _copy_of(tiny_hf, tmp_path)
    tensors = load_file(directory / "model.safetensors")
    tensors["encoder.layer.1.attention.self.query.weight"][0, 0] = float("nan")
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    roles.main(_roles_argv(directory, shared_data, out, "--allow-nonfinite"))
    assert "encoder.layer.1.attention.self.query.weight holds 1 non-finite value(s)" in caplog.text
    assert "analysed anyway (--allow-nonfinite)" in caplog.text
    assert json.loads((out / "run.json").read_text())["config"]["allow_nonfinite"] is True


@pytest.mark.parametrize("module", ["roles", "clark", "ablate", "prune", "track", "finetune_effect"])
def test_allow_nonfinite_is_spelled_the_same_by_every_analysis(module):
    import importlib

    parse = importlib.import_module(f"analysis.{module}").parse_args
    with pytest.raises(SystemExit):  # the flag is known; the missing required ones end the parse
        parse(["--allow-nonfinite", "--help"])


def test_a_vocabulary_shorter_than_the_models_is_one_line(tiny_hf, shared_data, tmp_path, cli_error):
    from analysis import roles

    directory = _copy_of(tiny_hf, tmp_path)
    (directory / "tokenizer.json").unlink()  # the tokenizer is then built from vocab.txt alone
    words = (shared_data / "vocab" / "bert-base-uncased-vocab.txt").read_text(encoding="utf-8").splitlines()
    (directory / "vocab.txt").write_text("\n".join(words[:10000]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    expected = (
        f"error: {directory}: the tokenizer has 10000 tokens but the model's vocab_size is {len(words)}; "
        "they do not belong together"
    )
    assert cli_error(roles.main, _roles_argv(directory, shared_data, out)) == expected
    assert not out.exists()


@pytest.mark.parametrize(("vocab_size", "accepted"), [(30528, True), (30592, True), (30524, False), (30720, False)])
def test_an_embedding_table_padded_to_a_multiple_of_8_is_accepted(tiny_hf, tmp_path, vocab_size, accepted):
    """30522 WordPiece tokens in a table padded to 30528 (or to 30592, a multiple of 128) is one
    model; 2 rows more is not a padding, and 198 rows more is not one either."""
    directory = _copy_of(tiny_hf, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    tokens = len(bertjax.load_tokenizer(directory))
    assert config["vocab_size"] == tokens == 30522
    (directory / "config.json").write_text(json.dumps(config | {"vocab_size": vocab_size}))
    if accepted:
        assert len(bertjax.load_tokenizer(directory)) == tokens
    else:
        with pytest.raises(UserError, match="they do not belong together"):
            bertjax.load_tokenizer(directory)


# -- the report trusts nothing it reads (issue 30) ----------------------------------------------


@pytest.fixture(scope="module")
def roles_run(tiny_hf, shared_data, tmp_path_factory) -> Path:
    from analysis import roles

    out = tmp_path_factory.mktemp("report") / "run"
    roles.main(_roles_argv(tiny_hf, shared_data, out, "--cache-dir", str(out.parent / "cache")))
    return out


def _run_copy(roles_run: Path, tmp_path: Path, name: str = "run") -> Path:
    import shutil

    copy = tmp_path / name
    shutil.copytree(roles_run, copy)
    return copy


def test_the_report_replaces_no_file_that_is_not_a_report(roles_run, tmp_path, cli_error):
    from analysis import report

    run = _run_copy(roles_run, tmp_path)
    table = (run / "roles.csv").read_text()
    for argv in (["--out", str(run / "roles.csv")], ["--out", str(run / "roles.csv"), "--overwrite"]):
        message = cli_error(report.main, [str(run), "--examples", "0", *argv])
        assert (
            message == f"error: {run / 'roles.csv'} exists and is not a page analysis.report wrote; it is left as it is"
        )
    assert (run / "roles.csv").read_text() == table
    page = tmp_path / "page.html"
    report.main([str(run), "--examples", "0", "--out", str(page)])  # a new file
    assert cli_error(report.main, [str(run), "--examples", "0", "--out", str(page)]) == (
        f"error: --out {page} exists; pass --overwrite to replace it"
    )
    report.main([str(run), "--examples", "0", "--out", str(page), "--overwrite"])  # an earlier report
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "link.html").symlink_to(victim)
    message = cli_error(report.main, [str(run), "--examples", "0", "--out", str(tmp_path / "link.html")])
    assert message.endswith(
        "link.html is a symbolic link; refusing to write through it (remove it, or choose another path)"
    )
    assert victim.read_text() == "precious\n"


def _edit_run_json(run: Path, edit) -> None:
    info = json.loads((run / "run.json").read_text())
    edit(info)
    (run / "run.json").write_text(json.dumps(info))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("n", "abc", "config.n must be int, got 'abc'"),
        ("roles", 5, "config.roles must be a list of strings, got 5"),
        ("ckpt", None, "config.ckpt must be str, got None"),
        ("n", 0, "config: --n must be at least 1, got 0"),
        ("data_files", ["x"], "data_files must be an object of lists of files, got ['x']"),
        ("data_files", {"mrpc": [{"sha256": "0"}]}, "data_files.mrpc: each file needs a path and a sha256, got {'sha256': '0'}"),
        ("model_config", {"num_hidden_layers": "2"}, "model_config.num_hidden_layers must be an integer in [1, 1024], got '2'"),
    ],
)  # fmt: skip
def test_a_report_on_an_edited_run_json_is_one_line(field, value, expected, roles_run, tmp_path, cli_error):
    from analysis import report

    run = _run_copy(roles_run, tmp_path)
    if field in ("data_files", "model_config"):
        _edit_run_json(run, lambda info: info.update({field: value}))
    else:
        _edit_run_json(run, lambda info: info["config"].update({field: value}))
    assert cli_error(report.main, [str(run), "--examples", "0"]) == f"error: {run / 'run.json'}: {expected}"
    assert not (run / "report.html").exists()


def _edit_rows(lines: list[str]) -> dict[str, list[str]]:
    header, first, *rest = lines
    columns = header.split(",")

    def with_value(column: str, value: str) -> str:
        cells = first.split(",")
        cells[columns.index(column)] = value
        return ",".join(cells)

    return {
        "duplicated": [header, first, first, *rest[1:]],
        "huge": [header, with_value("layer", "200000000"), *rest],
        "negative": [header, with_value("head", "-1"), *rest],
        "nan": [header, with_value("layer", ""), *rest],
        "float": [header, with_value("head", "0.5"), *rest],
        "truncated": [header, first, *rest[:2]],
        "role_cut": [header, first, *rest[: len(rest) // 2]],
        "other_role": [header, with_value("role", "next"), *rest],
    }


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("duplicated", ":3: a second row for the same head (task, role, layer, head)"),
        ("huge", ":2: layer 200000000 is past the model's 2 layers"),
        ("negative", ":2: head must be an integer ≥ 0, got -1"),
        ("nan", ":2: layer must be an integer ≥ 0, got nan"),
        ("float", ":2: head must be an integer ≥ 0, got 0.5"),
        ("truncated", ": {'task': 'mrpc', 'role': 'local'} has 3 rows, not one per head (2 × 2): a truncated or edited table"),
        ("role_cut", ": task mrpc has no rows for role 'cls', which the run scored (run.json tasks): a truncated or edited table"),
        ("other_role", ": role 'next' is not one of the run's roles (run.json config.roles)"),
    ],
)  # fmt: skip
def test_a_report_on_an_edited_roles_csv_is_one_line(case, expected, roles_run, tmp_path, cli_error):
    from analysis import report

    run = _run_copy(roles_run, tmp_path)
    lines = (run / "roles.csv").read_text().splitlines()
    (run / "roles.csv").write_text("\n".join(_edit_rows(lines)[case]) + "\n")
    assert cli_error(report.main, [str(run), "--examples", "0"]) == f"error: {run / 'roles.csv'}{expected}"
    assert not (run / "report.html").exists()


def test_the_report_reloads_the_step_the_run_recorded(roles_run):
    from analysis.heads import report as heads_report

    run = heads_report.read_run(roles_run)
    run.info["checkpoint"] = {"kind": "orbax", "path": "/w/checkpoints", "step": 3}  # run with no --step
    assert [(m.ckpt, m.step) for m in heads_report.models_of(run)] == [(run.settings.ckpt, 3)]


HOSTILE = "<!--<script> </script> ]]> \u2028 \u2029 & \"'"


def test_the_report_escapes_what_it_embeds_and_still_has_its_grid(roles_run, tmp_path):
    import html
    import re

    from analysis import report

    run = _run_copy(roles_run, tmp_path, name="<!--<script>x")
    # A free-text setting the page shows (the split it also shows is checked against its choices,
    # as the flag is); with no examples the checkpoint is not loaded.
    _edit_run_json(run, lambda info: info["config"].update({"ckpt": HOSTILE}))
    report.main([str(run), "--examples", "0"])
    page = (run / "report.html").read_text(encoding="utf-8")
    # The data element ends at its own end tag: nothing in it opens a comment or a script.
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.DOTALL)
    payload = match.group(1)
    assert not set(payload) & set("<>&\u2028\u2029")
    data = json.loads(payload)
    assert data["checkpoint"] == HOSTILE and data["run_dir"].endswith("<!--<script>x")
    assert data["layers"] == 2 and data["heads"] == 2 and data["stats"]["mrpc"]["cls"]["mean"][0][0] is not None
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert "<" not in title and html.unescape(title).startswith("<!--<script>x")
    assert page.count("<script") == 2  # the data and the page's own script, nothing more


# -- the scores cache: an entry is what its name says (issue 30) --------------------------------


def test_a_scores_cache_entry_under_another_steps_name_is_scored_again(tmp_path, caplog):
    import shutil

    from analysis.heads import tracking

    settings = {"n": 4, "roles": ["local", "cls"]}
    one, three = {"step": 1, "files": "a"}, {"step": 3, "files": "b"}
    entry = tracking.cache_path(tmp_path, settings, one)
    tracking.save_scores(entry, {}, settings, one)
    assert tracking.read_cached(entry, expected={"settings": settings, "checkpoint": one}) == {}
    copied = tracking.cache_path(tmp_path, settings, three)
    shutil.copyfile(entry, copied)  # step 1's scores under step 3's name
    assert tracking.read_cached(copied, expected={"settings": settings, "checkpoint": three}) is None
    assert (
        "holds scores of other checkpoint (step or files) than its name says; its step is scored again" in caplog.text
    )
    assert tracking.read_cached(entry, expected={"settings": {**settings, "n": 8}, "checkpoint": one}) is None
    assert "holds scores of other settings than its name says" in caplog.text


def test_an_unusable_scores_cache_is_refused_before_any_scoring(tmp_path):
    from analysis.heads import tracking

    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"--scores-cache .*file/cache: cannot create it \(Not a directory\)"):
        tracking.prepare_cache(tmp_path / "file" / "cache", tmp_path / "out")
    tracking.prepare_cache(tmp_path / "cache", tmp_path / "out")
    # The write check leaves nothing but the mark that makes the folder a scores cache.
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".bertjax-output"]
