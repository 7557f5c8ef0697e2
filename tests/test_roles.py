"""Head roles end to end: planted roles through the kernel and the tests, and the CLI contract."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pandas as pd
import pytest

import bertjax
from analysis import roles as roles_cli
from analysis.common import examples, forward
from analysis.heads import config as roles_config
from analysis.heads import scoring
from sieves import stats
from sieves.align import EncodedSequence, bucketed
from sieves.builders import DEFAULT_ROLES, RELATIONS, ROLES, SieveOptions, build_batch
from sieves.kernel import sieve_scores

# ---------------------------------------------------------------------------------------------
# Planted roles: synthetic two-segment sequences whose dependency heads lie beyond the local window,
# and synthetic attention heads built to do one thing each.

PLANTED = ["local", "prev", "next", "block", "cls", "sep", "syntactic", "uniform"]
WINDOW = 2


def _synthetic_sequence(rng: np.random.Generator, index: int) -> EncodedSequence:
    """[CLS] A [SEP] B [SEP], one wordpiece per word; every relation word's head is ≥ 4 away."""
    len_a, len_b = rng.integers(12, 24, size=2)
    n = len_a + len_b + 3
    token_type = np.r_[np.zeros(len_a + 2, np.int32), np.ones(len_b + 1, np.int32)]
    is_cls = np.zeros(n, bool)
    is_cls[0] = True
    is_sep = np.zeros(n, bool)
    is_sep[[len_a + 1, n - 1]] = True
    special = is_cls | is_sep
    word_positions = np.flatnonzero(~special)
    word_ids = np.full(n, -1, np.int32)
    word_ids[word_positions] = np.arange(len(word_positions))
    deps = ["det"] * len(word_positions)
    heads = np.arange(len(word_positions), dtype=np.int32)  # every word its own root by default
    segment_of = token_type[word_positions]
    for w in rng.permutation(len(word_positions))[: len(word_positions) // 3]:
        far = [
            h for h in range(len(word_positions))
            if segment_of[h] == segment_of[w] and abs(word_positions[h] - word_positions[w]) >= WINDOW + 2
        ]  # fmt: skip
        deps[w] = RELATIONS[rng.integers(len(RELATIONS))]
        heads[w] = rng.choice(far)
    return EncodedSequence(
        input_ids=np.arange(n, dtype=np.int32),
        token_type_ids=token_type,
        special=special,
        is_cls=is_cls,
        is_sep=is_sep,
        word_ids=word_ids,
        word_dep=tuple(deps),
        word_head=heads,
        num_segments=2,
        index=index,
    )


def _planted_attention(seq: EncodedSequence) -> np.ndarray:
    """[H, n, n] attention rows, one head per entry of PLANTED."""
    n = seq.length
    t = np.arange(n)
    uniform = np.full((n, n), 1.0 / n)
    offsets = t[None, :] - t[:, None]
    local = (np.abs(offsets) <= WINDOW).astype(float)
    prev = (offsets == -1).astype(float)
    prev[0] = 1.0  # row 0 has no previous token and is not a scored `prev` row
    nxt = (offsets == 1).astype(float)
    nxt[-1] = 1.0
    block = (seq.token_type_ids[:, None] == seq.token_type_ids[None, :]) & ~seq.special[None, :]
    cls = np.broadcast_to(seq.is_cls, (n, n)).astype(float)
    sep = np.broadcast_to(seq.is_sep, (n, n)).astype(float)
    syntactic = uniform.copy()
    for row in range(n):
        w = seq.word_ids[row]
        if w >= 0 and seq.word_dep[w] in RELATIONS:
            syntactic[row] = seq.word_ids == seq.word_head[w]
    heads = [local, prev, nxt, block.astype(float), cls, sep, syntactic, uniform]
    return np.stack([h / h.sum(-1, keepdims=True) for h in heads])


@pytest.fixture(scope="module")
def planted_scores():
    rng = np.random.default_rng(0)
    seqs = [_synthetic_sequence(rng, i) for i in range(40)]
    length = max(s.length for s in seqs)
    attention = np.zeros((1, len(seqs), len(PLANTED), length, length), np.float32)
    real = np.zeros((len(seqs), length), bool)
    for b, seq in enumerate(seqs):
        attention[0, b, :, : seq.length, : seq.length] = _planted_attention(seq)
        real[b, : seq.length] = True
    rows, sieves = build_batch(seqs, DEFAULT_ROLES, SieveOptions(window=WINDOW), length)
    scores, counts = sieve_scores(attention, real, rows, sieves)
    return seqs, np.asarray(scores)[:, :, 0], np.asarray(counts)  # [R, B, H], [R, B]


def test_planted_heads_get_exactly_their_roles(planted_scores):
    _, scores, counts = planted_scores
    assigned = {}
    for r, role in enumerate(DEFAULT_ROLES):
        sample = scores[r][counts[r] > 0]
        result = stats.one_sided_test(sample, 3.0, axis=0)
        for h, head in enumerate(PLANTED):
            if stats.assign(result.p_value[h], 0.05):
                assigned.setdefault(head, set()).add(role)
    # Each sieve that contains the planted one is implied by it: S_prev ⊂ S_local, {[CLS]} ⊂ the
    # delimiters, a relation's sieve is part of `syntactic`.
    assert assigned == {
        "local": {"local", "prev", "next"},
        "prev": {"prev", "local"},
        "next": {"next", "local"},
        "cls": {"cls", "delimiter"},
        "sep": {"sep", "delimiter"},
        "syntactic": {"syntactic", *RELATIONS},
    }


def test_a_perfect_block_head_scores_two_plus_a_length_term(planted_scores):
    """Why no `block` above: Σ_{s∈S} α = 1 on every row, so β(t) = n/|S(t)| and the mean over the
    rows is 2 + 2/|A| + 1/|B| ([CLS] and the first [SEP] score against A, the last [SEP] against
    B) — always below τ = 3 for segments longer than two words."""
    seqs, scores, _ = planted_scores
    block = scores[DEFAULT_ROLES.index("block"), :, PLANTED.index("block")]
    len_a = np.array([int((s.token_type_ids == 0).sum()) - 2 for s in seqs])
    len_b = np.array([int((s.token_type_ids == 1).sum()) - 1 for s in seqs])
    np.testing.assert_allclose(block, 2 + 2 / len_a + 1 / len_b, rtol=_kernel_rtol(seqs))
    # An off-by-one segment length (the [SEP] counted into A) moves β by ~2/|A|² ≥ 0.3%: the bound catches it.
    assert not np.allclose(block, 2 + 2 / (len_a + 1) + 1 / len_b, rtol=_kernel_rtol(seqs), atol=0)


def _kernel_rtol(seqs) -> float:
    """The float32 error of the kernel on these sequences: each score is one contraction of T² terms
    (rounding error at most T²·u in the worst case, u = 2⁻²⁴), after a row mass of T terms and two
    divisions. Measured errors are ~300 u (AMD EPYC), below the bound; a wrong sieve is ≥ 1e-3 off."""
    length = max(s.length for s in seqs)
    return (length**2 + length + 2) * 2.0**-24


def test_a_uniform_head_scores_one_everywhere(planted_scores):
    seqs, scores, counts = planted_scores
    uniform = scores[:, :, PLANTED.index("uniform")]
    np.testing.assert_allclose(uniform[counts > 0], 1.0, rtol=_kernel_rtol(seqs))


# ---------------------------------------------------------------------------------------------
# The CLI on a tiny random BERT with the real uncased vocabulary and the real GLUE files.


@pytest.fixture(scope="module")
def tiny_run(tiny_hf, shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    cache = tmp_path_factory.mktemp("cache")
    argv = ["--ckpt", str(tiny_hf), "--task", "mrpc,sst2", "--glue-dir", str(shared_data / "glue"),
            "--n", "24", "--batch-size", "8", "--out", str(out), "--cache-dir", str(cache), "--figure-format", "png,svg"]  # fmt: skip
    roles_cli.main(argv)
    return out, argv, cache


def test_cli_writes_the_contracted_outputs(tiny_run):
    out, _, _ = tiny_run
    table = pd.read_csv(out / "roles.csv")
    assert list(table.columns) == [
        "task", "layer", "head", "role", "n", "mean", "std", "ci_low", "ci_high", "lower_bound", "t", "p_value", "p_adjusted", "assigned"
    ]  # fmt: skip
    assert set(table.task) == {"mrpc", "sst2"}
    assert set(table.role[table.task == "sst2"]) == set(DEFAULT_ROLES) - {"block"}  # SST-2 is single-segment
    assert len(table[(table.task == "mrpc") & (table.role == "local")]) == 2 * 2  # L × H
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["task"]) == ["mrpc", "sst2"] and (summary["n_heads"] == 4).all()
    scores = np.load(out / "scores.npz")
    local = scores["mrpc/local"]
    assert local.shape == (24, 2, 2) and list(scores["mrpc/local/index"]) == list(range(24))
    row = table[(table.task == "mrpc") & (table.role == "local") & (table.layer == 1) & (table["head"] == 0)].iloc[0]
    # The table's mean of these 24 float32 scores against NumPy's in float64 (CSV keeps 17 digits):
    # 24·2⁻⁵³ apart, far inside 1e-12; a float32 mean would be ~24·2⁻²⁴ ≈ 1.4e-6 off at worst.
    np.testing.assert_allclose(row["mean"], local[:, 1, 0].astype(np.float64).mean(), rtol=1e-12)
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["n"] == 24 and run["tau"] == 3.0
    assert run["tasks"]["sst2"]["absent_roles"] == ["block"]
    assert {f["path"].split("/")[-2] for f in run["data_files"]["mrpc"]} == {"MRPC"}
    assert run["versions"]["jax"] and run["devices"]["count"] >= 1 and "total" in run["timings_s"]
    assert run["cwd"] == os.getcwd() and run["versions"]["git_dirty"] in (True, False, None)
    figures = {p.name for p in out.iterdir() if p.suffix in (".png", ".svg")}
    assert {"mrpc_role_grid.png", "mrpc_role_grid.svg", "sst2_role_grid.png"} <= figures
    assert not [p for p in out.parent.iterdir() if ".tmp-" in p.name]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's private 0700


def _reference_sequence_scores(attention: np.ndarray, seq: EncodedSequence, role: str) -> np.ndarray | None:
    """β of docs/roles.md averaged over the role's scored rows, straight from one unpadded [L, H, n, n]
    attention tensor; None when the role scores no row of this sequence."""
    rows, sieve = ROLES[role].build(seq, SieveOptions())
    if not rows.any():
        return None
    n = seq.length
    a = attention[:, :, :n, :n].astype(np.float64)
    in_sieve = (a * sieve).sum(-1) / np.maximum(sieve.sum(-1), 1)
    overall = a.sum(-1) / n
    return (in_sieve / overall)[:, :, rows].mean(-1)


def _mrpc_in_one_batch(tiny_hf, shared_data, cache) -> tuple[list[EncodedSequence], dict[str, np.ndarray]]:
    """The first 24 MRPC dev examples encoded as the CLI encodes them, in file order, padded into
    one unsorted batch (the model's keyword arguments)."""
    config = roles_config.RolesConfig(
        ckpt=str(tiny_hf), task=("mrpc",), glue_dir=str(shared_data / "glue"), n=24, cache_dir=str(cache)
    )
    data = examples.load_tasks(config, ["mrpc"])
    seqs = examples.encode_tasks(config, data, bertjax.load_tokenizer(str(tiny_hf)), examples.make_parser(config), {})
    seqs = seqs["mrpc"]
    length = max(s.length for s in seqs)
    arrays = {k: np.zeros((len(seqs), length), np.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}
    for b, seq in enumerate(seqs):
        arrays["input_ids"][b, : seq.length] = seq.input_ids
        arrays["attention_mask"][b, : seq.length] = 1
        arrays["token_type_ids"][b, : seq.length] = seq.token_type_ids
    return seqs, arrays


def test_each_saved_score_belongs_to_the_example_it_is_indexed_by(tiny_run, tiny_hf, shared_data):
    """The CLI scores length-sorted, bucket-padded batches; here every MRPC example is scored in
    file order in one unsorted batch and compared row by row with `scores.npz` through its
    index. Also pins n: exactly the examples where a role has a scored row."""
    out, _, cache = tiny_run
    seqs, arrays = _mrpc_in_one_batch(tiny_hf, shared_data, cache)
    model = bertjax.from_pretrained(str(tiny_hf))
    attention = np.stack(model(**arrays, output_attentions=True).attentions, axis=1)  # [B, L, H, T, T]

    saved = np.load(out / "scores.npz")
    table = pd.read_csv(out / "roles.csv")
    for role in DEFAULT_ROLES:
        expected = {seq.index: _reference_sequence_scores(attention[b], seq, role) for b, seq in enumerate(seqs)}
        expected = {i: v for i, v in expected.items() if v is not None}
        index = saved[f"mrpc/{role}/index"]
        assert list(index) == sorted(expected), role
        # The float32 kernel's bound against a float64 β (see _kernel_rtol); the atol covers the
        # attention itself, computed here in another padding (the model bound, ~1e-6 on weights ≤ 1).
        # Measured ≤ 2.5e-7 relative at T = 78, where the bound is 3.7e-4.
        got, want = saved[f"mrpc/{role}"], np.stack([expected[i] for i in index])
        np.testing.assert_allclose(got, want, rtol=_kernel_rtol(seqs), atol=1e-6)
        rows = table[(table.task == "mrpc") & (table.role == role)]
        assert (rows.n == len(expected)).all() and rows["mean"].notna().all(), role


class _WhitespaceParser:
    """A stand-in for spaCy: one word per whitespace-separated token, each headed by the first."""

    name, version = "whitespace", "0"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def parse(self, texts):
        import re

        from sieves.parse import Word

        self.calls.append(len(texts))
        return [tuple(Word(m.start(), m.end(), "dep", 0, "X") for m in re.finditer(r"\S+", t)) for t in texts]


def test_tasks_are_parsed_and_encoded_in_chunks_giving_what_one_call_gives(tiny_hf, shared_data, monkeypatch, capsys):
    """Chunks of ENCODE_CHUNK examples (5 here: 24 examples in 5 chunks) hold memory to a chunk's
    intermediates; the sequences equal one parse and one encoding of the whole task, field by field."""
    from sieves.align import encode_batch
    from sieves.parse import parse_examples

    config = roles_config.RolesConfig(ckpt=str(tiny_hf), task=("mrpc",), glue_dir=str(shared_data / "glue"), n=24)
    data = examples.load_tasks(config, ["mrpc"])
    tokenizer = bertjax.load_tokenizer(str(tiny_hf))
    whole = encode_batch(tokenizer, data["mrpc"].segments, parse_examples(_WhitespaceParser(), data["mrpc"].segments),
                         config.max_length, data["mrpc"].indices)  # fmt: skip
    monkeypatch.setattr(examples, "ENCODE_CHUNK", 5)
    parser = _WhitespaceParser()
    chunked = examples.encode_tasks(config, data, tokenizer, parser, {})["mrpc"]
    assert parser.calls == [10, 10, 10, 10, 8]  # two segments an example
    assert len(chunked) == len(whole) == 24
    for got, want in zip(chunked, whole, strict=True):
        for field in dataclasses.fields(EncodedSequence):
            np.testing.assert_array_equal(getattr(got, field.name), getattr(want, field.name), err_msg=field.name)
    assert "mrpc encode: 100%" in capsys.readouterr().err  # the progress bar over the examples


def test_a_correction_spans_every_test_of_the_run():
    """--correction adjusts the p-values of all tasks, layers, heads and roles as one family, and a
    role is assigned on the adjusted p-value."""
    rng = np.random.default_rng(3)

    def task(shift: float) -> scoring.TaskScores:
        scores = {role: 3.0 + shift + rng.normal(0, 1, (30, 2, 3)) for role in ("local", "cls")}
        return scoring.TaskScores(scores, {r: np.arange(30) for r in scores}, [], 30)

    results = {"mrpc": task(0.45), "sst2": task(0.3)}
    raw, _ = scoring.test_roles(results, roles_config.RolesConfig(ckpt="x", correction="none"))
    holm, _ = scoring.test_roles(results, roles_config.RolesConfig(ckpt="x", correction="holm"))
    np.testing.assert_array_equal(holm.p_value, raw.p_value)
    np.testing.assert_allclose(holm.p_adjusted, stats.adjust_pvalues(raw.p_value.to_numpy(), "holm"))
    assert (holm.assigned == (holm.p_adjusted < 0.05)).all() and (raw.assigned == (raw.p_value < 0.05)).all()
    assert holm.assigned.sum() < raw.assigned.sum(), "the planted effects must be near the threshold"
    assert roles_cli.parse_args(["--ckpt", "x", "--correction", "bh"]).correction == "bh"


def _build(graphdef, *static):
    return object()  # a new object per build: the test tells builds apart by identity


def test_compiled_builds_once_per_site_architecture_and_static_choice():
    from flax import nnx

    tiny = bertjax.preset("tiny", max_position_embeddings=128)
    first, second = (bertjax.init_model(tiny, seed=seed) for seed in (1, 2))
    built, (state,) = forward.compiled(_build, first)
    again, (second_state,) = forward.compiled(_build, second)
    # Another checkpoint of the architecture shares the build, but passes its own weights.
    assert again is built
    query = ("encoder", "layer", 0, "attention", "self", "query", "kernel")
    kernel = lambda state: np.asarray(dict(nnx.to_flat_state(state))[query].get_value())
    np.testing.assert_array_equal(kernel(second_state), kernel(nnx.state(second)))
    assert not np.array_equal(kernel(state), kernel(second_state))
    assert forward.compiled(_build, first, static=("js",))[0] is not built
    one_layer = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128, num_hidden_layers=1))
    assert forward.compiled(_build, one_layer)[0] is not built

    def per_call(graphdef):
        return object()

    with pytest.raises(TypeError, match="module-level build"):
        forward.compiled(per_call, first)


