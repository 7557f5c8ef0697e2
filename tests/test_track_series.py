"""Tracking any series of checkpoints: `--ckpt SRC@LABEL` lists and `{step}` patterns over HF
directories and hub ids (local stand-ins for the hub cache, no network), their order, labels and
cache keys; a series of mixed shapes or tokenizers is one line before any scoring; a fine-tuning
workdir with log-spaced checkpoints, led by its init."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import orbax.checkpoint as ocp
import pandas as pd
import pytest
from flax import nnx
from transformers import BertTokenizerFast

import bertjax
from analysis import roles as roles_cli
from analysis import track
from analysis.heads import series, tracking
from bertjax import checkpoint as ckpt
from bertjax import pretrained
from train import finetune


def _tokenizer(shared_data: Path, vocab: Path | None = None) -> BertTokenizerFast:
    return BertTokenizerFast(
        vocab=str(vocab or shared_data / "vocab" / "bert-base-uncased-vocab.txt"), do_lower_case=True
    )


def write_hf(directory: Path, shared_data: Path, seed: int, vocab: Path | None = None, **config) -> Path:
    """A random tiny BERT in HF format with bert-base-uncased's (or `vocab`'s) tokenizer."""
    model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=128, **config), seed=seed)
    bertjax.save_pretrained(model, directory)
    _tokenizer(shared_data, vocab).save_pretrained(directory)
    return directory


def publish(hub: Path, repo_id: str, source: Path, revision: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Lays `source`'s files out as huggingface_hub caches a download: content-addressed blobs,
    a snapshot folder per revision (commit) of links to them, and `refs/<branch or tag>` naming
    the commit each of `refs` is at."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in source.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        if not blob.exists():
            blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("../..") / "blobs" / blob.name)
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(revision)
    return snapshot


def commit(label: str) -> str:
    """A 40-hex commit id (what the hub cache names snapshots by), made from `label`."""
    return hashlib.sha1(label.encode()).hexdigest()


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory, shared_data) -> list[Path]:
    root = tmp_path_factory.mktemp("hf")
    return [write_hf(root / f"model{seed}", shared_data, seed) for seed in range(3)]


@pytest.fixture(scope="module")
def parse_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("parses")


@pytest.fixture
def flags(shared_data, parse_cache) -> list[str]:
    # Length 32 keeps every batch in one padded shape: one compile.
    return ["--task", "mrpc", "--glue-dir", str(shared_data / "glue"), "--n", "8", "--batch-size", "8",
            "--max-length", "32", "--cache-dir", str(parse_cache), "--no-figures"]  # fmt: skip


@pytest.fixture
def loads(monkeypatch) -> list:
    """The (path, step) of every checkpoint `analysis.track` scores."""
    loaded = []
    real = tracking.from_pretrained

    def counting(source, **options):
        loaded.append((source.path, source.step))
        return real(source, **options)

    monkeypatch.setattr(tracking, "from_pretrained", counting)
    return loaded


def _run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def _rows(out: Path, step: int) -> pd.DataFrame:
    table = pd.read_csv(out / tracking.TRACK_CSV)
    return table[table["step"] == step].drop(columns="step").reset_index(drop=True)


def _roles(argv: list[str], out: Path) -> pd.DataFrame:
    roles_cli.main([*argv, "--out", str(out)])
    return pd.read_csv(out / "roles.csv")


# -- --ckpt lists ------------------------------------------------------------------------------------


def test_integer_labels_are_steps_and_order_the_series(hf_dirs, flags, loads, tmp_path):
    out = tmp_path / "track"
    given = [f"{hf_dirs[0]}@10", f"{hf_dirs[1]}@1", f"{hf_dirs[2]}@100"]
    track.main([*[a for g in given for a in ("--ckpt", g)], "--out", str(out), *flags])
    series = _run_json(out)["series"]
    assert [m["step"] for m in series] == [1, 10, 100]
    assert [m["label"] for m in series] == ["1", "10", "100"]
    assert [m["given"] for m in series] == [str(hf_dirs[1]), str(hf_dirs[0]), str(hf_dirs[2])]
    assert all(m["kind"] == "hf" and m["checkpoint_step"] is None for m in series)
    assert sorted(pd.unique(pd.read_csv(out / tracking.TRACK_CSV)["step"])) == [1, 10, 100]
    assert [p for p, _ in loads] == [hf_dirs[1], hf_dirs[0], hf_dirs[2]]
    # A member's rows are what analysis.roles writes for that checkpoint alone.
    expected = _roles(["--ckpt", str(hf_dirs[0]), *flags], tmp_path / "roles")
    pd.testing.assert_frame_equal(_rows(out, 10), expected, check_exact=True)


def test_other_labels_keep_the_order_given(hf_dirs, flags, tmp_path):
    out = tmp_path / "track"
    argv = ["--ckpt", f"{hf_dirs[2]}@late", "--ckpt", f"{hf_dirs[0]}@early", "--ckpt", str(hf_dirs[1])]
    track.main([*argv, "--out", str(out), *flags])
    series = _run_json(out)["series"]
    assert [(m["step"], m["label"]) for m in series] == [(0, "late"), (1, "early"), (2, str(hf_dirs[1]))]
    assert _run_json(out)["config"]["series"] == argv[1::2]


def test_an_at_sign_inside_a_path_is_not_a_label():
    assert series.split_label("runs/a@b/model") == ("runs/a@b/model", None)
    assert series.split_label("org/name@7") == ("org/name", "7")
    assert series.split_label("model@") == ("model@", None)


def test_bertjax_checkpoints_bring_their_own_steps(hf_dirs, flags, tmp_path):
    """An unlabelled bertjax step folder is placed at its training step; a HF directory beside it
    takes an integer label; the cache of a run's step is keyed by its params files."""
    workdir = tmp_path / "run"
    write_orbax(workdir, 40, seed=5, tokenizer=str(hf_dirs[0]))
    out = tmp_path / "track"
    track.main(
        ["--ckpt", f"{hf_dirs[0]}@0", "--ckpt", str(workdir / ckpt.CHECKPOINTS / "40"), "--out", str(out), *flags]
    )
    series = _run_json(out)["series"]
    assert [(m["step"], m["kind"]) for m in series] == [(0, "hf"), (40, "orbax")]
    names = sorted(p.name for p in (tmp_path / "track.cache").glob("step-*"))
    assert [n[:14] for n in names] == ["step-000000000", "step-000000040"]


