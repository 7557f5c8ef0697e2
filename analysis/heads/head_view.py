"""One head's attention on a text of one's own (`analysis.api.head_view`), drawn by the report's page.

The input is a sentence or a pair; it is parsed and encoded as a run's sequences are, and scored
with the same forward pass and sieve kernel as the report's examples (`report.attention_and_scores`),
so the β shown is what `analysis.roles` would give this one sequence. The page is the report's with
one task holding this sequence and no tests (one sequence has no spread): every head's card shows
its β of each role on it, and the chosen head's card opens with the role's sieve marked from the
role's first scored token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from analysis.common.examples import make_parser, present_roles
from analysis.heads.config import RolesConfig
from analysis.heads.report import STAT_FIELDS, _numbers, _pack, _quantised, attention_and_scores, readable_checkpoint
from bertjax.errors import UserError
from bertjax.settings import fits
from sieves.align import encode_batch
from sieves.builders import get_role
from sieves.parse import parse_examples

# The page's one task: what the user typed.
TASK = "your text"
ROW_PIXELS = 15  # the report's line view: one token per 15 px


def frame_height(tokens: int) -> int:
    """Pixels that show the grid, the card and a line view of `tokens` tokens without scrolling."""
    return 420 + ROW_PIXELS * tokens


def segments_of(text: str | Sequence[str]) -> tuple[str, ...]:
    segments = (text,) if isinstance(text, str) else tuple(text) if isinstance(text, (list, tuple)) else ()
    if len(segments) not in (1, 2) or not all(isinstance(s, str) and s.strip() for s in segments):
        raise UserError(
            f"head_view: text must be a sentence or a pair of sentences (two non-empty strings), got {text!r}"[:300]
        )
    return segments


def check_request(text: str | Sequence[str], layer: int, head: int, role: str) -> None:
    """What can be checked before the model is loaded, each a line of its own."""
    segments_of(text)
    for name, value in (("layer", layer), ("head", head)):
        if not fits(value, int):  # a float was drawn as no head, text failed in numpy
            raise UserError(f"{name}: expected an integer, got {value!r}"[:300])
    get_role(role)  # an unknown role is the same one line as --roles'


def page_data(model, tokenizer, text: str | Sequence[str], layer: int, head: int, role: str,
              config: RolesConfig) -> dict:  # fmt: skip
    """The report page's data for one sequence, opened at (layer, head) on `role` (`check_request`'s
    checks made)."""
    segments = segments_of(text)
    if tokenizer is None:
        raise UserError("head_view: a loaded model needs its tokenizer (tokenizer=...)")
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    if not (0 <= layer < layers and 0 <= head < heads):
        raise UserError(
            f"head_view: layer {layer}, head {head} is not a head of this model ({layers} layers × {heads} heads)"
        )
    present, absent = present_roles([len(segments)], config.roles)
    if role not in present:
        raise UserError(f"head_view: role {role!r} is not defined for this input (a pair role needs two sentences)")
    parser = make_parser(config)
    parses = parse_examples(parser, [tuple(segments)]) if parser else None
    max_length = min(config.max_length, model.config.max_sequence_length)
    needed = len(tokenizer(*segments)["input_ids"])
    if needed > max_length:  # cut, the view would show a part of the text (or only [CLS] and [SEP])
        raise UserError(
            f"head_view: the text is {needed} tokens with [CLS] and [SEP], more than max_length {max_length}; raise "
            f"max_length (to at most {model.config.max_sequence_length}, this model's positions) or shorten the text"
        )
    (seq,) = encode_batch(tokenizer, [segments], parses, max_length)
    attention, scores, counts, rows, sieves = attention_and_scores(model, [seq], config, present, "head_view")
    n = seq.length
    stats = {}
    for r, name in enumerate(present):
        scored = counts[r, 0] > 0
        grid: dict[str, list[list]] = {f: [[None] * (layers * heads)] for f in STAT_FIELDS}
        grid["n"] = [[int(scored)] * (layers * heads)]
        grid["mean"] = [_numbers(scores[r, 0].astype(np.float64).ravel()) if scored else [None] * (layers * heads)]
        grid["assigned"] = [[False] * (layers * heads)]
        stats[name] = grid
    betas = {name: None if counts[r, 0] == 0 else _numbers(scores[r, 0].astype(np.float64).ravel())
             for r, name in enumerate(present)}  # fmt: skip
    settings = {"split": "your text", "n": 1, "max_length": max_length, "window": config.window,
                "test": "none (one sequence: β only)", "correction": "none", "parser": config.parser}  # fmt: skip
    sequence = {
        "index": 0,
        "tokens": tokenizer.convert_ids_to_tokens(seq.input_ids.tolist()),
        "segments": seq.token_type_ids.tolist(),
        "attention": {"model": _quantised(attention[:, 0, :, :n, :n])},
        "beta": {"model": betas},
        "rows": {name: np.flatnonzero(rows[r, 0, :n]).tolist() for r, name in enumerate(present)},
        "sieves": {name: _pack(sieves[r, 0, :n, :n]) for r, name in enumerate(present)},
    }
    return {
        "kind": "roles",
        "title": f"layer {layer}, head {head}: {role} on your text",
        "run_dir": "head_view",
        "checkpoint": readable_checkpoint(config.ckpt),
        "layers": layers,
        "heads": heads,
        "tasks": [TASK],
        "roles": present,
        "coarse": {r: get_role(r).coarse for r in present},
        "steps": None,
        "posts": None,
        "alpha": config.alpha,
        "tau": config.tau,  # the default: a head view takes no --tau (a number; "auto" needs a run's scores)
        "settings": settings,
        "split_tasks": [],
        "stats": {TASK: stats},
        "examples": {TASK: {"sequences": [sequence], "absent": absent, "models": ["model"]}},
        "examples_missing": None,
        "coref": None,
        "report": {"examples": 1},
        "open": {"layer": layer, "head": head, "role": role},
    }
