"""Reliability round four (issue 52): numbers that come back non-finite from finite weights, and
one output discipline for every file a command writes.

Finite weights can overflow float32 in the forward pass (value weights of 3e38 made half the heads'
β NaN: `unskilled 100.0%`, 24 of 48 rows empty, no warning); every analysis now stops with one
line naming the layer and head. A head whose value weights are 0 (a pruned head) is a legitimate
model whose norm-weighted attention is undefined (0/0): it is named in a warning and left empty,
never written as 0.0 nor counted."""

from __future__ import annotations

import errno
import re

import numpy as np
import pandas as pd
import pytest

from bertjax import runinfo
from bertjax.errors import UserError

OVERFLOW = re.compile(
    r"error: mrpc β, example \d+: β of layer (\d) head (\d) is (nan|inf), from finite weights: the forward pass "
    r"overflows float32 \(a weight too large for its products\); the checkpoint is not usable as it is"
)


def _tiny(directory, shared_data, change, cls="BertModel"):
    """A random tiny BERT as `tiny_hf`'s (of `cls`), with `change(model)` applied to its weights."""
    from transformers import BertTokenizerFast

    import bertjax

    model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128), cls, seed=1)
    change(model)
    bertjax.save_pretrained(model, directory)
    vocab = shared_data / "vocab" / "bert-base-uncased-vocab.txt"
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(directory)
    return directory


def _overflowing_values(model) -> None:
    value = model.encoder.layer[0].attention.self.value
    value.kernel[...] = value.kernel[...] * 0 + 3e38  # finite, and past float32 once summed


def _pruned_values(model) -> None:
    for layer in model.encoder.layer:
        value = layer.attention.self.value
        value.kernel[...], value.bias[...] = value.kernel[...] * 0, value.bias[...] * 0


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory, shared_data):
    return _tiny(tmp_path_factory.mktemp("overflow"), shared_data, _overflowing_values)


@pytest.fixture(scope="module")
def pruned(tmp_path_factory, shared_data):
    return _tiny(tmp_path_factory.mktemp("pruned"), shared_data, _pruned_values)


def _roles_argv(ckpt, shared_data, out, *extra: str) -> list[str]:
    return ["--ckpt", str(ckpt), "--task", "mrpc", "--roles", "local,cls", "--glue-dir", str(shared_data / "glue"),
            "--n", "8", "--batch-size", "8", "--no-figures", "--out", str(out), *extra]  # fmt: skip


@pytest.mark.parametrize("attention", ["weights", "norms", "both"])
def test_weights_that_overflow_in_the_forward_pass_stop_the_run_naming_the_head(
    attention, overflowing, shared_data, tmp_path, cli_error
):
    """Before: exit 0, half the heads NaN, `unskilled 100.0%`; `both` printed `0 / 0 / 0`."""
    from analysis import roles

    out = tmp_path / "out"
    message = cli_error(roles.main, _roles_argv(overflowing, shared_data, out, "--attention", attention))
    assert OVERFLOW.fullmatch(message), message
    assert not out.exists()


def test_a_pruned_head_under_norms_is_named_untested_and_never_counted(pruned, shared_data, tmp_path, capsys, caplog):
    """Before: every β NaN and `not tested`, no warning, and `--attention both` printed the norms'
    counts as `0 / 0 / 0`."""
    from analysis import roles

    out = tmp_path / "out"
    roles.main(_roles_argv(pruned, shared_data, out, "--attention", "both"))
    warned = {r.getMessage() for r in caplog.records if "is undefined" in r.getMessage()}
    assert warned == {
        "mrpc β: the norm-weighted attention of layer 0 head 0, layer 0 head 1, layer 1 head 0, layer 1 head 1 is "
        "undefined (the head passes nothing on: its value vectors are 0 on every token, as a pruned head's); their "
        "scores are left empty, not tested"
    }
    printed = capsys.readouterr().out
    assert "mrpc: local 0 / untested / untested; cls 0 / untested / untested" in printed
    norms = pd.read_csv(out / "roles_norms.csv")
    assert norms["mean"].isna().all() and norms["p_value"].isna().all() and not norms["assigned"].any()


