"""The public pre-training series through huggingface_hub's own cache, offline: a stand-in of each
series' hub layout (MultiBERTs: a repo per step, `pytorch_model.bin` only; EarlyBERTs: a branch per
step; Chen et al.: a repo per step with the trainer's files beside; Ettin: a tag per step), read by
huggingface_hub itself with the hub unreachable (`HF_HUB_OFFLINE`, `HF_HUB_CACHE` at the stand-in).
`analysis.track` runs each series from the command docs/series.md gives for it; revisions and
`{step}` patterns, the errors naming what the cache holds, the scores cache keyed by commit, and
`--remove-downloads` deleting what a run downloaded and nothing else."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from test_track_series import commit, publish, write_hf

import bertjax
import bertjax.glue
from analysis import roles as roles_cli
from analysis import track
from analysis.heads import onset, series, tracking
from bertjax import pretrained

SERIES_DOC = Path(__file__).parents[1] / "docs" / "series.md"
# Small enough to score in a second a checkpoint: 2 layers × 2 heads of width 16.
TINY = {"hidden_size": 32, "intermediate_size": 64}
TRAINER_FILES = ("trainer_state.json", "training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth")


@pytest.fixture(scope="module")
def models(tmp_path_factory, shared_data) -> list[Path]:
    """Three tiny random BERTs for pre-training (`bert.` + `cls.` tensors, as the series publish
    them) with bert-base-uncased's tokenizer, in HF format."""
    root = tmp_path_factory.mktemp("models")
    made = []
    for seed in range(3):
        directory = write_hf(root / f"m{seed}", shared_data, seed)
        model = bertjax.init_model(
            bertjax.BertConfig.from_json_file(directory / "config.json", **TINY), "BertForPreTraining", seed
        )
        (directory / "model.safetensors").unlink()
        bertjax.save_pretrained(model, directory, overwrite=True)
        # The files a BERT repo keeps its tokenizer in besides tokenizer.json (MultiBERTs: vocab.txt alone).
        shutil.copy(shared_data / "vocab" / "bert-base-uncased-vocab.txt", directory / "vocab.txt")
        (directory / "special_tokens_map.json").write_text(json.dumps(
            {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"}))  # fmt: skip
        made.append(directory)
    return made


def torch_bin(directory: Path) -> None:
    """The checkpoint's weights as `pytorch_model.bin` (a state dict of tensors) instead of safetensors."""
    import torch
    from safetensors.numpy import load_file

    tensors = load_file(directory / "model.safetensors")
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}, directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()


def layout(model: Path, target: Path, keep: tuple[str, ...], weights: str, extra: tuple[str, ...] = ()) -> Path:
    """A series' files for one checkpoint: `keep` of the model's config and tokenizer files, its
    weights as `weights` (safetensors or a torch .bin) and `extra` files of junk bytes (the TF
    weights, the trainer's state) that nothing should read."""
    target.mkdir(parents=True)
    for name in keep:
        shutil.copy(model / name, target / name)
    shutil.copy(model / "model.safetensors", target / "model.safetensors")
    if weights == "bin":
        torch_bin(target)
    for name in extra:
        (target / name).write_bytes(b"not read: " + name.encode())
    return target


# Per series: where its command is in docs/series.md (a name in the command), how a checkpoint of
# step S is published, and the files of one checkpoint.
def multiberts(hub_root, models, work, steps):
    for model, step in zip(models, steps, strict=True):
        files = layout(model, work / f"mb{step}", ("config.json", "vocab.txt"), "bin", ("tf_model.h5",))
        publish(hub_root, f"google/multiberts-seed_0-step_{step}k", files, commit(f"mb{step}"))


def earlyberts(hub_root, models, work, steps):
    for model, step in zip(models, steps, strict=True):
        keep = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        files = layout(model, work / f"eb{step}", keep, "bin")
        main = ("main",) if step == steps[-1] else ()
        publish(hub_root, "personads/earlyberts-seed0", files, commit(f"eb{step}"), refs=(f"step{step}", *main))


def chen(hub_root, models, work, steps):
    for model, step in zip(models, steps, strict=True):
        keep = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        files = layout(model, work / f"chen{step}", keep, "bin", TRAINER_FILES)
        (files / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
        publish(hub_root, f"angie-chen55/bert-base-seed2-ckpt-{step}", files, commit(f"chen{step}"))


def ettin(hub_root, models, work, steps):
    # A BERT under Ettin's tags: the layout only (ModernBERT comes with the model code of issue 39).
    for model, step in zip(models, steps, strict=True):
        keep = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        files = layout(model, work / f"ettin{step}", keep, "safetensors")
        main = ("main",) if step == steps[-1] else ()
        publish(hub_root, "jhu-clsp/ettin-encoder-17m", files, commit(f"ettin{step}"), refs=(f"step{step}", *main))


TAGS = {multiberts: "mb", earlyberts: "eb", chen: "chen", ettin: "ettin"}
SERIES = {
    "google/multiberts-seed_0-step_{step}k": (multiberts, [20, 40, 60]),
    "personads/earlyberts-seed0#step{step}": (earlyberts, [10, 100, 1000]),
    "angie-chen55/bert-base-seed2-ckpt-{step}": (chen, [2000, 3000, 6000]),
    "jhu-clsp/ettin-encoder-17m#step{step}": (ettin, [1000, 2000, 4000]),
}


def documented(pattern: str) -> list[str]:
    """The argv of docs/series.md's `analysis.track` command over `pattern`."""
    page = SERIES_DOC.read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", page, re.DOTALL):
        for command in block.replace("\\\n", " ").splitlines():
            if command.startswith("python -m analysis.track") and f'"{pattern}"' in command:
                return shlex.split(command)[3:]
    raise AssertionError(f"docs/series.md has no analysis.track command over {pattern}")


@pytest.fixture
def work(tmp_path, shared_data, monkeypatch) -> Path:
    """A folder to run the documented commands from, seeing the shared data at ../shared/data."""
    folder = tmp_path / "work"
    folder.mkdir()
    (tmp_path / "shared").symlink_to(shared_data.parent)
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def fast(tmp_path) -> list[str]:
    """Flags appended to a documented command (argparse keeps an option's last value): fewer
    examples, one padded shape, no figures, a parse cache of the test's own."""
    return ["--n", "6", "--batch-size", "8", "--max-length", "32", "--no-figures",
            "--cache-dir", str(tmp_path / "parses")]  # fmt: skip


SAS_N = ["--sas-n", "6"]


class Downloads:
    """Serves weights as the hub would: `snapshot_download` of a weights pattern copies the file
    from a 'remote' copy into the cache (blob + snapshot link) when the snapshot lacks it, and
    records it; everything else is huggingface_hub's own offline reading of the cache."""

    def __init__(self, hub_root: Path, monkeypatch):
        import huggingface_hub

        self.remote: dict[Path, Path] = {}
        self.fetched: list[str] = []
        real = huggingface_hub.snapshot_download

        def snapshot_download(repo_id, revision=None, allow_patterns=None):
            path = Path(real(repo_id, revision=revision, allow_patterns=allow_patterns))
            for name in allow_patterns:
                for remote in [self.remote[p] for p in self.remote if p.parent == path and p.match(name)]:
                    link = path / remote.name
                    if not link.exists():
                        blob = path.parents[1] / "blobs" / f"fetched-{path.name}-{remote.name}"
                        shutil.copy(remote, blob)
                        link.symlink_to(Path("../..") / "blobs" / blob.name)
                        self.fetched.append(f"{repo_id}/{remote.name}")
            return str(path)

        monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)

    def withhold(self, snapshot: Path, keep: Path) -> None:
        """Takes the snapshot's weights out of the cache, kept in `keep` to be 'downloaded'."""
        for link in [*snapshot.glob("*.safetensors"), *snapshot.glob("pytorch_model.bin")]:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(link.resolve(), keep / link.name)
            link.resolve().unlink()
            link.unlink()
            self.remote[snapshot / link.name] = keep / link.name


# -- each series from its documented command ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("pattern", list(SERIES))
def test_each_series_runs_from_its_documented_command(pattern, hub, models, work, fast, tmp_path):
    build, steps = SERIES[pattern]
    build(hub, models, tmp_path / "files", steps)
    argv = documented(pattern)
    out = tmp_path / "out"
    # The documented steps are the real series'; the stand-in has three of them.
    track.main([*argv, "--steps", ",".join(map(str, steps)), "--out", str(out), *fast, *SAS_N])
    table = pd.read_csv(out / tracking.TRACK_CSV)
    assert sorted(pd.unique(table["step"])) == steps
    assert (out / onset.ONSET_CSV).is_file() and (out / onset.CURVE_ONSETS_CSV).is_file()
    run = json.loads((out / "run.json").read_text())
    repo = pretrained.split_revision(pattern)[0]
    assert [m["commit"] for m in run["series"]] == [commit(f"{TAGS[build]}{s}") for s in steps]
    assert [m["repo_id"] for m in run["series"]] == [repo.replace("{step}", str(s)) for s in steps]
    # Each member's rows are those of analysis.roles on that checkpoint alone, named as in the series.
    roles_out = tmp_path / "roles"
    roles_cli.main(["--ckpt", run["series"][1]["given"], *roles_flags(argv), *fast, "--out", str(roles_out)])
    rows = table[table["step"] == steps[1]].drop(columns="step").reset_index(drop=True)
    pd.testing.assert_frame_equal(rows, pd.read_csv(roles_out / "roles.csv"), check_exact=True)


def roles_flags(argv: list[str]) -> list[str]:
    """A track command's data and test flags, as analysis.roles takes them."""
    track_only = {"--ckpt": 1, "--steps": 1, "--sas": 1, "--sas-n": 1, "--out": 1, "--remove-downloads": 0}
    flags, i = [], 0
    while i < len(argv):
        if argv[i] in track_only:
            i += 1 + track_only[argv[i]]
            continue
        flags.append(argv[i])
        i += 1
    return flags


# -- revisions in Python and on the command line ---------------------------------------------------


EARLY = "personads/earlyberts-seed0"


def test_a_revision_names_a_branch_or_tag_in_python_and_on_every_command(hub, models, tmp_path, capsys):
    from bertjax import __main__ as bertjax_cli

    earlyberts(hub, models, tmp_path / "files", [10, 100, 1000])
    snapshot = hub / "models--personads--earlyberts-seed0" / "snapshots" / commit("eb100")
    by_revision = bertjax.from_pretrained(EARLY, revision="step100")
    by_mark = bertjax.from_pretrained(f"{EARLY}#step100")
    direct = bertjax.from_pretrained(snapshot)
    main = bertjax.from_pretrained(EARLY)  # refs/main: the last step
    embedding = lambda m: np.asarray(m.embeddings.word_embeddings.embedding.get_value())
    assert np.array_equal(embedding(by_revision), embedding(direct))
    assert np.array_equal(embedding(by_mark), embedding(direct))
    assert not np.array_equal(embedding(main), embedding(direct))
    assert np.array_equal(embedding(main), embedding(bertjax.from_pretrained(EARLY, revision=commit("eb1000"))))
    assert len(bertjax.load_tokenizer(EARLY, revision="step10")) == 30522
    source = pretrained.open_checkpoint(f"{EARLY}#step10")
    assert (source.repo_id, source.commit, source.path.parent.parent.name) == (
        EARLY,
        commit("eb10"),
        "models--personads--earlyberts-seed0",
    )
    # The CLIs pass the text through: `python -m bertjax REPO#REV`.
    bertjax_cli.main([f"{EARLY}#step1000"])
    assert "tokens: [CLS] the cat sat" in capsys.readouterr().out
    with pytest.raises(bertjax.UserError, match=r"names revision 'step10' and revision='step100' is given"):
        bertjax.from_pretrained(f"{EARLY}#step10", revision="step100")
    with pytest.raises(bertjax.UserError, match=r"is a local directory; a revision \(step10\) names a hub checkpoint"):
        bertjax.from_pretrained(snapshot, revision="step10")
    with pytest.raises(bertjax.UserError, match=r"a hub checkpoint has no step to choose"):
        bertjax.from_pretrained(EARLY, step=10)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["roles", "--ckpt", f"{EARLY}#step7"],
         f"error: {EARLY}#step7: not a local path, and the hub download failed (LocalEntryNotFoundError); "
         "the local hub cache has its revisions main, step10, step100, step1000"),
        (["track", "--ckpt", f"{EARLY}#step{{step}}", "--steps", "10,7"],
         f"error: --ckpt {EARLY}#step{{step}}: no checkpoint for step 7 ({EARLY}#step7: not a local path, and the hub "
         "download failed (LocalEntryNotFoundError); the local hub cache has its revisions main, step10, step100, "
         "step1000); steps in the local hub cache: 10, 100, 1000"),
        (["track", "--ckpt", "google/multiberts-seed_0-step_{step}k", "--steps", "20,60"],
         "error: --ckpt google/multiberts-seed_0-step_{step}k: no checkpoint for step 60 (google/multiberts-seed_0-step_60k: "
         "not a local path, and the hub download failed (LocalEntryNotFoundError); the local hub cache has no copy of it; "
         "pass a local path when offline); steps in the local hub cache: 20, 40"),
    ],
    ids=["wrong-revision", "missing-revision-step", "missing-repo-step"],
)  # fmt: skip
def test_a_wrong_revision_or_a_missing_step_is_one_line_naming_what_the_cache_holds(
    argv,
    expected,
    hub,
    models,
    fast,
    tmp_path,
    cli_error,
):
    earlyberts(hub, models, tmp_path / "eb", [10, 100, 1000])
    multiberts(hub, models[:2], tmp_path / "mb", [20, 40])
    main = {"roles": roles_cli.main, "track": track.main}[argv[0]]
    out = tmp_path / "out"
    flags = ["--task", "mrpc", "--glue-dir", str(Path(__file__).parents[2] / "shared" / "data" / "glue")]
    assert cli_error(main, [*argv[1:], *flags, *fast, "--out", str(out)]) == expected
    assert not out.exists()