def test_pair_and_single_segment_tasks_share_compiled_shapes(tiny_hf, shared_data, tmp_path):
    config = roles_config.RolesConfig(
        ckpt=str(tiny_hf), task=("mrpc",), glue_dir=str(shared_data / "glue"), n=8, batch_size=8
    )
    tokenizer = bertjax.load_tokenizer(str(tiny_hf))
    parser = examples.make_parser(dataclasses.replace(config, cache_dir=str(tmp_path)))
    shapes = []

    def scorer(input_ids, attention_mask, token_type_ids, rows, sieves):
        shapes.append(sieves.shape)
        silent = np.zeros((2, rows.shape[1], 2), bool)  # [L, B, H]: no head's reading undefined
        return np.zeros(rows.shape[:2] + (2, 2), np.float32), rows.sum(axis=-1), silent

    results = {}
    for task in ("mrpc", "sst2"):
        data = examples.load_tasks(dataclasses.replace(config, task=(task,)), [task])
        seqs = examples.encode_tasks(config, data, tokenizer, parser, {})[task]
        results[task] = scoring.score_task(
            forward.DataParallel(lambda _, *a: scorer(*a), None, None, ()), seqs, config, task
        )
    assert {shape[0] for shape in shapes} == {len(DEFAULT_ROLES)}  # SST-2 has no `block`, same count
    assert "block" not in results["sst2"].scores and results["sst2"].absent == ["block"]
    assert set(results["mrpc"].scores) == set(DEFAULT_ROLES)


