"""Reliability round four (issue 52): a checkpoint's structure is checked against what it stores
before any model is built or traced, in every command that loads one (training too), and every
file of a checkpoint or tokenizer that a user can hand over is one line when it is not what it
claims to be.

The hangs run in a subprocess with a timeout well under CI's: before the fixes each traced a
100,000-layer model for minutes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orbax.checkpoint as ocp
import pytest
from flax import nnx
from test_reliability_inputs import _pretrain_argv, _with_config

import bertjax
from bertjax import checkpoint as ckpt
from bertjax.errors import UserError
from bertjax.pretrained import load_tokenizer, open_checkpoint

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 100000


def _refusal(file: Path, held: int) -> str:
    return f"{file}: the config says num_hidden_layers {LAYERS}, the weights hold {held} layers"


def _error_line(*argv: str) -> str:
    """The one line a `python -m ...` run ends with, checking that it exits 2 within 60 s."""
    done = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line and " WARNING " not in line]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def _embeddings_only(tiny_hf: Path, tmp_path: Path) -> Path:
    """A copy of the tiny checkpoint claiming 100,000 layers over its embeddings alone."""
    from safetensors.numpy import load_file, save_file

    directory = _with_config(tiny_hf, tmp_path, lambda config: {**config, "num_hidden_layers": LAYERS})
    tensors = load_file(tiny_hf / "model.safetensors")
    (directory / "model.safetensors").unlink()
    save_file({k: v for k, v in tensors.items() if k.startswith("embeddings.")}, directory / "model.safetensors")
    return directory


def test_a_config_claiming_layers_over_embeddings_only_is_refused_at_once(tiny_hf, tmp_path):
    directory = _embeddings_only(tiny_hf, tmp_path)
    assert _error_line("bertjax", "--ckpt", str(directory)) == f"error: {_refusal(directory / 'model.safetensors', 0)}"


def _orbax_step(workdir: Path, meta_edit=None, params_edit=None) -> Path:
    """A tiny training step (as the trainer writes one), its meta and params edited."""
    model = bertjax.init_model(bertjax.preset("tiny", max_position_embeddings=64), bertjax.BertForPreTraining)
    params = ckpt.flatten_params(nnx.state(model, nnx.Param))
    params = params if params_edit is None else params_edit(params)
    meta = ckpt.make_meta(model, "tokenizer", {})
    meta["param_shapes"] = {k: [list(v.shape), str(v.dtype)] for k, v in params.items()}
    meta = meta if meta_edit is None else meta_edit(meta)
    manager = ocp.CheckpointManager(workdir / ckpt.CHECKPOINTS, item_names=(ckpt.PARAMS, ckpt.META))
    manager.save(1, args=ocp.args.Composite(**ckpt.save_args(params, meta)))
    manager.wait_until_finished()
    manager.close()
    return workdir / ckpt.CHECKPOINTS / "1"


def test_an_orbax_step_claiming_layers_its_param_shapes_lack_is_refused_at_once(tmp_path):
    step = _orbax_step(
        tmp_path / "run",
        meta_edit=lambda m: {**m, "model_config": {**m["model_config"], "num_hidden_layers": LAYERS}},
        params_edit=lambda p: {k: v for k, v in p.items() if "/embeddings/" in f"/{k}"},
    )
    assert _error_line("bertjax", "--ckpt", str(tmp_path / "run")) == f"error: {_refusal(step, 0)}"


def test_a_vocabulary_other_than_the_stored_tables_is_refused_before_a_model_is_built(tiny_hf, tmp_path, monkeypatch):
    from bertjax import pretrained

    def no_model(*args):
        raise AssertionError("a model was built")

    monkeypatch.setattr(pretrained, "abstract_model", no_model)
    directory = _with_config(tiny_hf, tmp_path, lambda config: {**config, "vocab_size": 30000})
    with pytest.raises(UserError) as error:
        bertjax.from_pretrained(directory)
    assert str(error.value) == (
        f"{directory / 'model.safetensors'}: tensor embeddings.word_embeddings.weight has shape [30522, 128], "
        "the config's vocab_size and width need [30000, 128]"
    )


def test_finetuning_checks_the_structure_before_it_traces_the_model(tiny_hf, shared_data, tmp_path):
    """`train.finetune --ckpt` a 100,000-layer config over 2 layers of weights: nothing for 95 s."""
    directory = _with_config(tiny_hf, tmp_path, lambda config: {**config, "num_hidden_layers": LAYERS})
    line = _error_line("train.finetune", "--task", "mrpc", "--ckpt", str(directory), "--workdir",
                       str(tmp_path / "ft"), "--glue-dir", str(shared_data / "glue"))  # fmt: skip
    assert line == f"error: {_refusal(directory / 'model.safetensors', 2)}"
    assert not (tmp_path / "ft").exists()


def test_pretraining_from_a_checkpoint_checks_its_structure_before_any_data(tiny_hf, tmp_path):
    directory = _embeddings_only(tiny_hf, tmp_path)
    workdir = tmp_path / "work"
    line = _error_line("train.pretrain", *_pretrain_argv(workdir, f"train.init_from={directory}"))
    assert line == f"error: {_refusal(directory / 'model.safetensors', 0)}"
    assert not workdir.exists()


# -- tokenizer files --------------------------------------------------------------------------


def _with_file(tiny_hf: Path, tmp_path: Path, name: str, content) -> Path:
    directory = _with_config(tiny_hf, tmp_path, lambda config: config)
    (directory / name).unlink()
    (directory / name).write_text(json.dumps(content))
    return directory


def test_a_tokenizer_config_that_is_a_list_is_one_line(tiny_hf, tmp_path):
    directory = _with_file(tiny_hf, tmp_path, "tokenizer_config.json", [1, 2])
    with pytest.raises(UserError) as error:
        load_tokenizer(directory)
    file = directory / "tokenizer_config.json"
    assert str(error.value) == f"{file}: not a JSON object of config fields (it is a JSON list)"


@pytest.mark.parametrize(
    "content",
    [{"version": "1.0", "model": {"type": "WordPiece"}}, {"added_tokens": [], "model": {"type": "Nope"}}],
    ids=["another-schema", "unknown-model"],
)
def test_a_tokenizer_json_of_another_schema_is_one_line(content, tiny_hf, tmp_path):
    directory = _with_file(tiny_hf, tmp_path, "tokenizer.json", content)
    with pytest.raises(UserError, match=rf"^{directory}.*tokenizer"):
        load_tokenizer(directory)


# -- orbax metadata ---------------------------------------------------------------------------

CORRUPT_META = {
    "a-list": (lambda m: [m], "a JSON list, not an object"),
    "no-param-shapes": (lambda m: {k: v for k, v in m.items() if k != "param_shapes"},
                        "param_shapes is missing, not a JSON dict"),
    "model-config-a-list": (lambda m: {**m, "model_config": [1]}, "model_config is list, not a JSON dict"),
    "tokenizer-a-number": (lambda m: {**m, "tokenizer": 123}, "tokenizer is int, not a JSON str"),
    "dtype-garbage": (
        lambda m: {**m, "param_shapes": {k: [s, "garbage"] for k, (s, _) in m["param_shapes"].items()}},
        "has dtype 'garbage', which numpy does not know",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CORRUPT_META)
def test_corrupt_orbax_metadata_is_one_line(case, tmp_path):
    edit, expected = CORRUPT_META[case]
    step = _orbax_step(tmp_path / "run")
    metadata = step / ckpt.META / "metadata"
    metadata.write_text(json.dumps(edit(json.loads(metadata.read_text()))))
    for load in (bertjax.from_pretrained, load_tokenizer):
        with pytest.raises(UserError) as error:
            load(tmp_path / "run")
        assert str(error.value).startswith(f"{step}: unreadable checkpoint metadata (")
        assert expected in str(error.value)


# -- hub names ----------------------------------------------------------------------------------


def test_a_cached_repo_with_a_non_utf8_ref_leaves_a_failing_lookup_one_line(hub):
    refs = hub / "models--org--broken" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UserError) as error:
        open_checkpoint("org/absent")
    assert str(error.value).startswith("org/absent: not a local path, and the hub download failed (")
    assert str(error.value).endswith("; the local hub cache has no copy of it; pass a local path when offline")


def test_a_missing_path_under_a_local_folder_is_not_looked_up_on_the_hub(hub, tmp_path, monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for text in ("runs/nope", "a folder/with spaces"):
        with pytest.raises(UserError) as error:
            open_checkpoint(text)
        assert str(error.value) == f"{text}: no such checkpoint directory (not a local path, nor a hub repository id)"


# -- ablate --compare-ckpt ----------------------------------------------------------------------


@pytest.mark.parametrize("differ", ["size", "vocabulary"])
def test_ablate_refuses_to_compare_models_of_other_sizes_or_vocabularies(differ, shared_data, tmp_path, cli_error):
    from test_ablate import tiny_classifier
    from transformers import BertTokenizerFast

    from analysis import ablate

    words = (shared_data / "vocab" / "bert-base-uncased-vocab.txt").read_text().splitlines()
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"), do_lower_case=True)
    ckpt_dir, other = tmp_path / "ckpt", tmp_path / "other"
    bertjax.save_pretrained(tiny_classifier(), ckpt_dir)
    tokenizer.save_pretrained(ckpt_dir)
    if differ == "size":
        one_layer = bertjax.BertConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                                       intermediate_size=128, max_position_embeddings=128)  # fmt: skip
        bertjax.save_pretrained(bertjax.init_model(one_layer, "BertForSequenceClassification"), other)
        tokenizer.save_pretrained(other)
        expected = "a model of another size than --ckpt"
    else:
        bertjax.save_pretrained(tiny_classifier(), other)
        swapped = [*words[:2000], words[2001], words[2000], *words[2002:]]
        (tmp_path / "vocab.txt").write_text("\n".join(swapped) + "\n")
        BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"), do_lower_case=True).save_pretrained(other)
        expected = "its tokenizer's vocabulary differs from --ckpt"
    out = tmp_path / "out"
    line = cli_error(ablate.main, [
        "--ckpt", str(ckpt_dir), "--compare-ckpt", str(other), "--task", "mrpc", "--glue-dir", str(shared_data / "glue"),
        "--n", "4", "--analyses", "features", "--cache-dir", str(tmp_path / "cache"), "--out", str(out),
    ])  # fmt: skip
    assert line.startswith(f"error: --compare-ckpt {other}: ") and expected in line
    assert not out.exists()


def _dropping(file: Path, claimed: int, held: int) -> str:
    return (
        f"{file}: the config says num_hidden_layers {claimed}, the weights hold {held} layers; "
        f"refusing to drop the last {held - claimed} unread (the config must say {held})"
    )


def test_a_config_claiming_fewer_layers_than_the_weights_hold_is_refused(tiny_hf, tmp_path):
    """A config.json (or a training step's meta) claiming 1 layer over 2 layers of weights loaded
    the first layer and dropped the second without a word; no option asks for that drop."""
    directory = _with_config(tiny_hf, tmp_path, lambda config: {**config, "num_hidden_layers": 1})
    with pytest.raises(UserError) as refused:
        bertjax.from_pretrained(directory)
    assert str(refused.value) == _dropping(directory / "model.safetensors", 1, 2)
    step = _orbax_step(
        tmp_path / "run", meta_edit=lambda m: {**m, "model_config": {**m["model_config"], "num_hidden_layers": 1}}
    )
    with pytest.raises(UserError) as refused:
        bertjax.from_pretrained(tmp_path / "run")
    assert str(refused.value) == _dropping(step, 1, 2)