@pytest.mark.slow
def test_the_step_in_the_repo_and_the_revision_and_a_list_mixing_sources(hub, models, fast, shared_data, tmp_path):
    # One repo per thousand steps, a tag per step in it (and a tag of another step that the
    # pattern, naming one step in both places, does not take).
    for model, k in zip(models, (1, 2), strict=False):
        files = layout(model, tmp_path / "files" / f"run{k}", ("config.json", "vocab.txt"), "safetensors")
        publish(hub, f"org/run{k}", files, commit(f"run{k}"), refs=("main", f"step{k}", "step9"))
    assert series.cached_steps("org/run{step}#step{step}") == [1, 2]
    assert series.cached_steps("org/run1#step{step}") == [1, 9]
    data = ["--task", "mrpc", "--glue-dir", str(shared_data / "glue")]
    out = tmp_path / "both"
    track.main(["--ckpt", "org/run{step}#step{step}", "--steps", "1,2", *data, *fast, "--out", str(out)])
    run = json.loads((out / "run.json").read_text())
    assert [(m["given"], m["commit"]) for m in run["series"]] == [
        ("org/run1#step1", commit("run1")),
        ("org/run2#step2", commit("run2")),
    ]

    # A list: a branch of one repo, a repo of another series, a local directory, each labelled.
    earlyberts(hub, models, tmp_path / "eb", [10, 100, 1000])
    members = [f"{EARLY}#step10@10", "org/run2@20", f"{models[2]}@30"]
    out = tmp_path / "list"
    track.main([a for m in members for a in ("--ckpt", m)] + [*data, *fast, "--out", str(out)])
    run = json.loads((out / "run.json").read_text())
    assert [(m["step"], m.get("commit")) for m in run["series"]] == [
        (10, commit("eb10")),
        (20, commit("run2")),
        (30, None),
    ]
    assert sorted(pd.unique(pd.read_csv(out / tracking.TRACK_CSV)["step"])) == [10, 20, 30]