def write_orbax(workdir: Path, step: int, seed: int, tokenizer: str, run_config: dict | None = None) -> None:
    """A random tiny model saved as a training step (params + meta), as the trainer does."""
    model = bertjax.init_model(
        bertjax.preset("tiny", max_position_embeddings=128), bertjax.BertForPreTraining, seed=seed
    )
    manager = ocp.CheckpointManager(workdir / ckpt.CHECKPOINTS, item_names=(ckpt.PARAMS, ckpt.META))
    params = ckpt.flatten_params(nnx.state(model, nnx.Param))
    meta = ckpt.make_meta(model, tokenizer, run_config or {})
    manager.save(step, args=ocp.args.Composite(**ckpt.save_args(params, meta)))
    manager.wait_until_finished()
    manager.close()


# -- {step} patterns over the hub ------------------------------------------------------------------


def test_a_step_pattern_over_hub_ids_and_its_cache(hf_dirs, hub, flags, loads, tmp_path):
    for step, directory in zip((0, 20, 40), hf_dirs, strict=True):
        publish(hub, f"org/tiny-step_{step}k", directory, revision=commit(f"rev{step}"))
    out, cache = tmp_path / "track", tmp_path / "cache"
    argv = [
        "--ckpt",
        "org/tiny-step_{step}k",
        "--steps",
        "40,0,20",
        "--scores-cache",
        str(cache),
        "--out",
        str(out),
        *flags,
    ]
    track.main(argv)
    series = _run_json(out)["series"]
    assert [(m["step"], m["label"], m["given"]) for m in series] == [
        (0, "0", "org/tiny-step_0k"), (20, "20", "org/tiny-step_20k"), (40, "40", "org/tiny-step_40k")]  # fmt: skip
    assert [Path(m["path"]).name for m in series] == [commit("rev0"), commit("rev20"), commit("rev40")]
    assert len(loads) == 3 and len(list(cache.glob("step-*"))) == 3
    expected = _roles(["--ckpt", "org/tiny-step_20k", *flags], tmp_path / "roles")
    pd.testing.assert_frame_equal(_rows(out, 20), expected, check_exact=True)

    # Unchanged: nothing is scored again. A new revision of one repo (other weights): that one only.
    loads.clear()
    track.main(argv)
    assert loads == []
    publish(hub, "org/tiny-step_20k", hf_dirs[0], revision=commit("rev20b"))
    track.main(argv)
    assert [p.name for p, _ in loads] == [commit("rev20b")]
    assert _run_json(out)["analysed_steps"] == [20] and _run_json(out)["cached_steps"] == [0, 40]
    pd.testing.assert_frame_equal(_rows(out, 20), _rows(out, 0), check_exact=True)