def test_rerun_reuses_the_parse_cache(tiny_run, monkeypatch):
    out, argv, _ = tiny_run
    from sieves import parse

    def no_parsing(self, texts):
        assert not texts, f"{len(texts)} texts were parsed again"
        return iter(())

    monkeypatch.setattr(parse.SpacyParser, "_run_spacy", no_parsing)
    roles_cli.main(argv + ["--overwrite", "--no-figures"])
    assert (out / "roles.csv").is_file()


def _bad_glue(tmp_path, text: str):
    (tmp_path / "glue" / "MRPC").mkdir(parents=True)
    (tmp_path / "glue" / "MRPC" / "dev.tsv").write_text(text)
    return tmp_path / "glue"


HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown_task", "error: unknown task 'cola'"),
        ("missing_file", "MRPC/dev.tsv"),
        ("malformed_row", "dev.tsv:3"),
        ("empty_text", "dev.tsv:2"),
        ("n_zero", "error: --n must be at least 1, got 0"),
        ("duplicate_role", "error: --roles names a role twice: local,cls,local"),
        ("max_length_tiny", "error: --max-length must be at least 5"),
        ("tau_nan", "error: --tau must be a finite number or 'auto', got nan"),
        # Accepted before: every head held every role at τ < 0 (β is never negative).
        ("tau_negative", "error: --tau must be ≥ 0 (β, n times the attention, is never negative), got -1"),
        ("unwritable_out", "cannot write there"),
        ("no_role_defined", "error: --roles block: no requested role is defined for sst2 (block needs sentence pairs)"),
        # Raised in the thread that encodes the tasks while the model loads: the run's one line all the same.
        ("unusable_parse_cache", "cannot use the parse cache"),
    ],
)
def test_bad_input_gives_one_line_and_no_output(case, expected, tiny_hf, shared_data, tmp_path, cli_error):
    out = tmp_path / "out"
    argv = [
        "--ckpt",
        str(tiny_hf),
        "--task",
        "mrpc",
        "--glue-dir",
        str(shared_data / "glue"),
        "--out",
        str(out),
        "--n",
        "4",
    ]
    if case == "unknown_task":
        argv[3] = "cola"
    elif case == "missing_file":
        argv[5] = str(tmp_path / "nowhere")
    elif case == "malformed_row":
        argv[5] = str(_bad_glue(tmp_path, HEADER + "1\t1\t2\tA b.\tC d.\n0\t3\tonly three fields\n"))
    elif case == "empty_text":
        argv[5] = str(_bad_glue(tmp_path, HEADER + "1\t1\t2\t \tC d.\n"))
    elif case == "n_zero":
        argv[-1] = "0"
    elif case == "duplicate_role":
        argv += ["--roles", "local,cls,local"]
    elif case == "max_length_tiny":
        argv += ["--max-length", "2"]
    elif case == "tau_nan":
        argv += ["--tau", "nan"]
    elif case == "tau_negative":
        argv += ["--tau", "-1"]
    elif case == "unwritable_out":
        blocker = tmp_path / "a_file"  # a file where a directory should be: fails even for root
        blocker.write_text("")
        argv[7] = str(blocker / "out")
    elif case == "no_role_defined":
        argv[3] = "sst2"
        argv += ["--roles", "block"]
    elif case == "unusable_parse_cache":
        (tmp_path / "parses" / "spacy_parses.sqlite3").mkdir(parents=True)  # a folder where the database goes
        argv += ["--cache-dir", str(tmp_path / "parses")]
    message = cli_error(roles_cli.main, argv)
    assert message.startswith("error: ") and expected in message
    assert not out.exists()
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def test_batches_are_padded_to_a_bucket_but_never_past_max_length():
    rng = np.random.default_rng(0)
    seqs = [_synthetic_sequence(rng, i) for i in range(3)]  # 27 to 51 tokens
    longest = max(s.length for s in seqs)
    ((_, arrays),) = forward.padded_batches(seqs, 4, 128, "test")
    assert arrays["input_ids"].shape == (4, bucketed(longest)) and bucketed(longest) > longest
    ((_, arrays),) = forward.padded_batches(seqs, 4, longest, "test")  # a model with `longest` positions
    assert arrays["input_ids"].shape == (4, longest)