# -- --remove-downloads ------------------------------------------------------------------------------


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_size for p in root.rglob("*") if not p.is_dir()}


@pytest.mark.slow
def test_remove_downloads_deletes_what_the_run_downloaded_and_nothing_else(
    hub, models, work, fast, tmp_path, monkeypatch
):
    """The documented MultiBERTs command (`--remove-downloads`) where the weights of steps 40 and
    60 come from the 'hub' during the run and step 20's were in the cache before it."""
    multiberts(hub, models, tmp_path / "files", [20, 40, 60])
    earlyberts(hub, models, tmp_path / "eb", [10, 100, 1000])  # another repo, not in the series
    downloads = Downloads(hub, monkeypatch)
    for step in (40, 60):
        snapshot = hub / f"models--google--multiberts-seed_0-step_{step}k" / "snapshots" / commit(f"mb{step}")
        downloads.withhold(snapshot, tmp_path / "remote" / str(step))
    before = _files(hub)
    argv = [
        *documented("google/multiberts-seed_0-step_{step}k"),
        "--steps",
        "20,40,60",
        *fast,
        "--out",
        str(tmp_path / "out"),
    ]
    track.main(argv)
    assert downloads.fetched == [f"google/multiberts-seed_0-step_{s}k/pytorch_model.bin" for s in (40, 60)]
    # Exactly what was there before: step 20's weights, every config and vocabulary, the other repo.
    assert _files(hub) == before

    # A re-run finds every step in the scores cache, keyed by commit: nothing is downloaded.
    track.main(argv)
    assert len(downloads.fetched) == 2
    assert json.loads((tmp_path / "out" / "run.json").read_text())["cached_steps"] == [20, 40, 60]
    # Other scoring settings need the weights again: fetched, scored and removed again.
    track.main([*argv, "--n", "5"])
    assert len(downloads.fetched) == 4 and _files(hub) == before


