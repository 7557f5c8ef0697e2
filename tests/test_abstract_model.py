"""`pretrained.abstract_model` (traced with one key for every parameter) against the traced
initialisation it replaced (`nnx.Rngs`, counted keys), and `from_pretrained` bitwise against the
checkpoint's arrays."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

import bertjax
from bertjax import convert, families, pretrained


def described(state: nnx.State) -> list:
    """Every leaf's path, variable type, shape, dtype and metadata."""
    return [
        (p, type(v), v.get_value().shape, v.get_value().dtype, v.get_metadata()) for p, v in nnx.to_flat_state(state)
    ]


CASES = [("bert", name) for name in families.FAMILIES["bert"].classes] + [("modernbert", "BertModel")]


@pytest.mark.parametrize(("model_type", "name"), CASES)
def test_abstract_model_is_the_counted_trace(model_type, name):
    config = bertjax.preset("tiny", model_type=model_type)
    cls = pretrained.model_class(name, config)
    graphdef, state = pretrained.abstract_model(cls, config)
    traced_graphdef, traced = nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(params=0))))
    assert described(state) == described(traced)
    # The graph takes a real initialisation's state (two graphs never compare equal: each holds its own
    # activation lambda).
    model = nnx.merge(graphdef, nnx.state(cls(config, rngs=nnx.Rngs(params=0))))
    assert type(model) is type(nnx.merge(traced_graphdef, traced))


def test_from_pretrained_holds_the_checkpoint_bitwise(minilm_path):
    model = bertjax.from_pretrained(minilm_path)
    stored = load_file(minilm_path / "model.safetensors")
    _, abstract = nnx.split(nnx.eval_shape(lambda: type(model)(model.config, rngs=nnx.Rngs(params=0))))
    expected, missing = convert.from_hf(abstract, stored, "model.safetensors", model.config.model_type)
    assert not missing
    loaded = dict(nnx.to_flat_state(nnx.state(model)))
    assert loaded.keys() == expected.keys()
    for path, value in expected.items():
        got = np.asarray(loaded[path].get_value())
        assert got.dtype == value.dtype and got.tobytes() == np.asarray(value).tobytes(), path
