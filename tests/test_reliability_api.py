"""The notebook API refuses what it cannot run, in one line and before any work (issue 42's probe,
1.2–1.46): settings of the wrong type, empty lists, a model that is not the checkpoint's or holds
NaN, `head_view`'s arguments, and the flags of `analysis.clark` that let a run end with nothing or
with numbers of no meaning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import bertjax
from analysis import api
from analysis import clark as clark_cli
from bertjax.errors import UserError


def _settings(shared_data: Path, cache: Path) -> dict:
    return dict(task="mrpc", glue_dir=str(shared_data / "glue"), n=8, batch_size=8, max_length=32,
                cache_dir=str(cache), figures="none")  # fmt: skip


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"n": "8"}, "n: expected an integer, got '8'"),  # 1.2
        ({"n": 8.0}, "n: expected an integer, got 8.0"),  # 1.3
        ({"n": True}, "n: expected an integer, got True"),
        ({"overwrite": "no"}, "overwrite: expected True or False, got 'no'"),  # 1.11
        ({"special_rows": 0}, "special_rows: expected True or False, got 0"),
        ({"max_length": None}, "max_length: expected an integer, got None"),
        ({"alpha": "0.05"}, "alpha: expected a number, got '0.05'"),
        ({"glue_dir": 3}, "glue_dir: expected text or None, got 3"),
        ({"roles": []}, "--roles: name at least one role (leave roles out for all of them)"),  # 1.9
        ({"roles": 5}, "roles: expected a list of strings (or a flag's comma-separated text), got 5"),
        (
            {"roles": ["local", 3]},
            "roles: expected a list of strings (or a flag's comma-separated text), got ['local', 3]",
        ),
    ],
)
def test_a_setting_of_the_wrong_type_is_one_line_before_anything_runs(keywords, message, tmp_path):
    # A checkpoint that does not exist: the settings are refused before it is looked for.
    with pytest.raises(UserError) as raised:
        api.roles(str(tmp_path / "no-such-ckpt"), out=tmp_path / "out", **keywords)
    assert str(raised.value) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("call", "keywords", "message"),
    [
        (api.clark, {"n": "8"}, "n: expected an integer or None, got '8'"),
        (api.ablate, {"overwrite": "yes"}, "overwrite: expected True or False, got 'yes'"),
        (api.prune, {"random_seeds": 1.5}, "random_seeds: expected an integer, got 1.5"),
        (lambda c, **k: api.track(ckpt=[c], **k), {"sas_n": "5"}, "sas_n: expected an integer, got '5'"),
        (lambda c, **k: api.track(ckpt=[c], **k), {"with_init": "no"}, "with_init: expected True or False, got 'no'"),
        (lambda c, **k: api.finetune_effect(c, "q:mrpc", **k), {"n": "8"}, "n: expected an integer, got '8'"),
        (api.report, {"examples": "4"}, "examples: expected an integer, got '4'"),
        (api.clark, {"analyses": 5}, "analyses: expected a list of strings (or a flag's comma-separated text), got 5"),
        (
            api.ablate,
            {"analyses": ["mask", 2]},
            "analyses: expected a list of strings (or a flag's comma-separated text), got ['mask', 2]",
        ),
    ],
)
def test_every_call_checks_the_types_of_its_settings(call, keywords, message, tmp_path):
    with pytest.raises(UserError) as raised:
        call(str(tmp_path / "no-such-ckpt"), **keywords)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"steps": 5}, "steps: expected a list of integers or the flag's comma-separated text, got 5"),  # 1.33
        ({"shard": (0, 2)}, "shard: expected the flag's text 'I/N' (e.g. '0/2'), got (0, 2)"),  # 1.33
        ({"run": None, "ckpt": 5}, "ckpt: expected a checkpoint source or a list of them, got 5"),
    ],
)
def test_track_refuses_steps_and_shard_in_another_form(keywords, message, tmp_path):
    with pytest.raises(UserError) as raised:
        api.track(**{"run": str(tmp_path)} | keywords)
    assert str(raised.value) == message


def test_finetune_effect_needs_a_post_checkpoint(tmp_path):  # 1.42
    # Named as the caller typed it: the keyword `post` (issue 52: the line named the CLI's `--post`).
    with pytest.raises(UserError, match=r"^post: give at least one fine-tuned checkpoint$"):
        api.finetune_effect(str(tmp_path), [])


def test_overwrite_no_keeps_the_first_output(tiny_hf, shared_data, tmp_path):  # 1.11
    settings = _settings(shared_data, tmp_path / "parses")
    api.roles(str(tiny_hf), out=tmp_path / "ow", **settings)
    with pytest.raises(UserError, match="overwrite: expected True or False"):
        api.roles(str(tiny_hf), out=tmp_path / "ow", overwrite="no", **settings | {"n": 9})
    assert json.loads((tmp_path / "ow" / "run.json").read_text())["config"]["n"] == 8
    # A result's save takes the same setting.
    result = api.roles(str(tiny_hf), **settings | {"n": 9})
    with pytest.raises(UserError, match=r"^overwrite: expected True or False, got 'no'$"):
        result.save(tmp_path / "ow", overwrite="no")
    assert json.loads((tmp_path / "ow" / "run.json").read_text())["config"]["n"] == 8


def test_distributed_after_jax_started_is_one_line(tiny_hf, shared_data, tmp_path):  # 1.46
    bertjax.init_model(bertjax.preset("tiny"))  # JAX's backend is up, as in any notebook that ran a cell
    with pytest.raises(UserError, match=r"^--distributed: this process has already started JAX"):
        api.roles(str(tiny_hf), distributed=True, **_settings(shared_data, tmp_path / "parses"))
    assert not list(tmp_path.glob("*roles*"))


# -- a model passed in ---------------------------------------------------------------------------


def test_a_model_that_is_not_a_model_is_one_line(tiny_hf, tmp_path):  # 1.12
    with pytest.raises(
        UserError, match=r"^model: expected a model loaded by bertjax \(bertjax.from_pretrained\), got 'x'$"
    ):
        api.roles(str(tiny_hf), model="x", tokenizer=bertjax.load_tokenizer(tiny_hf), out=tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_model_of_another_checkpoint_is_refused(tiny_hf, minilm, minilm_path, shared_data, tmp_path):  # 1.15
    # The numbers would be MiniLM's and run.json would name tiny_hf; the report would then draw
    # tiny_hf's 2 layers × 2 heads against MiniLM's 6 × 12 (an IndexError).
    with pytest.raises(UserError) as raised:
        api.roles(str(tiny_hf), model=minilm, tokenizer=bertjax.load_tokenizer(minilm_path), out=tmp_path / "o",
                  **_settings(shared_data, tmp_path / "parses"))  # fmt: skip
    assert str(raised.value).startswith(f"model: not the model of {tiny_hf} (num_hidden_layers 6 vs 2")
    assert not (tmp_path / "o").exists()


def test_a_model_passed_with_a_nan_weight_is_refused_as_a_file_is(tiny_hf, shared_data, tmp_path, caplog):  # 1.16
    model = bertjax.from_pretrained(tiny_hf)
    kernel = model.encoder.layer[1].attention.self.query.kernel
    kernel[...] = kernel[...].at[0, 0].set(math.nan)
    tokenizer = bertjax.load_tokenizer(tiny_hf)
    settings = _settings(shared_data, tmp_path / "parses") | {"roles": "local,cls"}
    with pytest.raises(
        UserError, match=r"^model \(passed in\): tensor encoder.layer.1.attention.self.query.weight holds 1 non-finite"
    ):
        api.roles(str(tiny_hf), model=model, tokenizer=tokenizer, out=tmp_path / "o", **settings)
    assert not (tmp_path / "o").exists()
    result = api.roles(str(tiny_hf), model=model, tokenizer=tokenizer, allow_nonfinite=True, **settings)
    assert "analysed anyway (--allow-nonfinite)" in caplog.text
    assert result.table["mean"].isna().any()


# -- head_view -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "keywords", "message"),
    [
        ("A sentence.", {"layer": 1.5, "head": 0}, "layer: expected an integer, got 1.5"),  # 1.23
        ("A sentence.", {"layer": "1", "head": 0}, "layer: expected an integer, got '1'"),  # 1.24
        ("A sentence.", {"layer": 0, "head": True}, "head: expected an integer, got True"),
        (123, {"layer": 0, "head": 0}, "head_view: text must be a sentence or a pair of sentences (two non-empty strings), got 123"),  # 1.24
        (("The company said its profit rose.", "Profits went up, the firm said."), {"layer": 0, "head": 0, "max_length": 3},
         "head_view: the text is 18 tokens with [CLS] and [SEP], more than max_length 3; raise max_length (to at most 128, this model's positions) or shorten the text"),  # 1.26
    ],
)  # fmt: skip
def test_head_view_arguments_are_checked(text, keywords, message, tiny_hf):
    with pytest.raises(UserError) as raised:
        api.head_view(str(tiny_hf), text, **keywords)
    assert str(raised.value) == message


def test_head_view_compiles_nothing_new_for_texts_of_similar_length(tiny_hf):  # 1.31
    import jax

    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    words = ["the", "cat", "sat", "on", "the", "mat", "while", "the", "dog", "barked", "at", "the", "moon"]
    model, tokenizer = bertjax.from_pretrained(tiny_hf), bertjax.load_tokenizer(tiny_hf)
    # 7 to 13 words with the full stop, [CLS] and [SEP]: 10 to 16 tokens, one padded length (16).
    api.head_view(model, " ".join(words[:7]) + ".", layer=0, head=0, tokenizer=tokenizer)
    counts = []
    for i in range(8, len(words) + 1):
        before = len(compiles)
        api.head_view(model, " ".join(words[:i]) + ".", layer=0, head=0, tokenizer=tokenizer)
        counts.append(len(compiles) - before)
    assert counts == [0] * len(counts)


# -- analysis.clark's flags ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--analyses", ""], "error: --analyses: name at least one analysis (choose from surface, cluster, gradients, depheads, probes, coref)"),  # 1.36
        (["--analyses", " , "], "error: --analyses: name at least one analysis (choose from surface, cluster, gradients, depheads, probes, coref)"),
        (["--cluster-n", "0"], "error: --cluster-n must be at least 1, got 0"),  # 1.37
        (["--gradient-n", "0"], "error: --gradient-n must be at least 1, got 0"),  # 1.38
        (["--ewt-n", "0"], "error: --ewt-n must be at least 1, got 0"),
        (["--probe-learning-rate", "nan"], "error: --probe-learning-rate must be a finite number > 0, got nan"),  # 1.39
        (["--probe-learning-rate", "0"], "error: --probe-learning-rate must be a finite number > 0, got 0.0"),
        # numpy's `ValueError: expected non-negative integer` traceback once the probes' data was read.
        (["--seed", "-1"], "error: --seed must be at least 0, got -1"),
        (["--min-count", "-1"], "error: --min-count must be at least 0, got -1"),
    ],
)  # fmt: skip
def test_clark_flags_that_would_run_nothing_or_nonsense_are_refused(flags, message, tmp_path, cli_error):
    line = cli_error(clark_cli.main, ["--ckpt", str(tmp_path / "c"), "--out", str(tmp_path / "o"), *flags])
    assert line == message
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["ablate", "prune"])
def test_ablate_and_prune_refuse_a_batch_size_of_0_before_loading(command, tmp_path, cli_error):
    """Not checked at all before: the run went on to load the checkpoint and read the data."""
    import importlib

    main = importlib.import_module(f"analysis.{command}").main
    argv = ["--ckpt", str(tmp_path / "c"), "--task", "mrpc", "--out", str(tmp_path / "o"), "--batch-size", "0"]
    assert cli_error(main, argv) == "error: --batch-size must be at least 1, got 0"
    assert list(tmp_path.iterdir()) == []


def test_report_takes_coref_and_overwrite_as_named(monkeypatch, tmp_path):
    # `coref` went into ReportConfig's `overwrite` place: the page got no coreference, and a
    # `coref` given meant --overwrite (found by the type check above).
    from analysis import tools

    written = []
    monkeypatch.setattr(tools, "execute", lambda analysis, config, **given: written.append(config))
    api.report(tmp_path, coref=tmp_path / "coref")
    assert written[0].coref == str(tmp_path / "coref") and written[0].overwrite is False


def test_roles_takes_the_parser_flags_value(tiny_hf, shared_data, tmp_path):
    """`parser="conllu"`, the flag's value as the docstring lists it, was taken for a parser
    object and ignored: the run analysed the default tasks (offline: the hub's error) instead of
    the CoNLL-U sentences."""
    gold = tmp_path / "gold.conllu"
    sentences = (shared_data / "ud_english_ewt" / "en_ewt-ud-dev.conllu").read_text().split("\n\n")[:4]
    gold.write_text("\n\n".join(sentences) + "\n\n")
    result = api.roles(str(tiny_hf), parser="conllu", conllu=str(gold), n=4, max_length=32, roles="local,nsubj",
                       figures="none", cache_dir=str(tmp_path / "cache"))  # fmt: skip
    assert result.info["config"]["parser"] == "conllu"
    assert list(result.info["data_files"]) == ["ud"]
