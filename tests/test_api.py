"""`analysis.api`: a call gives what its CLI writes (tables byte for byte, scores to float rounding),
takes the flags' names and defaults, raises the CLI's one-line errors, reuses its compiled functions
across calls without growing memory, and `head_view`'s β is the roles run's for that sequence."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest

import bertjax
from analysis import ablate as ablate_cli
from analysis import api, report, track
from analysis import clark as clark_cli
from analysis import finetune_effect as effect_cli
from analysis import prune as prune_cli
from analysis import roles as roles_cli
from analysis.api import ablation as api_ablation
from analysis.api import attention as api_attention
from analysis.api import common as api_common
from analysis.heads import config as heads_config
from analysis.heads import finetuning
from bertjax.errors import UserError


def _settings(shared_data: Path, cache: Path) -> dict:
    # Length 32 and 12 examples: one padded shape, one compile, and two batches of 8 (the second padded).
    return dict(task="mrpc", glue_dir=str(shared_data / "glue"), n=12, batch_size=8, max_length=32,
                cache_dir=str(cache), figures="none")  # fmt: skip


def _flags(settings: dict) -> list[str]:
    flags = []
    for name, value in settings.items():
        flags += ["--no-figures"] if name == "figures" else [f"--{name.replace('_', '-')}", str(value)]
    return flags


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("api")


@pytest.fixture(scope="module")
def second_hf(work, tiny_hf) -> Path:
    """Another tiny checkpoint with tiny_hf's tokenizer (seed 2), for a series of two."""
    directory = work / "tiny_hf_2"
    bertjax.save_pretrained(bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128), seed=2), directory)
    bertjax.load_tokenizer(tiny_hf).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def roles_pair(work, tiny_hf, shared_data):
    """(the CLI's output directory, the call's result) on the same settings."""
    settings = _settings(shared_data, work / "parses")
    roles_cli.main(["--ckpt", str(tiny_hf), "--out", str(work / "cli"), *_flags(settings)])
    return work / "cli", api.roles(str(tiny_hf), **settings)


def test_the_call_gives_the_clis_tables_and_scores(roles_pair):
    cli_out, result = roles_pair
    assert result.table.to_csv(index=False).encode() == (cli_out / "roles.csv").read_bytes()
    assert result.summary.equals(pd.read_csv(cli_out / "summary.csv"))
    with np.load(cli_out / "scores.npz") as stored:
        keys = {f"{t}/{r}" for t, roles in result.scores.items() for r in roles}
        assert keys | {f"{k}/index" for k in keys} == set(stored.files)
        for key in keys:
            task, role = key.split("/")
            # One process, one compiled function, the same batches: the same float32 sums, so the
            # same bits; a tolerance would only hide a different computation.
            np.testing.assert_array_equal(result.scores[task][role], stored[key])
            np.testing.assert_array_equal(result.indices[task][role], stored[f"{key}/index"])
    cli_config = json.loads((cli_out / "run.json").read_text())["config"]
    assert {**result.info["config"], "out": None} == {**cli_config, "out": None}
    assert result.settings.max_length == cli_config["max_length"]


def test_save_writes_the_outputs_as_out_would(roles_pair, tmp_path):
    _, result = roles_pair
    saved = result.save(tmp_path / "saved")
    for name in ("roles.csv", "summary.csv", "scores.npz"):
        assert (saved / name).read_bytes() == (result.directory / name).read_bytes()
    with pytest.raises(UserError, match="is not empty; pass --overwrite"):
        result.save(tmp_path / "saved")
    assert result.save(tmp_path / "saved", overwrite=True) == saved


def test_the_result_renders_the_reports_grid_and_cards_inline(roles_pair):
    _, result = roles_pair
    page = result._repr_html_()
    assert page.startswith('<iframe class="bertjax-report" srcdoc="&lt;!DOCTYPE html&gt;')
    # Offline: nothing is fetched (no src or href attribute in the page; the SVG namespace is a name).
    assert "id=&quot;report-data&quot;" in page and "src=" not in page.split("srcdoc=", 1)[1] and "href=" not in page
    (figure,) = result.figure("role_grid")
    assert figure.path.name == "mrpc_role_grid.png" and figure._repr_png_()[:4] == b"\x89PNG"