def test_cache_keys_tell_checkpoints_apart(hf_dirs, tmp_path):
    """The key of a HF member names its files' resolved targets (hub blobs are content hashes) and
    the snapshot's path (the revision); the same files at another path or step are another key."""
    member = series.Member(3, "3", "x", pretrained.open_checkpoint(hf_dirs[0]))
    identity = series.member_identity(member)
    assert identity["path"] == str(hf_dirs[0].resolve()) and identity["step"] == 3
    assert {f[0] for f in identity["files"]} >= {"config.json", "model.safetensors", "tokenizer.json"}
    other = series.member_identity(series.Member(3, "3", "y", pretrained.open_checkpoint(hf_dirs[1])))
    moved = series.member_identity(series.Member(4, "4", "x", pretrained.open_checkpoint(hf_dirs[0])))
    settings = {"any": "settings"}
    keys = {tracking.cache_path(tmp_path, settings, i) for i in (identity, other, moved)}
    assert len(keys) == 3
    assert tracking.cache_path(tmp_path, settings, series.member_identity(member)) in keys


# -- one-line errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("layers", "the series mixes model shapes: {a} (0) has 2 layers × 2 heads, {b} (1) has 3 layers × 2 heads"),
        ("heads", "the series mixes model shapes: {a} (0) has 2 layers × 2 heads, {b} (1) has 2 layers × 4 heads"),
        (
            "vocabulary",
            "the series mixes tokenizers: {b} (1) has another tokenizer vocabulary (2000 tokens) than {a} (0, 30522 tokens)",
        ),
        ("same_step", "--ckpt {a} and {b} are both at step 0; give each a distinct @LABEL"),
        ("pattern_without_steps", "--ckpt org/m-{{step}}: a {{step}} pattern needs --steps"),
        ("pattern_and_more", "--ckpt org/m-{{step}}: a {{step}} pattern is the only --ckpt of its series"),
        ("pattern_with_label", "--ckpt org/m-{{step}}@x: a {{step}} pattern takes no @LABEL"),
        ("steps_with_a_list", "--steps goes with --run or a --ckpt pattern holding {{step}}, not a --ckpt list"),
        ("hub_offline", "org/absent: not a local path, and the hub download failed"),
        ("with_init", "--with-init goes with --run"),
    ],
)
def test_bad_series_give_one_line_before_any_scoring(
    case, expected, hf_dirs, hub, shared_data, flags, loads, tmp_path, cli_error
):
    a, b = str(hf_dirs[0]), str(tmp_path / "b")
    if case in ("layers", "heads"):
        write_hf(
            Path(b), shared_data, 0, **({"num_hidden_layers": 3} if case == "layers" else {"num_attention_heads": 4})
        )
    elif case == "vocabulary":
        vocab = tmp_path / "vocab.txt"
        lines = (shared_data / "vocab" / "bert-base-uncased-vocab.txt").read_text().splitlines()[:2000]
        vocab.write_text("\n".join(lines) + "\n")
        write_hf(Path(b), shared_data, 0, vocab=vocab, vocab_size=2000)  # a model of its own tokenizer
    series = {
        "same_step": ["--ckpt", f"{a}@0", "--ckpt", f"{hf_dirs[1]}@00"],
        "pattern_without_steps": ["--ckpt", "org/m-{step}"],
        "pattern_and_more": ["--ckpt", "org/m-{step}", "--ckpt", a, "--steps", "1"],
        "pattern_with_label": ["--ckpt", "org/m-{step}@x", "--steps", "1"],
        "steps_with_a_list": ["--ckpt", a, "--ckpt", b, "--steps", "1"],
        "hub_offline": ["--ckpt", a, "--ckpt", "org/absent"],
        "with_init": ["--ckpt", a, "--with-init"],
    }.get(case, ["--ckpt", f"{a}@0", "--ckpt", f"{b}@1"])
    if case == "same_step":
        b = str(hf_dirs[1])
    message = cli_error(track.main, [*series, "--out", str(tmp_path / "out"), *flags])
    assert message.startswith("error: ") and expected.format(a=a, b=b) in message, message
    assert loads == [] and not (tmp_path / "out").exists()


