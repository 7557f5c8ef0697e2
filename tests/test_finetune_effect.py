"""The effect of fine-tuning: Fig. 6's per-group changes and Kovaleva's per-head attention cosine
against slow references and against `analysis.roles`, an unchanged model as the null case, and the
one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.spatial import distance
from test_track import write_checkpoint
from transformers import BertTokenizerFast

import bertjax
from analysis import finetune_effect as effect
from analysis import roles as roles_cli
from analysis.heads import finetuning
from bertjax.errors import UserError


def _tokenizer(shared_data: Path) -> BertTokenizerFast:
    return BertTokenizerFast(vocab=str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def pre_ckpt(tmp_path_factory, shared_data) -> Path:
    directory = tmp_path_factory.mktemp("pre")
    bertjax.save_pretrained(bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128), seed=1), directory)
    _tokenizer(shared_data).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def post_run(tmp_path_factory, shared_data) -> Path:
    """A fine-tuning run's layout: an orbax BertForSequenceClassification step and the tokenizer."""
    workdir = tmp_path_factory.mktemp("post") / "tiny-mrpc"
    _tokenizer(shared_data).save_pretrained(workdir / "tokenizer")
    write_checkpoint(workdir, 40, seed=2, cls=bertjax.BertForSequenceClassification)
    return workdir


@pytest.fixture(scope="module")
def flags(shared_data, tmp_path_factory) -> list[str]:
    return ["--glue-dir", str(shared_data / "glue"), "--n", "12", "--batch-size", "8", "--max-length", "32",
            "--cache-dir", str(tmp_path_factory.mktemp("parses"))]  # fmt: skip