def test_the_keywords_default_as_the_flags(tiny_hf):
    assert api.roles_config("ckpt", {"out": "roles_out"}) == roles_cli.parse_args(["--ckpt", "ckpt"])
    given = {"roles": "local,cls", "tau": 2.5, "special_rows": False, "n": 7}
    assert api.roles_config("ckpt", given | {"out": "roles_out"}) == roles_cli.parse_args(
        ["--ckpt", "ckpt", "--roles", "local,cls", "--tau", "2.5", "--no-special-rows", "--n", "7"]
    )
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        api.roles_config("ckpt", {"max_len": 3})
    with pytest.raises(TypeError, match="block_score"):
        api.track(ckpt=[str(tiny_hf)], block_score="entropy")


@pytest.mark.parametrize(
    ("keywords", "flags"),
    [
        ({"n": 0}, ["--n", "0"]),
        # A τ that is no number is refused where it is parsed, by argparse or by the keyword's reading,
        # each naming its own spelling (tests/test_settings.py); one out of range, by the same line.
        ({"tau": -1}, ["--tau", "-1"]),
        ({"roles": "local,nope"}, ["--roles", "local,nope"]),
        ({"alpha": 2.0}, ["--alpha", "2"]),
        ({"window": 0}, ["--window", "0"]),
        ({"task": "mnli"}, ["--task", "mnli"]),
    ],
)
def test_errors_are_the_clis_lines(keywords, flags, tiny_hf, tmp_path, cli_error):
    line = cli_error(roles_cli.main, ["--ckpt", str(tiny_hf), "--out", str(tmp_path / "cli"), *flags])
    with pytest.raises(UserError) as raised:
        api.roles(str(tiny_hf), out=tmp_path / "api", **keywords)
    assert line == f"error: {' '.join(str(raised.value).split())}"
    assert not (tmp_path / "api").exists()


def test_a_choice_the_cli_parser_checks_is_one_line_too(tiny_hf):
    with pytest.raises(UserError, match=r"^--test must be one of t, z, bootstrap, got 'x'$"):
        api.roles(str(tiny_hf), test="x")
    with pytest.raises(UserError, match="one of the arguments --run --ckpt is required"):
        api.track()


def test_track_call_gives_the_clis_table(work, tiny_hf, second_hf, shared_data):
    settings = _settings(shared_data, work / "parses")
    series = [f"{tiny_hf}@0", f"{second_hf}@5"]
    out = work / "track-cli"
    track.main([*(a for s in series for a in ("--ckpt", s)), "--out", str(out), *_flags(settings)])
    result = api.track(ckpt=series, **settings)
    assert result.table.to_csv(index=False).encode() == (out / "track.csv").read_bytes()
    # The table as computed (not read back from the CSV): its rows give the file's bytes.
    assert result.onset.to_csv(index=False).encode() == (out / "onset.csv").read_bytes()
    assert sorted(result.scores) == [0, 5]
    first = result.scores[0]["mrpc"]["local"]
    assert first.shape == (12, 2, 2)  # 12 sequences, tiny: 2 layers × 2 heads
    assert result.table["step"].unique().tolist() == [0, 5]


def test_report_call_writes_the_clis_page(roles_pair, tmp_path):
    cli_out, _ = roles_pair
    report.main([str(cli_out), "--examples", "0", "--out", str(tmp_path / "cli.html")])
    page = api.report(cli_out, examples=0, out=tmp_path / "api.html")
    strip = lambda p: p.read_text().replace(str(tmp_path / "cli.html"), "").replace(str(tmp_path / "api.html"), "")
    assert strip(page.path) == strip(tmp_path / "cli.html")
    assert "srcdoc" in page._repr_html_()