# -- fine-tuning workdirs ----------------------------------------------------------------------------

# 48 examples in batches of 8 for 2 epochs: 12 steps; 4 log-spaced steps are 1, 2, 5, 12.
QUICK = ["data.max_train_examples=48", "data.max_seq_length=64", "train.global_batch_size=8", "train.epochs=2",
         "train.log_every=2", "checkpoint.log_spaced=4"]  # fmt: skip


@pytest.fixture(scope="module")
def finetuned(hf_dirs, shared_data, tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("mrpc")
    finetune.main(["--task", "mrpc", "--ckpt", str(hf_dirs[0]), "--workdir", str(workdir),
                   "--glue-dir", str(shared_data / "glue"), *QUICK])  # fmt: skip
    return workdir


@pytest.mark.slow  # the `finetuned` fixture fine-tunes: ~31 s of CPU
def test_finetuning_keeps_log_spaced_checkpoints(finetuned):
    steps = ckpt.available_steps(finetuned / ckpt.CHECKPOINTS)
    # log-spaced 1, 2, 5, 12; the last (12); the best by F1 (an epoch end: 6 or 12)
    assert {1, 2, 5, 12} <= set(steps) <= {1, 2, 5, 6, 12}
    assert json.loads((finetuned / "run.json").read_text())["config"]["checkpoint"] == {"log_spaced": 4}


@pytest.mark.slow  # the `finetuned` fixture, when run alone
def test_a_finetuning_workdir_is_tracked_from_its_init(finetuned, hf_dirs, flags, loads, tmp_path):
    out = tmp_path / "track"
    track.main(["--run", str(finetuned), "--with-init", "--out", str(out), *flags])
    steps = ckpt.available_steps(finetuned / ckpt.CHECKPOINTS)
    series = _run_json(out)["series"]
    assert [m["step"] for m in series] == [0, *steps]
    assert _run_json(out)["checkpoints"] == str((finetuned / ckpt.CHECKPOINTS).resolve())
    assert (series[0]["label"], series[0]["kind"], series[0]["given"]) == ("init", "hf", str(hf_dirs[0]))
    assert [s for _, s in loads] == [None, *steps]
    expected = _roles(["--ckpt", str(hf_dirs[0]), *flags], tmp_path / "init")
    pd.testing.assert_frame_equal(_rows(out, 0), expected, check_exact=True)
    expected = _roles(["--ckpt", str(finetuned), "--step", "5", *flags], tmp_path / "step5")
    pd.testing.assert_frame_equal(_rows(out, 5), expected, check_exact=True)


def test_with_init_needs_a_finetuning_run(shared_data, flags, tmp_path, cli_error):
    workdir = tmp_path / "pretraining"
    _tokenizer(shared_data).save_pretrained(workdir / "tokenizer")
    write_orbax(workdir, 3, seed=0, tokenizer="tokenizer", run_config={"train": {"steps": 3}})
    message = cli_error(track.main, ["--run", str(workdir), "--with-init", "--out", str(tmp_path / "out"), *flags])
    assert message == f"error: --with-init: {workdir} is not a fine-tuning run (its config names no init checkpoint)"


def test_a_negative_log_spaced_count_is_one_line(hf_dirs, shared_data, tmp_path, cli_error):
    argv = ["--task", "mrpc", "--ckpt", str(hf_dirs[0]), "--workdir", str(tmp_path / "run"),
            "--glue-dir", str(shared_data / "glue"), "checkpoint.log_spaced=-1"]  # fmt: skip
    assert cli_error(finetune.main, argv) == "error: checkpoint.log_spaced must be at least 0, got -1"
    assert not (tmp_path / "run").exists()