@pytest.mark.slow
def test_a_report_of_a_hub_series(hub, models, work, fast, tmp_path):
    from analysis import report

    earlyberts(hub, models, tmp_path / "files", [10, 100, 1000])
    out = tmp_path / "out"
    track.main([*documented(f"{EARLY}#step{{step}}"), "--steps", "10,100,1000", *fast, "--out", str(out)])
    report.main([str(out), "--examples", "1"])
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "The example attention maps are missing" not in page and "1000" in page


# -- Ettin as it is: ModernBERT models under tags ----------------------------------------------------


@pytest.mark.slow
def test_ettin_series_of_modernbert_models_under_tags(hub, work, fast, shared_data, tmp_path):
    """The documented Ettin command over tiny random ModernBERTs (transformers' ModernBertForMaskedLM,
    as Ettin's checkpoints are saved) with a byte-level BPE tokenizer in ModernBERT's layout."""
    import torch
    import transformers
    from test_sieves_tokenizers import train_bpe

    texts = [s for e in bertjax.glue.load_glue("mrpc", "dev", shared_data / "glue", 200) for s in e.segments]
    tokenizer = train_bpe(tmp_path / "tokenizer", texts, "modernbert")
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in (("cls", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"))}
    steps = [1000, 2000, 4000]
    for seed, step in enumerate(steps):
        config = transformers.ModernBertConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=128, local_attention=16, global_attn_every_n_layers=2, pad_token_id=ids["pad"],
            bos_token_id=ids["cls"], eos_token_id=ids["sep"], cls_token_id=ids["cls"], sep_token_id=ids["sep"],
        )  # fmt: skip
        torch.manual_seed(seed)
        files = tmp_path / "files" / str(step)
        transformers.ModernBertForMaskedLM(config).save_pretrained(files)
        tokenizer.save_pretrained(files)
        main = ("main",) if step == steps[-1] else ()
        publish(hub, "jhu-clsp/ettin-encoder-17m", files, commit(f"ettin{step}"), refs=(f"step{step}", *main))
    out = tmp_path / "out"
    track.main([*documented("jhu-clsp/ettin-encoder-17m#step{step}"), "--steps", "1000,2000,4000", *fast,
                "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out / tracking.TRACK_CSV)
    assert sorted(pd.unique(table["step"])) == steps and (out / onset.ONSET_CSV).is_file()
    assert set(table["layer"]) == {0, 1} and set(table["head"]) == {0, 1}


def test_online_a_wrong_revision_names_the_revisions_the_hub_lists(monkeypatch):
    """With the hub reachable, a revision it does not have is one line naming its branches and tags."""
    import huggingface_hub
    from huggingface_hub.utils import RevisionNotFoundError

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        raise RevisionNotFoundError.__new__(RevisionNotFoundError)  # as the hub client raises it (404)

    refs = SimpleNamespace(branches=[SimpleNamespace(name=n) for n in ("main", "step10", "step100")],
                           tags=[SimpleNamespace(name="v1")])  # fmt: skip
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_refs", lambda self, repo_id: refs)
    with pytest.raises(bertjax.UserError) as error:
        bertjax.from_pretrained(f"{EARLY}#step7")
    assert str(error.value) == (
        f"{EARLY}#step7: not a local path, and the hub download failed (RevisionNotFoundError); "
        "the hub has its revisions main, step10, step100, v1"
    )