def test_overwrite_replaces_only_an_earlier_output(tiny_run, tmp_path, cli_error):
    _, argv, _ = tiny_run
    """A training workdir holds a run.json too; only what an analysis wrote may be replaced."""
    out_at = argv.index("--out") + 1
    for foreign, files in (
        (tmp_path / "notes", ["mine.txt"]),
        (tmp_path / "a-training-run", ["run.json", "config.yaml"]),
    ):
        foreign.mkdir()
        for name in files:
            (foreign / name).write_text("keep me")
        message = cli_error(roles_cli.main, argv[:out_at] + [str(foreign)] + argv[out_at + 1 :] + ["--overwrite"])
        assert message == (
            f"error: --out {foreign} is not an earlier roles output (it has no .bertjax-output saying so); "
            "--overwrite replaces only those"
        )
        assert sorted(p.name for p in foreign.iterdir()) == sorted(files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-training-run", "notes"]


def test_max_length_is_cut_to_the_model_positions():
    from analysis.ablation.michel import MichelConfig

    config = roles_config.RolesConfig(ckpt="x", max_length=128)
    assert examples.fit_max_length(config, 512) is config
    assert examples.fit_max_length(config, 64).max_length == 64
    assert examples.fit_max_length(MichelConfig(ckpt="x"), 64) == MichelConfig(ckpt="x", max_length=64)
