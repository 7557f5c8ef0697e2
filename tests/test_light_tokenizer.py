"""`load_tokenizer(light=True)`: the tokenizers library's tokenizer where it encodes as transformers'
would, and the encoding path (`sieves.align.backend_encode`) equal to transformers' own call."""

from __future__ import annotations

import json

import pytest

import bertjax
from bertjax.glue import load_glue
from bertjax.tokenization import LightTokenizer, light_tokenizer
from sieves.align import backend_encode, encode_batch

TASKS = ("qnli", "qqp", "mrpc", "sst2")


def backend_state(tokenizer) -> dict:
    """The backend as tokenizer.json holds it, truncation and padding aside (set on every call)."""
    return {
        k: v for k, v in json.loads(tokenizer.backend_tokenizer.to_str()).items() if k not in ("truncation", "padding")
    }


@pytest.fixture(scope="module")
def pair(minilm_path):
    return bertjax.load_tokenizer(minilm_path, light=True), bertjax.load_tokenizer(minilm_path)


def test_light_is_transformers_backend(pair):
    light, full = pair
    assert isinstance(light, LightTokenizer) and not isinstance(full, LightTokenizer)
    assert backend_state(light) == backend_state(full)
    assert len(light) == len(full) and light.get_vocab() == full.get_vocab()
    for name in ("cls_token_id", "sep_token_id", "unk_token_id", "pad_token_id", "mask_token_id", "bos_token_id",
                 "eos_token_id", "truncation_side", "split_special_tokens"):  # fmt: skip
        assert getattr(light, name) == getattr(full, name), name
    assert light.convert_ids_to_tokens([101, 2023, 102]) == full.convert_ids_to_tokens([101, 2023, 102])


@pytest.mark.parametrize("task", TASKS)
def test_same_encoding_as_transformers_on_glue(pair, shared_data, task):
    """Every dev example of the task (QQP's first 2,000), at the analyses' max length and a short
    one that truncates most pairs: the light tokenizer through `backend_encode` gives transformers'
    own call's ids, type ids, offsets and segment ids."""
    light, full = pair
    examples = load_glue(task, "dev", shared_data / "glue", n=2000)
    columns = [[e.segments[i] for e in examples] for i in range(len(examples[0].segments))]
    for max_length in (128, 24):
        ours = backend_encode(light, columns, max_length)
        theirs = full(*columns, truncation="longest_first", max_length=max_length, return_offsets_mapping=True,
                      return_token_type_ids=True, return_attention_mask=False)  # fmt: skip
        for row, e in enumerate(ours):
            assert e.ids == theirs["input_ids"][row]
            assert e.type_ids == theirs["token_type_ids"][row]
            assert e.offsets == [tuple(o) for o in theirs["offset_mapping"][row]]
            assert e.sequence_ids == theirs.sequence_ids(row)
    # Untruncated, no special tokens (the pieces-per-word count), after a truncating call.
    texts = columns[0][:500]
    ours = [e.ids for e in backend_encode(light, [texts], None, special=False)]
    assert ours == full(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]


def test_encode_batch_same_for_both(pair, shared_data):
    light, full = pair
    examples = load_glue("mrpc", "dev", shared_data / "glue", n=200)
    a = encode_batch(light, [e.segments for e in examples], None, 64)
    b = encode_batch(full, [e.segments for e in examples], None, 64)
    for x, y in zip(a, b, strict=True):
        for field in ("input_ids", "token_type_ids", "special", "is_cls", "is_sep", "word_ids"):
            assert (getattr(x, field) == getattr(y, field)).all(), field


def test_tiny_checkpoint_tokenizer_is_light(tiny_hf):
    """The uncased BERT vocabulary as transformers saves it (the tests' checkpoints)."""
    light, full = bertjax.load_tokenizer(tiny_hf, light=True), bertjax.load_tokenizer(tiny_hf)
    assert isinstance(light, LightTokenizer)
    assert backend_state(light) == backend_state(full)


@pytest.mark.parametrize(
    "change",
    [
        {"do_lower_case": False},  # the file's normalizer lower-cases: transformers would rebuild it
        {"tokenizer_class": "RobertaTokenizer"},
        {"additional_special_tokens": ["[X]"]},
        {"cls_token": {"content": "[CLS]"}},
    ],
)
def test_left_to_transformers_where_it_differs(minilm_path, tmp_path, change):
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (tmp_path / name).write_bytes((minilm_path / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | change))
    assert light_tokenizer(tmp_path) is None


def test_special_tokens_map_must_agree(minilm_path, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (tmp_path / name).write_bytes((minilm_path / name).read_bytes())
    named = json.loads((minilm_path / "special_tokens_map.json").read_text())
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(named))
    assert isinstance(light_tokenizer(tmp_path), LightTokenizer)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(named | {"additional_special_tokens": ["[X]"]}))
    assert light_tokenizer(tmp_path) is None


def test_vocab_txt_alone_goes_to_transformers(minilm_path, tmp_path):
    (tmp_path / "vocab.txt").write_bytes((minilm_path / "vocab.txt").read_bytes())
    assert light_tokenizer(tmp_path) is None