def test_clark_surface_of_a_pruned_head_is_empty_not_zero(pruned, shared_data, tmp_path, caplog):
    """Before: entropy 0.0 and every share 0.0 for every head."""
    from analysis import clark

    out = tmp_path / "clark"
    clark.main(["--ckpt", str(pruned), "--out", str(out), "--data-dir", str(shared_data), "--n", "8",
                "--cluster-n", "8", "--analyses", "surface,cluster", "--attention", "norms"])  # fmt: skip
    surface = pd.read_csv(out / "surface.csv")
    attention_stats = ["cls", "sep", "punct", "self", "prev", "next", "entropy", "entropy_cls"]
    assert surface[attention_stats].isna().all().all()
    assert (surface["uniform_entropy"] > 0).all()  # not the attention's: defined
    assert pd.read_csv(out / "head_mds.csv")[["x", "y"]].isna().all().all()
    assert any("surface: the norm-weighted attention of layer 0 head 0" in r.getMessage() for r in caplog.records)


def test_clark_on_weights_that_overflow_stops_naming_the_head(overflowing, shared_data, tmp_path, cli_error):
    from analysis import clark

    out = tmp_path / "clark"
    message = cli_error(clark.main, ["--ckpt", str(overflowing), "--out", str(out), "--data-dir", str(shared_data),
                                     "--n", "8", "--analyses", "surface"])  # fmt: skip
    assert re.fullmatch(
        r"error: surface: a surface statistic of layer 1 head \d is nan, from finite weights: .*", message
    )
    assert not out.exists()


def test_head_view_refuses_a_model_with_a_nan_weight_as_roles_does(tiny_hf):
    """Before: the view was drawn, NaN cast to 0, where `api.roles` refused the same model."""
    import bertjax
    from analysis import api

    model, tokenizer = bertjax.from_pretrained(tiny_hf), bertjax.load_tokenizer(tiny_hf)
    kernel = model.encoder.layer[1].attention.self.query.kernel
    kernel[...] = kernel[...].at[0, 0].set(np.nan)
    with pytest.raises(UserError, match=r"^model \(passed in\): tensor encoder.layer.1.attention.self.query.weight holds 1 non-finite"):  # fmt: skip
        api.head_view(model, "The cat sat on the mat.", layer=0, head=0, tokenizer=tokenizer)


def test_head_view_on_weights_that_overflow_stops_naming_the_head(overflowing):
    import bertjax
    from analysis import api

    model, tokenizer = bertjax.from_pretrained(overflowing), bertjax.load_tokenizer(overflowing)
    with pytest.raises(UserError, match=r"^head_view: the attention of layer 1 head \d is nan, from finite weights"):
        api.head_view(model, "The cat sat on the mat.", layer=1, head=0, tokenizer=tokenizer)