def test_head_view_beta_is_the_roles_runs(work, tiny_hf, shared_data):
    pair = ("The cat sat on the mat.", "A cat was sitting on the mat.")
    text = work / "pair.txt"
    text.write_text("\t".join(pair) + "\n")
    settings = _settings(shared_data, work / "parses") | {"task": f"text:{text}"}
    result = api.roles(str(tiny_hf), **settings)
    (task,) = result.scores
    view = api.head_view(str(tiny_hf), pair, layer=1, head=1, role="nsubj", cache_dir=settings["cache_dir"])
    assert view.data["open"] == {"layer": 1, "head": 1, "role": "nsubj"}
    (sequence,) = view.data["examples"]["your text"]["sequences"]
    checked = 0
    for role, scores in result.scores[task].items():
        if len(scores) == 0:  # the role has no row in this pair (no dobj in it)
            assert sequence["beta"]["model"][role] is None
            continue
        checked += 1
        # The same β kernel on the same attention, padded to 32 (the run) or to the sequence's own
        # length (the view): the padding adds exact zeros, so float32 sums agree to a few ulp of
        # the row sums (< 1e-6 relative for β of order 1..10).
        np.testing.assert_allclose(np.array(sequence["beta"]["model"][role]), scores[0].ravel(), rtol=1e-5)
    assert checked >= 9  # the positional, pair, delimiter roles and nsubj at least
    page = view._repr_html_()
    assert page.startswith("<iframe") and "&quot;open&quot;" in page


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"layer": 2, "head": 0}, r"layer 2, head 0 is not a head of this model \(2 layers × 2 heads\)"),
        ({"layer": 0, "head": 0, "role": "block"}, "role 'block' is not defined for this input"),
        ({"layer": 0, "head": 0, "role": "nope"}, "unknown role"),
    ],
)
def test_head_view_errors_are_one_line(keywords, message, tiny_hf):
    with pytest.raises(UserError, match=message):
        api.head_view(str(tiny_hf), "One sentence here.", **keywords)
    with pytest.raises(UserError, match="a loaded model needs its tokenizer"):
        api.head_view(bertjax.from_pretrained(tiny_hf), "One sentence.", layer=0, head=0)


REPEATED = r"""
import json, resource, sys
import jax
from analysis import api

compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
)
ckpt, glue, cache = sys.argv[1:4]
calls = []
for _ in range(3):
    before = len(compiles)
    result = api.roles(ckpt, task="mrpc", glue_dir=glue, n=24, batch_size=8, max_length=64, cache_dir=cache, figures="none")
    del result
    calls.append({"compiles": len(compiles) - before, "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
print(json.dumps(calls))
"""


