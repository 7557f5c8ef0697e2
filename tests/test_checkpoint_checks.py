"""A checkpoint's config is checked against its weights before a model is built from it, and a
weight of a type no model parameter has is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bertjax

ROOT = Path(__file__).resolve().parents[1]


def _tiny_hf(directory: Path) -> Path:
    bertjax.save_pretrained(
        bertjax.init_model(bertjax.preset("tiny", vocab_size=50, max_position_embeddings=32)), directory
    )
    return directory


def test_a_config_claiming_more_layers_than_the_weights_hold_is_refused_at_once(tmp_path):
    """Probe 6.1: `"num_hidden_layers": 100000` over 2 layers of weights kept `python -m bertjax`
    tracing a 100,000-layer model for 15+ minutes (the timeout fails the test before the fix)."""
    directory = _tiny_hf(tmp_path / "hf")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 100000}))
    done = subprocess.run([sys.executable, "-m", "bertjax", "--ckpt", str(directory)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {directory / 'model.safetensors'}: the config says num_hidden_layers 100000, the weights hold 2 layers"
    ]


@pytest.mark.parametrize("kind", ["int8", "bool"])
def test_a_weight_that_is_not_floating_point_is_refused(tmp_path, kind):
    """Probe 6.6: `(w * 1000).astype(np.int8)` or `w > 0` in model.safetensors loaded silently."""
    from safetensors.numpy import load_file, save_file

    directory = _tiny_hf(tmp_path / "hf")
    tensors = load_file(directory / "model.safetensors")
    name = "encoder.layer.1.attention.self.query.weight"
    weight = tensors[name]
    tensors[name] = (weight * 1000).astype(np.int8) if kind == "int8" else weight > 0
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(bertjax.UserError) as error:
        bertjax.from_pretrained(directory)
    assert str(error.value) == (
        f"{directory / 'model.safetensors'}: tensor {name} is {kind}, not floating point; refusing to load it"
    )


def test_a_bertjax_step_is_checked_as_a_hf_directory_is(tmp_path, monkeypatch):
    """The same check on a training step, whose config and stored shapes are in its meta."""
    from test_track import write_checkpoint

    from bertjax import checkpoint as ckpt

    write_checkpoint(tmp_path, 1, seed=0)
    stored = ckpt.read_meta

    def claiming_seven_layers(path, step):
        meta = stored(path, step)
        return {**meta, "model_config": {**meta["model_config"], "num_hidden_layers": 7}}

    monkeypatch.setattr(ckpt, "read_meta", claiming_seven_layers)
    with pytest.raises(bertjax.UserError, match=r"the config says num_hidden_layers 7, the weights hold 2 layers"):
        bertjax.from_pretrained(tmp_path, step=1)