@pytest.mark.parametrize(
    ("theirs", "ours"), [("track output", "roles"), ("roles output", "clark"), ("analysis output", "roles")]
)
def test_overwrite_replaces_only_an_output_of_the_same_kind(theirs, ours, tiny_hf, shared_data, tmp_path, cli_error):
    """Before: a roles run's --overwrite replaced a track output, and clark's a roles output."""
    from analysis import clark, roles

    out = tmp_path / "out"
    out.mkdir()
    (out / runinfo.OUTPUT_MARKER).write_text(theirs + "\n")
    (out / "track.csv").write_text("theirs\n")
    if ours == "roles":
        message = cli_error(roles.main, _roles_argv(tiny_hf, shared_data, out, "--overwrite"))
    else:
        message = cli_error(clark.main, ["--ckpt", str(tiny_hf), "--out", str(out), "--data-dir", str(shared_data),
                                         "--n", "8", "--analyses", "surface", "--overwrite"])  # fmt: skip
    if theirs == runinfo.ANALYSIS_OUTPUT:
        assert message == (
            f"error: --out {out} is an analysis output of an earlier bertjax, which did not record which tool made "
            f"it; --overwrite replaces only an earlier {ours} output (remove it yourself, or choose another --out)"
        )
    else:
        assert message == (
            f"error: --out {out} holds another kind of output ({theirs}), not an earlier {ours} output; --overwrite "
            "replaces only an output of the same kind (choose another --out)"
        )
    assert sorted(p.name for p in out.iterdir()) == [runinfo.OUTPUT_MARKER, "track.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_each_analysis_marks_its_output_with_its_own_kind(tiny_hf, shared_data, tmp_path):
    from analysis import roles

    roles.main(_roles_argv(tiny_hf, shared_data, tmp_path / "out"))
    assert (tmp_path / "out" / runinfo.OUTPUT_MARKER).read_text() == "roles output\n"
    roles.main(_roles_argv(tiny_hf, shared_data, tmp_path / "out", "--overwrite"))  # its own kind: replaced


def test_a_full_disk_in_the_scores_cache_names_the_cache_entry(tmp_path, monkeypatch):
    """Before: `no space left writing the output (...); --out OUT was not written`."""
    from analysis.heads import tracking

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    entry = tmp_path / "cache" / "step-000000001-0123456789abcdef.npz"
    entry.parent.mkdir()
    with pytest.raises(UserError) as error:
        tracking.save_scores(entry, {}, {}, {"step": 1})
    assert str(error.value) == (
        f"no space left writing the scores cache entry {entry} (No space left on device); make room there"
    )
    assert list(entry.parent.iterdir()) == []


def test_a_report_page_written_into_a_run_holds_that_runs_lock(tiny_hf, shared_data, tmp_path):
    """The page is one more file of the output: it is not written while a run writes that `--out`."""
    from analysis import roles
    from analysis.heads.config import ReportConfig
    from analysis.heads.report import write_report

    out = tmp_path / "out"
    roles.main(_roles_argv(tiny_hf, shared_data, out))
    with runinfo.exclusive(out), pytest.raises(UserError, match=r"^run directory .* is being written by another run"):
        write_report(ReportConfig(str(out)))
    assert not (out / "report.html").exists()
    assert write_report(ReportConfig(str(out))) == out / "report.html"


# -- every other reading of a model that overflows (issue 52, class 2) ---------------------------

# The end of every refusal of an overflow (`finite.check_finite`).
FROM_FINITE = (r"is (nan|inf), from finite weights: the forward pass overflows float32 \(a weight too large for "
               r"its products\); the checkpoint is not usable as it is")  # fmt: skip


def _clark_argv(ckpt, shared_data, out, analyses: str) -> list[str]:
    return ["--ckpt", str(ckpt), "--out", str(out), "--data-dir", str(shared_data), "--analyses", analyses,
            "--n", "8", "--batch-size", "8", "--max-length", "64", "--probe-epochs", "1"]  # fmt: skip


@pytest.mark.parametrize("analyses", ["depheads", "probes"])
def test_clark_word_attention_on_weights_that_overflow_stops_naming_the_head(
    analyses, overflowing, shared_data, tmp_path, cli_error
):
    """Before: exit 0; NaN attention counted as arcs no head found (dependency heads) and fed to
    the probes as features (a UAS from NaN weights)."""
    from analysis import clark

    out = tmp_path / "clark"
    message = cli_error(clark.main, _clark_argv(overflowing, shared_data, out, analyses))
    assert re.fullmatch(rf"error: EWT dev, sentence \d+: the word-level attention of layer 1 head \d {FROM_FINITE}",
                        message), message  # fmt: skip
    assert not out.exists()


def test_clark_coref_on_weights_that_overflow_stops_naming_the_head(overflowing, shared_data, tmp_path, cli_error):
    """Before: exit 0; a NaN attention to both candidates chose neither, counted as wrong."""
    from analysis import clark

    out = tmp_path / "clark"
    message = cli_error(clark.main, _clark_argv(overflowing, shared_data, out, "coref"))
    assert re.fullmatch(
        rf"error: GAP dev, example development-\d+: the attention from the pronoun to a candidate of layer 1 head \d "
        rf"{FROM_FINITE}",
        message,
    ), message
    assert not out.exists()


def _overflowing_pretraining_values(model) -> None:
    _overflowing_values(model.bert)


@pytest.fixture(scope="module")
def overflowing_pretraining(tmp_path_factory, shared_data):
    return _tiny(tmp_path_factory.mktemp("overflow_mlm"), shared_data, _overflowing_pretraining_values,
                 cls="BertForPreTraining")  # fmt: skip


def test_clark_gradients_on_weights_that_overflow_stop_naming_the_head(
    overflowing_pretraining, shared_data, tmp_path, cli_error
):
    """Before: exit 0 with NaN in every row of gradient_importance.csv."""
    from analysis import clark

    out = tmp_path / "clark"
    message = cli_error(clark.main, _clark_argv(overflowing_pretraining, shared_data, out, "gradients"))
    assert re.fullmatch(
        rf"error: attention gradients: the sum of \|∂ MLM loss / ∂ attention\| of layer \d head \d {FROM_FINITE}",
        message,
    ), message
    assert not out.exists()


def test_sas_of_weights_that_overflow_stops_naming_the_head(overflowing, shared_data):
    """`analysis.track --sas` reads SAS through `score_sas`. Before: NaN attention counted as
    arcs no head found, a SAS curve of zeros."""
    import bertjax
    from analysis.attention import sas
    from sieves.align import encode_batch
    from sieves.parse import read_conllu

    model, tokenizer = bertjax.from_pretrained(overflowing), bertjax.load_tokenizer(overflowing)
    sentences = read_conllu(shared_data / "ud_english_ewt" / "en_ewt-ud-dev.conllu", limit=4)
    seqs = encode_batch(tokenizer, [(text,) for text, _ in sentences], [(words,) for _, words in sentences], 64)
    with pytest.raises(UserError) as error:
        sas.score_sas(model, seqs, 4, 64)
    assert re.fullmatch(
        rf"SAS, sentence \d: the word-level attention of layer 1 head \d {FROM_FINITE}", str(error.value)
    )
    sas.score_sas(model, seqs, 4, 64, allowed=True)  # --allow-nonfinite: the load said so; nothing refused


def _step_examples(ckpt, attention: str):
    """What a track records of one step for its report's slider (`report.step_examples`), on `ckpt`."""
    import bertjax
    from analysis.api import roles_config
    from analysis.heads.report import step_examples
    from sieves.align import encode_batch

    model, tokenizer = bertjax.from_pretrained(ckpt), bertjax.load_tokenizer(ckpt)
    config = roles_config(str(ckpt), {"roles": "local,prev,cls", "attention": attention})
    seqs = encode_batch(tokenizer, [("The cat sat on the mat.", "It was warm.")], None, 64)
    return step_examples(model, tokenizer, {"mrpc": seqs}, config)


def test_example_attention_of_weights_that_overflow_stops_naming_the_head(overflowing):
    """Before: the report's example attention (and a track's per-step record of it) was drawn with
    NaN cast to 0 by its byte quantisation; an overflowing model reached it whenever its β
    reading was allowed (`--allow-nonfinite`) or taken from another run."""
    with pytest.raises(UserError, match=r"^mrpc, example attention: the attention of layer 1 head \d is nan, from finite"):  # fmt: skip
        _step_examples(overflowing, "weights")


def test_example_attention_of_a_pruned_head_under_norms_is_drawn_empty(pruned):
    """A pruned head's norm-weighted attention is undefined, not a broken model: the example is
    recorded (that head drawn empty) and its β left empty, as roles.csv leaves its row."""
    import base64

    recorded = _step_examples(pruned, "norms")["mrpc"]["sequence"]
    drawn = np.frombuffer(base64.b64decode(recorded["attention"]["model"]), np.uint8)
    assert drawn.size and not drawn.any()
    assert all(beta is None or all(b is None for b in beta) for beta in recorded["beta"]["model"].values())