def test_repeated_calls_compile_nothing_new_and_keep_memory(minilm_path, shared_data, tmp_path):
    # A fresh process: its peak RSS is this job's alone, and no earlier test has compiled anything.
    done = subprocess.run(
        [sys.executable, "-c", REPEATED, str(minilm_path), str(shared_data / "glue"), str(tmp_path / "parses")],
        capture_output=True, text=True, timeout=600, check=False, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    first, second, third = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["compiles"] > 0
    assert second["compiles"] == third["compiles"] == 0
    assert third["peak_rss_kb"] <= 1.05 * first["peak_rss_kb"], (first, second, third)


REPEATED_TOOLS = r"""
import json, resource, sys
import jax
from analysis import api

compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
)
encoder, post, classifier, data, cache = sys.argv[1:6]
glue, small = f"{data}/glue", dict(n=8, batch_size=8, max_length=32)
calls = {
    "clark": lambda: api.clark(encoder, analyses="surface,depheads", inputs="mrpc", glue_dir=glue, data_dir=data,
                               ewt_n=8, **small),
    "ablate": lambda: api.ablate(classifier, task="mrpc", glue_dir=glue, analyses="patterns,disable", **small),
    "prune": lambda: api.prune(classifier, task="mrpc", glue_dir=glue, prune_step=0.5, random_seeds=1, **small),
    "finetune_effect": lambda: api.finetune_effect(encoder, f"{post}:mrpc", glue_dir=glue, cache_dir=cache,
                                                   figures="none", **small),
}
measured = {}
for name, call in calls.items():
    measured[name] = []
    for _ in range(3):
        before = len(compiles)
        result = call()
        del result
        measured[name].append({"compiles": len(compiles) - before,
                               "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
print(json.dumps(measured))
"""


@pytest.mark.slow  # ~32 s of CPU: every tool three times in a fresh process
def test_repeated_calls_of_every_tool_compile_nothing_new_and_keep_memory(
    tiny_hf, second_hf, tiny_classifier, shared_data, ud_english_ewt, tmp_path
):
    # One fresh process for the four tools (one start-up, one import of jax), each called three
    # times in turn; the peak RSS is the process's so far, so each tool is held to its first call's.
    done = subprocess.run(
        [sys.executable, "-c", REPEATED_TOOLS, str(tiny_hf), str(second_hf), str(tiny_classifier), str(shared_data),
         str(tmp_path / "parses")],
        capture_output=True, text=True, timeout=600, check=False, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(measured) == ["ablate", "clark", "finetune_effect", "prune"]
    for name, (first, second, third) in measured.items():
        assert first["compiles"] > 0, name
        assert second["compiles"] == third["compiles"] == 0, (name, first, second, third)
        assert third["peak_rss_kb"] <= 1.05 * first["peak_rss_kb"], (name, first, second, third)


def test_roles_loads_as_allow_nonfinite_says_and_keeps_the_two_loads_apart(tiny_hf, shared_data, tmp_path, caplog):
    from safetensors.numpy import load_file, save_file

    directory = tmp_path / "nan"
    shutil.copytree(tiny_hf, directory)
    tensors = load_file(directory / "model.safetensors")
    tensors["encoder.layer.1.attention.self.query.weight"][0, 0] = float("nan")
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    settings = dict(task="mrpc", roles="local,cls", glue_dir=str(shared_data / "glue"), n=4, batch_size=4,
                    figures="none")  # fmt: skip
    with pytest.raises(UserError, match="holds 1 non-finite value"):
        api.roles(str(directory), **settings)
    result = api.roles(str(directory), allow_nonfinite=True, **settings)
    assert "analysed anyway (--allow-nonfinite)" in caplog.text
    assert result.info["config"]["allow_nonfinite"] is True
    # The model kept from the call that allowed NaN weights is not one a refusing call may use.
    with pytest.raises(UserError, match="holds 1 non-finite value"):
        api.roles(str(directory), **settings)


def test_results_are_dataclasses_with_the_run_settings(roles_pair):
    _, result = roles_pair
    assert dataclasses.is_dataclass(result) and result.settings.n == 12
    assert result.info["config"]["ckpt"] == result.settings.ckpt


# -- clark, ablate, prune, finetune_effect ------------------------------------------------------


def _same_tables(result, cli_out: Path) -> None:
    """Every CSV the CLI wrote is a table of the result, its rows giving the file's bytes back."""
    assert sorted(result.tables) == sorted(p.stem for p in cli_out.glob("*.csv"))
    for name, table in result.tables.items():
        assert table.to_csv(index=False).encode() == (cli_out / f"{name}.csv").read_bytes(), name


def _refuse_loading(monkeypatch, module, *names: str) -> None:
    """A passed-in model must be used: loading the checkpoint again fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"{module.__name__} loaded {args[0]} although a model was passed")

    for name in names:
        monkeypatch.setattr(module, name, refuse)


@pytest.fixture(scope="module")
def tiny_classifier(work, tiny_hf) -> Path:
    """A random tiny BertForSequenceClassification (2 labels, as MRPC) with tiny_hf's tokenizer."""
    directory = work / "tiny_classifier"
    config = bertjax.preset("tiny", max_position_embeddings=128)
    bertjax.save_pretrained(bertjax.init_model(config, "BertForSequenceClassification", seed=3), directory)
    bertjax.load_tokenizer(tiny_hf).save_pretrained(directory)
    return directory


def test_clark_call_gives_the_clis_tables_with_the_model_passed(work, tiny_hf, shared_data, monkeypatch):
    settings = dict(analyses="surface,cluster", task="mrpc", glue_dir=str(shared_data / "glue"), n=8,
                    cluster_n=8, batch_size=8, max_length=32)  # fmt: skip
    cli_out = work / "clark-cli"
    clark_cli.main(["--ckpt", str(tiny_hf), "--out", str(cli_out), *_flags(settings)])
    model, tokenizer = bertjax.from_pretrained(tiny_hf), bertjax.load_tokenizer(tiny_hf)
    _refuse_loading(monkeypatch, api_common, "from_pretrained", "load_tokenizer")
    _refuse_loading(monkeypatch, api_attention, "load_tokenizer")
    result = api.clark(str(tiny_hf), model=model, tokenizer=tokenizer, **settings)
    _same_tables(result, cli_out)
    assert {"surface", "head_js_divergence", "head_mds"} <= set(result.tables)
    assert {**result.info["config"], "out": None} == {
        **json.loads((cli_out / "run.json").read_text())["config"],
        "out": None,
    }
    assert result.settings.analyses == ("surface", "cluster") and result.settings.analyses_explicit
    (figure,) = result.figure("head_mds")
    assert figure._repr_png_()[:4] == b"\x89PNG"
    page = result._repr_html_()
    assert "data:image/png;base64," in page and "surface.csv" in page and "http" not in page
    with pytest.raises(UserError, match="no figure 'nope' in this run"):
        result.figure("nope")
    # The gradients need the MLM head: a checkpoint that has one passed in as a BertModel is one
    # clear error, not a traceback.
    pretraining = work / "tiny_pretraining"
    bertjax.save_pretrained(bertjax.init_model(bertjax.preset("tiny"), "BertForPreTraining", seed=1), pretraining)
    tokenizer.save_pretrained(pretraining)
    with pytest.raises(UserError, match="loaded as BertForPreTraining"):
        api.clark(str(pretraining), model=bertjax.from_pretrained(pretraining), tokenizer=tokenizer,
                  **settings | {"analyses": "gradients"})  # fmt: skip


def test_ablate_call_gives_the_clis_tables_with_the_model_passed(work, tiny_classifier, shared_data, monkeypatch):
    settings = dict(task="mrpc", glue_dir=str(shared_data / "glue"), n=8, batch_size=8, max_length=32,
                    analyses="patterns,disable")  # fmt: skip
    cli_out = work / "ablate-cli"
    ablate_cli.main(["--ckpt", str(tiny_classifier), "--out", str(cli_out), *_flags(settings)])
    model = bertjax.from_pretrained(tiny_classifier, "BertForSequenceClassification")
    tokenizer = bertjax.load_tokenizer(tiny_classifier)
    _refuse_loading(monkeypatch, api_common, "from_pretrained", "load_tokenizer")
    _refuse_loading(monkeypatch, api_ablation, "load_tokenizer")
    result = api.ablate(str(tiny_classifier), model=model, tokenizer=tokenizer, **settings)
    _same_tables(result, cli_out)
    assert {"mrpc_patterns", "mrpc_disable_heads", "mrpc_disable_layers", "pattern_shares"} <= set(result.tables)
    flags = ["--ckpt", str(tiny_classifier), "--out", str(cli_out), *_flags(settings)]
    assert dataclasses.replace(result.settings, out=str(cli_out)) == ablate_cli.parse_args(flags)
    saved = result.save(work / "ablate-saved")
    assert sorted(p.name for p in saved.iterdir()) == sorted(p.name for p in cli_out.iterdir())


def test_prune_call_gives_the_clis_tables_with_the_model_passed(work, tiny_classifier, shared_data, monkeypatch):
    settings = dict(task="mrpc", glue_dir=str(shared_data / "glue"), n=8, batch_size=8, max_length=32,
                    prune_step=0.5, random_seeds=1)  # fmt: skip
    cli_out = work / "prune-cli"
    # run.json counts the run's compiles: none of an earlier test's in this process (another file's
    # prune run of the same shapes, in the same pytest worker).
    jax.clear_caches()
    prune_cli.main(["--ckpt", str(tiny_classifier), "--out", str(cli_out), *_flags(settings)])
    model = bertjax.from_pretrained(tiny_classifier, "BertForSequenceClassification")
    _refuse_loading(monkeypatch, api_common, "from_pretrained")
    result = api.prune(str(tiny_classifier), model=model, **settings)
    _same_tables(result, cli_out)
    assert result.curve["order"].tolist() == ["importance"] * 3 + ["random"] * 3  # 0, 2 and 4 of 4 heads
    cli_result = json.loads((cli_out / "run.json").read_text())["result"]
    # The call reuses the executables the CLI run compiled in this process, and run.json says so.
    assert cli_result.pop("compiled_executables") > 0 and result.info["result"].pop("compiled_executables") == 0
    assert result.info["result"] == cli_result
    assert [f.path.name for f in result.figure("mrpc_pruning")] == ["mrpc_pruning.png"]


def test_finetune_effect_call_gives_the_clis_tables_with_the_models_passed(
    work, tiny_hf, second_hf, shared_data, monkeypatch
):
    settings = _settings(shared_data, work / "parses")
    post = f"{second_hf}:mrpc"
    cli_out = work / "effect-cli"
    effect_cli.main(["--pre", str(tiny_hf), "--post", post, "--out", str(cli_out), *_flags(settings)])
    pre, post_model = bertjax.from_pretrained(tiny_hf), bertjax.from_pretrained(second_hf)
    _refuse_loading(monkeypatch, finetuning, "from_pretrained")
    result = api.finetune_effect(str(tiny_hf), post, model=pre, post_models=[post_model], **settings)
    _same_tables(result, cli_out)
    assert sorted(result.tables) == ["attention_similarity", "beta_change", "head_means"]
    at_cli_out = dataclasses.replace(result.settings.data, out=str(cli_out))
    assert dataclasses.replace(result.settings, data=at_cli_out) == effect_cli.parse_args(
        ["--pre", str(tiny_hf), "--post", post, "--out", str(cli_out), *_flags(settings)]
    )
    # figures="none" drew nothing; figure() draws it on demand.
    assert result.info["figures"] == [] and not list(result.directory.glob("*.png"))
    (figure,) = result.figure("attention_similarity")
    assert figure.path.name == "attention_similarity.png" and figure._repr_png_()[:4] == b"\x89PNG"
    with pytest.raises(UserError, match="post_models: 2 models for 1 --post"):
        api.finetune_effect(str(tiny_hf), post, model=pre, post_models=[post_model, post_model], **settings)


def test_the_other_calls_keywords_default_as_the_flags():
    assert api.clark_config("c", {"out": "o"}) == clark_cli.parse_args(["--ckpt", "c", "--out", "o"])
    assert api.clark_config("c", {"out": "o", "analyses": ["probes"], "first_piece": True}) == clark_cli.parse_args(
        ["--ckpt", "c", "--out", "o", "--analyses", "probes", "--first-piece"]
    )
    assert api.ablate_config("c", {"out": "ablate_out"}) == ablate_cli.parse_args(["--ckpt", "c"])
    assert api.ablate_config("c", {"out": "ablate_out", "analyses": "mask", "n": 5}) == ablate_cli.parse_args(
        ["--ckpt", "c", "--analyses", "mask", "--n", "5"]
    )
    assert api.prune_config("c", {"out": "prune_out"}) == prune_cli.parse_args(["--ckpt", "c"])
    assert api.prune_config("c", {"out": "prune_out", "n": 8}).importance_n == 8
    data = api.roles_config("p", {"out": "finetune_effect_out"}, heads_config.EFFECT_TOOL, heads_config.EFFECT_SECTIONS)
    assert finetuning.effect_config(["q:mrpc"], data) == effect_cli.parse_args(["--pre", "p", "--post", "q:mrpc"])
    for call, keywords in (
        (api.clark, {"max_len": 3}),
        (api.clark, {"analyses_explicit": True}),
        (api.ablate, {"tau": 3}),
        (api.prune, {"reestimate_every": 2}),
    ):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            call("c", **keywords)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        api.finetune_effect("p", "q:mrpc", tau=3)


@pytest.mark.parametrize(
    ("call", "keywords", "main", "flags"),
    [
        ("clark", {"analyses": "surface,nope"}, "clark", ["--analyses", "surface,nope"]),
        ("clark", {"n": 0}, "clark", ["--n", "0"]),
        ("ablate", {"alpha": 1.0}, "ablate", ["--alpha", "1"]),
        ("ablate", {"analyses": "disable,dance"}, "ablate", ["--analyses", "disable,dance"]),
        ("prune", {"prune_step": 0.9}, "prune", ["--prune-step", "0.9"]),
        ("prune", {"metric": "mcc"}, "prune", ["--metric", "mcc"]),
        ("finetune_effect", {"conllu": "gold.conllu"}, "finetune_effect", ["--conllu", "gold.conllu"]),
        ("finetune_effect", {"post": "runs/a:badtask"}, "finetune_effect", []),
    ],
)
def test_the_other_calls_errors_are_the_clis_lines(call, keywords, main, flags, tmp_path, cli_error):
    mains = {
        "clark": clark_cli.main,
        "ablate": ablate_cli.main,
        "prune": prune_cli.main,
        "finetune_effect": effect_cli.main,
    }
    if call == "finetune_effect":
        post = keywords.pop("post", "q:mrpc")
        argv = ["--pre", "p", "--post", post, *flags]
        raising = lambda: api.finetune_effect("p", post, out=tmp_path / "api", **keywords)
    else:
        argv = ["--ckpt", "c", *flags]
        raising = lambda: getattr(api, call)("c", out=tmp_path / "api", **keywords)
    line = cli_error(mains[main], [*argv, "--out", str(tmp_path / "cli")])
    with pytest.raises(UserError) as raised:
        raising()
    assert line == f"error: {' '.join(str(raised.value).split())}"
    assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()


def test_a_split_the_cli_parser_checks_is_one_line_too():
    with pytest.raises(UserError, match=r"^--split must be one of train, dev, validation, got 'test'$"):
        api.ablate("c", split="test")
    with pytest.raises(UserError, match=r"^--importance-split must be one of train, dev, validation, got 'x'$"):
        api.prune("c", importance_split="x")
