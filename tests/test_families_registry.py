"""The model interface as a contract: a family is one module and one registry line
(`bertjax.families.FAMILIES`); a call's interventions are one typed pytree and what it records one
static setting, each read through at most six typed parameters.

The toy family below is written into a temporary package, registered with one line, and loaded by
`bertjax.from_pretrained` from a HF-format directory whose config.json names it. It is BERT's
embeddings and layers without the pooler, so on the same weights its hidden states and attentions
must equal BertModel's bit for bit (the same operations in the same order): any difference means
the registry routed something else (another class, other conversion rules, another config)."""

from __future__ import annotations

import inspect
import json
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax import families
from bertjax.config import BertConfig
from bertjax.convert import Rules
from bertjax.model import BertModel, Capture, Interventions, attend, model_options

TOY_MODULE = '''
"""A toy family: BERT's embeddings and layers through the shared encoder loop, no pooler."""

import jax.numpy as jnp

from bertjax.model import BertEmbeddings, BertEncoder, Model, encoder_output, model_options


class ToyEncoder(Model):
    def __init__(self, config, *, rngs):
        self.config = config
        self.embeddings = BertEmbeddings(config, rngs=rngs)
        self.encoder = BertEncoder(config, rngs=rngs)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, *, dropout_rng=None, **options):
        interventions, capture = model_options(options)
        mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
        types = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.embeddings(input_ids, types, position_ids)
        x, records = self.encoder(x, mask.astype(bool), interventions, capture, None)
        return encoder_output(x, None, records, capture)
'''

CONFIG = BertConfig(
    vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
    max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)  # fmt: skip


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy family registered (one line) from its module in a temporary package."""
    package = tmp_path / "toy_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(families.FAMILIES, "toy", families.Family("toy", "Toy", {"BertModel": "toy_package.toy:ToyEncoder"}, Rules("toy.", ("pooler.",)), "bertjax.config:BERT_ADAPTER", architecture="Toy", pooler=False))  # fmt: skip
    return families.FAMILIES["toy"]


@pytest.fixture
def saved(tmp_path):
    """A BERT saved in HF's format, then relabelled as the toy family in its config.json."""
    bert = bertjax.init_model(CONFIG, "BertModel", seed=3)
    directory = bertjax.save_pretrained(bert, tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "toy"
    (directory / "config.json").write_text(json.dumps(config))
    return bert, directory


def _batch():
    ids = jnp.asarray(np.random.default_rng(0).integers(1, CONFIG.vocab_size, size=(2, 9)), jnp.int32)
    mask = jnp.asarray([[1] * 9, [1] * 6 + [0] * 3], jnp.int32)
    return ids, mask


def test_a_family_registered_in_one_line_loads_and_runs_through_the_registry(toy, saved):
    bert, directory = saved
    model = bertjax.from_pretrained(directory)
    assert type(model).__name__ == "ToyEncoder" and model.config.family is toy
    assert model.config.to_hf_dict()["architectures"] == ["ToyModel"]
    ids, mask = _batch()
    ours = model(ids, mask, capture=Capture(attentions=True))
    reference = bert(ids, mask, output_attentions=True)
    assert ours.pooler_output is None
    np.testing.assert_array_equal(ours.last_hidden_state, reference.last_hidden_state)
    for a, b in zip(ours.attentions, reference.attentions, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_cli_loads_a_registered_family(toy, saved, capsys):
    """`python -m bertjax --ckpt DIR` (in this process, where the toy is registered) on the toy's
    directory with a WordPiece tokenizer of its 40 tokens beside the weights: no pooler line, since
    the toy has none."""
    from transformers import BertTokenizerFast

    from bertjax.__main__ import main

    _, directory = saved
    words = [f"w{i}" for i in range(CONFIG.vocab_size - 5)]
    (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    BertTokenizerFast(vocab_file=str(directory / "vocab.txt")).save_pretrained(directory)
    main(["--ckpt", str(directory), "--text", "w1 w2 w3", "--text-pair", "w4"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("toy: 2 layers × 2 heads, hidden 16")
    assert printed[1].startswith("tokens: [CLS] ") and len(printed[1].split()) == 1 + 7
    assert printed[2:] == ["last_hidden_state: (1, 7, 16)", "attentions: 2 × (1, 2, 7, 7)"]


def test_every_class_of_every_family_is_a_model():
    """The loaders' and the type checker's `Model` (built from a config, which it keeps) is what
    each registered class is."""
    from bertjax.model import Model

    for family in families.FAMILIES.values():
        for where in family.classes.values():
            assert issubclass(families.load(where), Model), where


def test_an_unregistered_family_is_one_line_naming_the_registry(saved):
    _, directory = saved
    with pytest.raises(bertjax.UserError, match=r"model_type 'toy' is not one of bert, roberta, electra, modernbert$"):
        bertjax.from_pretrained(directory)


def test_a_family_without_a_class_says_what_it_has(toy):
    with pytest.raises(bertjax.UserError, match=r"^BertForPreTraining is not available for model_type 'toy': bertjax has its encoder only \(BertModel, which loads as ToyEncoder\)$"):  # fmt: skip
        bertjax.init_model(CONFIG.replace(model_type="toy"), "BertForPreTraining")


def test_interventions_and_capture_equal_the_separate_arguments():
    """One `Interventions` value and one `Capture` give what the separate keyword arguments give,
    bit for bit; and layer(i) slices every field that is set, leaving the others None."""
    model = bertjax.init_model(CONFIG, "BertModel", seed=1)
    ids, mask = _batch()
    head_mask = jnp.asarray([[1.0, 0.0], [0.5, 1.0]])
    disable = jnp.asarray([[False, False], [True, False]])
    separate = model(ids, mask, head_mask=head_mask, disable_heads=disable, attention_norms=True)
    edit = Interventions(head_mask=head_mask, disable=disable)
    together = model(ids, mask, interventions=edit, capture=Capture(value_norms=True))
    for a, b in zip(
        separate.attentions + separate.value_norms, together.attentions + together.value_norms, strict=True
    ):
        np.testing.assert_array_equal(a, b)
    untouched = model(ids, mask, output_attentions=True)
    assert not np.array_equal(untouched.attentions[1], together.attentions[1])  # the edit did something
    layer = edit.layer(1)
    np.testing.assert_array_equal(layer.head_mask, head_mask[1])
    assert layer.offsets is None and edit.offsets is None


def test_mixing_the_two_spellings_is_refused():
    with pytest.raises(TypeError, match="inside interventions="):
        model_options({"interventions": Interventions(), "head_mask": jnp.ones((2, 2))})
    with pytest.raises(TypeError, match="inside capture="):
        model_options({"capture": Capture(), "output_attentions": True})
    with pytest.raises(TypeError, match="unexpected keyword argument 'head_masks'"):
        model_options({"head_masks": None})


@pytest.mark.parametrize("function", [BertModel.__call__, attend], ids=["BertModel.__call__", "attend"])
def test_the_model_interface_takes_at_most_six_typed_parameters(function):
    parameters = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    assert len(parameters) <= 6
    assert all(p.annotation is not inspect.Parameter.empty for p in parameters)