@pytest.fixture(scope="module")
def compared(pre_ckpt, post_run, flags, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("outputs") / "effect"
    # the pre checkpoint against itself (the null case) on MRPC, and a different model on both tasks
    effect.main(["--pre", str(pre_ckpt), "--post", f"{pre_ckpt}:mrpc", "--post", str(post_run),
                 "--task", "mrpc,sst2", "--out", str(out), "--figure-format", "png,svg", *flags])  # fmt: skip
    return out


def test_an_unchanged_model_shows_no_change(compared, pre_ckpt):
    changes = pd.read_csv(compared / "beta_change.csv")
    same = changes[changes["post_ckpt"] == pre_ckpt.name]
    assert set(same["task"]) == {"mrpc"} and (same["change"] == 0).all()
    similarity = pd.read_csv(compared / "attention_similarity.csv")
    same = similarity[similarity["post_ckpt"] == pre_ckpt.name]
    assert len(same) == 2 * 2 and (same["n"] == 12).all()
    # a·a / √(a·a · a·a): the same float32 sum three times, so only the product and root round (~3u).
    np.testing.assert_allclose(same["cosine"], 1.0, rtol=1e-6)


def test_changes_equal_the_roles_tables_of_pre_and_post(compared, pre_ckpt, post_run, flags, tmp_path):
    """Δ of a bar in a layer group = mean of roles.csv's `mean` over the group's heads and the bar's
    fine roles, post minus pre, each from its own `analysis.roles` run."""
    means = {}
    for name, ckpt in (("pre", pre_ckpt), ("post", post_run)):
        roles_cli.main(
            ["--ckpt", str(ckpt), "--task", "mrpc,sst2", "--out", str(tmp_path / name), "--no-figures", *flags]
        )
        means[name] = pd.read_csv(tmp_path / name / "roles.csv")
    changes = pd.read_csv(compared / "beta_change.csv")
    changes = changes[changes["post_ckpt"] == "tiny-mrpc"]
    members = {"local": ["local", "prev", "next"], "syntactic": ["nsubj", "dobj", "amod", "advmod", "syntactic"],
               "block": ["block"], "delimiter": ["cls", "sep", "delimiter"], "cls": ["cls"], "sep": ["sep"]}  # fmt: skip
    for task, bars in (("mrpc", list(members)), ("sst2", [b for b in members if b != "block"])):
        for group, layer in (("initial", 0), ("final", 1)):
            for bar in bars:
                expected = {}
                for name, table in means.items():
                    rows = table[(table.task == task) & (table.layer == layer) & table.role.isin(members[bar])]
                    expected[name] = rows["mean"].mean()
                row = changes[(changes.task == task) & (changes.group == group) & (changes.bar == bar)]
                assert len(row) == 1, (task, group, bar)
                # The same head means (CSV, 17 digits) averaged over ≤ 2·12 heads and roles in another
                # order; 1e-6 also admits one float32 rounding of the inputs (u ≈ 6e-8) per term.
                np.testing.assert_allclose(row["pre"].iloc[0], expected["pre"], rtol=1e-6)
                np.testing.assert_allclose(
                    row["change"].iloc[0], expected["post"] - expected["pre"], rtol=1e-5, atol=1e-6
                )
        assert set(changes.loc[changes.task == task, "bar"]) == set(bars)


def test_outputs_and_figures(compared, pre_ckpt):
    similarity = pd.read_csv(compared / "attention_similarity.csv")
    assert list(similarity.columns) == ["post_ckpt", "task", "layer", "head", "n", "cosine"]
    other = similarity[similarity["post_ckpt"] == "tiny-mrpc"]
    assert set(other["task"]) == {"mrpc", "sst2"} and ((other["cosine"] > 0) & (other["cosine"] < 1)).all()
    head_means = pd.read_csv(compared / "head_means.csv")
    assert {"post_ckpt", "task", "layer", "head", "role", "n", "pre", "post", "change"} <= set(head_means.columns)
    run = json.loads((compared / "run.json").read_text())
    assert run["layer_groups"] == {"initial": [0], "final": [1]} and run["posts"]["tiny-mrpc"]["step"] == 40
    names = {p.name for p in compared.iterdir()}
    assert {"beta_change.png", "beta_change.svg", "attention_similarity.png", "attention_similarity.svg"} <= names


def test_attention_cosine_matches_scipy():
    rng = np.random.default_rng(0)
    n_layers, batch, n_heads, length = 2, 3, 4, 9
    lengths = [9, 5, 2]
    real = np.arange(length)[None, :] < np.array(lengths)[:, None]
    pre, post = (rng.random((n_layers, batch, n_heads, length, length)).astype(np.float32) for _ in range(2))
    got = np.asarray(finetuning.attention_cosine(pre, post, real))
    for layer in range(n_layers):
        for b, n in enumerate(lengths):
            for h in range(n_heads):
                a, c = pre[layer, b, h, :n, :n].ravel(), post[layer, b, h, :n, :n].ravel()
                # float32 against SciPy's float64: three sums of n² ≤ 81 products, a product, a root and
                # a division, (3·81 + 3)·u ≈ 1.5e-5 at worst; cells of padding counted in are O(0.1) off.
                bound = (3 * 81 + 3) * 2.0**-24
                np.testing.assert_allclose(got[layer, b, h], 1 - distance.cosine(a, c), rtol=bound)
                if n < length:  # planted bug: the padded cells in the cosine
                    whole = 1 - distance.cosine(pre[layer, b, h].ravel(), post[layer, b, h].ravel())
                    assert not np.isclose(got[layer, b, h], whole, rtol=bound)


def test_group_means_average_heads_and_fine_roles():
    rng = np.random.default_rng(1)
    head_means = {
        r: rng.random((12, 4)) for r in ("local", "prev", "next", "cls", "sep", "delimiter", "nsubj", "syntactic")
    }
    head_means["advmod"] = np.full((12, 4), np.nan)  # no sequence scored it: not part of its bar
    table = finetuning.group_means(head_means, 12).set_index(["group", "bar"])["mean"]
    members = {"local": ["local", "prev", "next"], "syntactic": ["nsubj", "syntactic"],
               "delimiter": ["cls", "sep", "delimiter"], "cls": ["cls"], "sep": ["sep"]}  # fmt: skip
    for group, layers in (("initial", range(4)), ("middle", range(4, 8)), ("final", range(8, 12))):
        for bar, roles in members.items():
            values = [head_means[r][layer, head] for r in roles for layer in layers for head in range(4)]
            # float64 means of ≤ 48 terms in another order: ≤ 48·2⁻⁵³ ≈ 5e-15.
            np.testing.assert_allclose(table[(group, bar)], sum(values) / len(values), rtol=1e-12)
    assert "block" not in set(table.index.get_level_values("bar"))


def test_the_printed_cosines_are_a_table_by_layer():
    """Issue 52: the cosine summary was printed as a Python dict (`{0: 0.998, 1: 0.998}`)."""
    changes = pd.DataFrame({"post_ckpt": "ft", "task": "mrpc", "bar": "local", "group": ["initial", "final"],
                            "change": [-0.01, 0.02]})  # fmt: skip
    similarity = pd.DataFrame({"post_ckpt": "ft", "task": "mrpc", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                               "cosine": [1.0, 0.99, 0.5, 0.7]})  # fmt: skip
    lines = finetuning.format_changes(changes, similarity).splitlines()
    assert lines[-3:] == [
        "attention cosine similarity (pre vs post), mean over each layer's heads:",
        "layer       0    1",
        "cosine  0.995  0.6",
    ]


def test_post_specs_and_labels(tmp_path):
    assert finetuning.parse_post("runs/a:mrpc", ("sst2",)) == ("runs/a", ("mrpc",))
    assert finetuning.parse_post("runs/a", ("mrpc", "sst2")) == ("runs/a", ("mrpc", "sst2"))
    colon = tmp_path / "a:b"  # a ':' inside an existing path is part of the path
    colon.mkdir()
    assert finetuning.parse_post(str(colon), ("sst2",)) == (str(colon), ("sst2",))
    with pytest.raises(UserError) as error:
        finetuning.parse_post("runs/a:badtask", ("sst2",))
    assert str(error.value) == (
        "--post runs/a:badtask: 'badtask' after the last ':' is not a task (choose from qnli, qqp, mrpc, sst2, all, "
        "or a comma-separated list) and runs/a:badtask is not an existing path"
    )
    assert finetuning.post_labels(["runs/x", "other/x", "runs/y/checkpoints/7"]) == ["x#1", "x#2", "y@7"]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("other_shape", "have different shapes (num_hidden_layers 2 vs 3)"),
        ("other_positions", "have different shapes (max_position_embeddings 128 vs 16)"),
        ("no_checkpoints", "no bertjax checkpoints found"),
        ("missing_post", "no such checkpoint directory"),
    ],
)
def test_bad_input_gives_one_line(case, expected, pre_ckpt, shared_data, tmp_path, cli_error):
    post = {"no_checkpoints": tmp_path, "missing_post": tmp_path / "nowhere"}.get(case)
    if case == "other_shape":
        post = tmp_path / "deeper"
        bertjax.save_pretrained(
            bertjax.init_model(bertjax.preset("tiny", num_hidden_layers=3, max_position_embeddings=128)), post
        )
    elif case == "other_positions":
        post = tmp_path / "shorter"
        bertjax.save_pretrained(bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=16)), post)
    argv = ["--pre", str(pre_ckpt), "--post", str(post), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"),
            "--out", str(tmp_path / "out")]  # fmt: skip
    message = cli_error(effect.main, argv)
    assert message.startswith("error: ") and expected in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags", [["--parser", "conllu", "--conllu", "gold.conllu"], ["--conllu", "gold.conllu"]])
def test_conllu_trees_are_refused(flags, cli_error):
    """The data flags are shared with analysis.roles, but gold trees would be silently unused here."""
    message = cli_error(effect.main, ["--pre", "a", "--post", "b:mrpc", *flags])
    assert message.startswith("error: --parser conllu / --conllu: finetune_effect compares on GLUE tasks")


def test_max_length_is_cut_to_the_checkpoints_positions(shared_data, flags, tmp_path):
    """Sequences are encoded before any model loads; --max-length 32 on 16-position checkpoints
    must be cut to 16 (and recorded), not fail on the first batch."""
    pre = tmp_path / "short"
    bertjax.save_pretrained(bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=16), seed=1), pre)
    _tokenizer(shared_data).save_pretrained(pre)
    out = tmp_path / "effect"
    effect.main(["--pre", str(pre), "--post", f"{pre}:mrpc", "--out", str(out), "--no-figures", *flags])
    assert json.loads((out / "run.json").read_text())["config"]["data"]["max_length"] == 16
    assert (pd.read_csv(out / "attention_similarity.csv")["cosine"] > 0.9999).all()
