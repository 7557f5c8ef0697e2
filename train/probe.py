"""Role probes and SAS inside pre-training: heads watched taking on roles while the run goes.

A fixed probe set (the first `n` dev examples of a GLUE task, the first `n` lines of a `text:FILE`,
or the first `n` gold trees of a `conllu:FILE`) is read, parsed and encoded once, when the run
starts, with its sieve masks built and put on the devices; every `every` steps and at every
checkpoint save the training params score it with the analyses' jitted forward + sieve kernel
(`sieves.kernel`), in float32 as `analysis.track` loads a checkpoint, and each role is tested as
`analysis.track` tests it (`sieves.stats`: one-sided t-test of H0 mean β ≤ τ, p < α, no
correction). Logged beside the loss (metrics.jsonl, TensorBoard), per role: `probe/<role>/heads`
(heads holding the role), `probe/<role>/max_beta` and its `max_layer`, `max_head` (0-based), and
`probe/<role>/n` (sequences with a scored row). The batches are `analysis.track`'s (length-sorted,
`batch_size` rows, padded to a multiple of 32 tokens), so the numbers equal its on the same
checkpoint and settings (tests/test_probe.py).

On gold trees (`conllu:FILE`) the same forward pass also gives SAS (Chen et al. 2023's syntactic
attention structure, `sieves.depattn`), unless `sas: false`: the attention is pooled to words
(`sieves.wordattn`) and each word's predicted head taken on the device, the arcs counted on the
host, and logged: `probe/sas` (the best head's UAS over all words), `probe/sas/layer`,
`probe/sas/head`, `probe/sas/direction` (0 dep2head, 1 head2dep), `probe/sas/baseline_uas` and
`probe/sas/baseline_offset` (the best fixed offset), `probe/sas/count` (words scored), and the same
under `probe/sas/<relation>` for each of `sas_relations` — `analysis.track --sas`'s `sas.csv` rows.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bertjax import checkpoint as ckpt
from bertjax import glue
from bertjax.errors import UserError
from bertjax.model import BertModel
from bertjax.pretrained import abstract_model
from bertjax.readings import ATTENTION_READINGS, attention_rows
from sieves import depattn, stats
from sieves.align import MIN_LENGTH, EncodedSequence, batches, bucketed, encode_batch, pad_batch
from sieves.builders import SieveOptions, build_batch, get_role, present_roles
from sieves.kernel import sieve_scores
from sieves.parse import TEXT_PREFIX, SpacyParser, parse_examples, read_conllu, read_text_examples
from sieves.wordattn import pooling_batch, word_maps
from train.config import ProbeConfig

log = logging.getLogger(__name__)

CONLLU_PREFIX = "conllu:"


def sas_enabled(config: ProbeConfig) -> bool:
    gold = config.task is not None and config.task.startswith(CONLLU_PREFIX)
    return gold if config.sas is None else config.sas


def check_config(config: ProbeConfig, positions: int) -> None:
    """The probe section's errors, one line each, before the run does any work; `positions`: the
    model's position embeddings."""
    if config.task is None:
        return
    task = config.task
    for prefix in (TEXT_PREFIX, CONLLU_PREFIX):
        if task.startswith(prefix) and not Path(task[len(prefix) :]).expanduser().is_file():
            raise UserError(f"probe.task {task}: {task[len(prefix) :]} is not a file")
    if not task.startswith((TEXT_PREFIX, CONLLU_PREFIX)) and task not in glue.TASKS:
        raise UserError(
            f"probe.task: {task!r} is none of {', '.join(glue.TASKS)}, text:FILE (one example per line) or "
            "conllu:FILE (gold trees)"
        )
    for key, least in (("n", 1), ("batch_size", 1), ("every", 1), ("max_length", MIN_LENGTH)):
        if getattr(config, key) < least:
            raise UserError(f"probe.{key} must be at least {least}, got {getattr(config, key)}")
    if config.max_length > positions:
        raise UserError(f"probe.max_length {config.max_length} exceeds the model's {positions} positions")
    if config.test not in ("t", "z", "bootstrap"):
        raise UserError(f"probe.test must be one of t, z, bootstrap, got {config.test!r}")
    if config.correction not in ("none", "holm", "bh"):
        raise UserError(f"probe.correction must be one of none, holm, bh, got {config.correction!r}")
    if not config.roles:
        raise UserError("probe.roles: name at least one role")
    for role in config.roles:
        try:
            get_role(role)
        except UserError as e:
            raise UserError(f"probe.roles: {e}") from None
    if len(set(config.roles)) < len(config.roles):
        raise UserError(f"probe.roles names a role twice: {','.join(config.roles)}")
    if not math.isfinite(config.tau) or config.tau < 0:  # below 0 every head passes: β is never negative
        raise UserError(f"probe.tau must be a finite number ≥ 0, got {config.tau}")
    if not 0.0 < config.alpha < 1.0:
        raise UserError(f"probe.alpha must be in (0, 1), got {config.alpha}")
    if config.attention not in ATTENTION_READINGS:
        raise UserError(f"probe.attention must be one of {', '.join(ATTENTION_READINGS)}, got {config.attention!r}")
    if config.sas and not task.startswith(CONLLU_PREFIX):
        raise UserError(f"probe.sas needs gold trees: probe.task must be conllu:FILE, got {task}")
    if config.sas_relations and not sas_enabled(config):
        raise UserError("probe.sas_relations: SAS is off (probe.sas: false)")
    if depattn.ALL_RELATIONS in config.sas_relations:
        raise UserError("probe.sas_relations: the overall SAS (all) is always logged; name relations such as nsubj")
    if len(set(config.sas_relations)) < len(config.sas_relations):
        raise UserError(f"probe.sas_relations names a relation twice: {','.join(config.sas_relations)}")


@dataclasses.dataclass
class ProbeSet:
    """The probe examples as read and parsed, before encoding (the tokenizer may not exist yet)."""

    segments: list[tuple[str, ...]]
    parses: list[tuple] | None
    indices: list[int]

    def encode(self, tokenizer, max_length: int) -> list[EncodedSequence]:
        return encode_batch(tokenizer, self.segments, self.parses, max_length, self.indices)


def read_probe_set(config: ProbeConfig) -> ProbeSet:
    """The probe set, read and parsed (spaCy only when a requested role needs parses; CoNLL-U trees
    come with the file): the sequences `analysis.track` reads for the same task."""
    task = config.task
    assert task is not None  # a run without a probe task reads no probe set
    if task.startswith(CONLLU_PREFIX):
        path = Path(task[len(CONLLU_PREFIX) :]).expanduser()
        sentences = read_conllu(path, limit=config.n)
        arcs = {w.dep for _, words in sentences for i, w in enumerate(words) if w.head != i}
        for relation in config.sas_relations:
            if relation not in arcs:
                raise UserError(
                    f"probe.sas_relations: no {relation} arc in the first {len(sentences)} trees of {path}; "
                    f"there: {', '.join(sorted(arcs))}"
                )
        probed_roles(config, [1] * len(sentences))
        return ProbeSet([(text,) for text, _ in sentences], [(words,) for _, words in sentences],
                        list(range(len(sentences))))  # fmt: skip
    if task.startswith(TEXT_PREFIX):
        segments, _ = read_text_examples(Path(task[len(TEXT_PREFIX) :]).expanduser(), config.n)
        indices = list(range(len(segments)))
    else:
        glue_dir = None if config.glue_dir is None else Path(config.glue_dir).expanduser()
        examples = glue.load_glue(task, "dev", glue_dir, config.n)
        segments = [e.segments for e in examples]
        indices = [e.index for e in examples]
    probed_roles(config, [len(s) for s in segments])  # before anything is parsed, or data prepared
    parses = None
    if any(get_role(r).needs_parse for r in config.roles):
        parser = SpacyParser(config.spacy_model, cache_dir=Path(config.parse_cache).expanduser())
        parses = parse_examples(parser, segments)
    return ProbeSet(segments, parses, indices)


def probed_roles(config: ProbeConfig, segment_counts) -> tuple[list[str], list[str]]:
    """(the requested roles defined on the probe set, those that are not): one line if none is."""
    roles, absent = present_roles(segment_counts, config.roles)
    if not roles:
        raise UserError(f"probe.roles: {', '.join(absent)} need sentence pairs, and {config.task} has none")
    return roles, absent


class RoleProbe:
    """The Trainer's probe hook: `probe(step, params)` → the `probe/...` metrics of `params`."""

    def __init__(self, config: ProbeConfig, sequences: list[EncodedSequence], trainer) -> None:
        self.config = config
        self.roles, absent = probed_roles(config, (s.num_segments for s in sequences))
        if absent:
            log.info("probe: %s not defined on %s (single segments): not probed", ", ".join(absent), config.task)
        # Scored in float32 whatever the training's compute dtype, as `analysis.track` loads a
        # checkpoint, so the logged numbers are the analysis's.
        self.encoder = dataclasses.replace(trainer.config, dtype="float32")
        self.graphdef, self.abstract = abstract_model(BertModel, self.encoder)
        self.names = {name: f"bert{ckpt.SEP}{name}" for name in ckpt.flatten_params(self.abstract)}
        missing = sorted(set(self.names.values()) - set(trainer.abstract_params))
        if missing:
            raise ValueError(f"the trained model has no encoder tensor {missing[0]}")
        replicated = NamedSharding(trainer.mesh, PartitionSpec())
        options = SieveOptions()
        self.sas = sas_enabled(config)
        self.batches = []
        for chunk in batches(sequences, config.batch_size):
            length = min(bucketed(max(s.length for s in chunk)), config.max_length)
            arrays = pad_batch(chunk, config.batch_size, length)
            rows = np.zeros((len(self.roles), config.batch_size, length), bool)
            sieves = np.zeros((len(self.roles), config.batch_size, length, length), bool)
            rows[:, : len(chunk)], sieves[:, : len(chunk)] = build_batch(chunk, self.roles, options, length)
            inputs = (arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], rows, sieves)
            trees, pooling = [], None
            if self.sas:
                words = pooling_batch(chunk, config.batch_size, length)
                present = words.present
                pooling = (words.from_words, words.to_words, present)
                trees = [(s.word_dep, s.word_head, present[b, : len(s.word_dep)]) for b, s in enumerate(chunk)]
            # Every process holds the whole set; placed once, replicated, for every probe.
            placed = jax.tree.map(lambda x: jax.make_array_from_process_local_data(replicated, x), (inputs, pooling))
            self.batches.append((len(chunk), *placed, trees))
        self.score = jax.jit(self._score, out_shardings=replicated)
        self.seconds = 0.0

    def _score(self, params, inputs, pooling):
        """(β scores, scored-row counts) of every role and, with `pooling`, each word's predicted
        head in both directions [2, B, L, H, W] (`sieves.depattn.predicted_heads`)."""
        input_ids, attention_mask, token_type_ids, rows, sieves = inputs
        state = ckpt.unflatten_params(self.abstract, {name: params[key] for name, key in self.names.items()})
        reading = self.config.attention
        out = nnx.merge(self.graphdef, state)(
            input_ids, attention_mask, token_type_ids, output_attentions=True, attention_norms=reading == "norms"
        )
        attentions, key_weights = attention_rows(out, reading)
        scores = sieve_scores(attentions, attention_mask.astype(bool), rows, sieves, key_weights=key_weights)
        if pooling is None:
            return scores, None
        from_words, to_words, present = pooling
        # SAS reads the weights whatever `attention` says, as analysis.track --sas does.
        maps = word_maps(jnp.stack(out.attentions, axis=1), from_words, to_words)  # [B, L, H, W, W]
        # Only the argmax leaves the device, not the maps; padded word slots own no piece.
        heads = depattn.predicted_heads(maps, present[:, None, None, :], jnp)
        return scores, jnp.moveaxis(heads, 1, 0).astype(jnp.int32)

    def scores(self, params) -> tuple[dict[str, np.ndarray], depattn.DependencyCounts | None]:
        """role → per-sequence scores [n_f, L, H] of the sequences with a scored row (batch order),
        and the SAS counts (None when SAS is off)."""
        kept: dict[str, list[np.ndarray]] = {role: [] for role in self.roles}
        counts = None
        if self.sas:
            counts = depattn.sas_counts(self.encoder.num_hidden_layers, self.encoder.num_attention_heads)
        for size, inputs, pooling, trees in self.batches:
            (scores, rows), predicted = jax.device_get(self.score(params, inputs, pooling))
            for r, role in enumerate(self.roles):
                kept[role].append(scores[r, :size][rows[r, :size] > 0])
            if counts is not None:
                for (word_dep, word_head, present), heads in zip(trees, predicted[:size], strict=True):
                    counts.add(word_dep, word_head, present, heads)
        return {role: np.concatenate(parts) for role, parts in kept.items()}, counts

    def __call__(self, step: int, params: dict[str, jax.Array]) -> dict[str, float]:
        # The steps dispatched before this one finish first: their time is the training's.
        jax.block_until_ready(params)
        started = time.perf_counter()
        scores, counts = self.scores(params)
        # check_config admitted no other test or correction.
        test, correction = cast(stats.Test, self.config.test), cast(stats.Correction, self.config.correction)
        metrics = summarise(scores, self.config.tau, self.config.alpha, test, correction)
        if counts is not None:
            metrics |= summarise_sas(depattn.sas_table(counts), self.config.sas_relations)
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        return metrics | {"probe/seconds": elapsed}


def summarise(
    scores: dict[str, np.ndarray],
    tau: float,
    alpha: float,
    test: stats.Test = "t",
    correction: stats.Correction = "none",
) -> dict[str, float]:
    """Per role: the heads holding it (one-sided test of mean β > τ, p < α, p corrected over the
    step's tests with `correction`), the largest mean β and its (layer, head), and the sample
    size; `probe/tests`: how many tests the step made."""
    metrics: dict[str, float] = {}
    tests = {role: stats.one_sided_test(x, tau, axis=0, test=test, alpha=alpha) for role, x in scores.items()}
    roles = list(tests)
    adjusted = stats.adjust_pvalues(np.stack([tests[r].p_value for r in roles]) if roles else np.zeros(0), correction)
    for i, role in enumerate(roles):
        x, result = scores[role], tests[role]
        metrics[f"probe/{role}/n"] = x.shape[0]
        metrics[f"probe/{role}/heads"] = int(stats.assign(adjusted[i], alpha).sum())
        if x.shape[0] and np.isfinite(result.mean).all():
            layer, head = np.unravel_index(int(np.argmax(result.mean)), result.mean.shape)
            metrics[f"probe/{role}/max_beta"] = float(result.mean[layer, head])
            metrics[f"probe/{role}/max_layer"] = int(layer)
            metrics[f"probe/{role}/max_head"] = int(head)
    metrics["probe/tests"] = int(np.isfinite(adjusted).sum()) if roles else 0
    return metrics


def summarise_sas(table: pd.DataFrame, relations: list[str]) -> dict[str, float]:
    """`probe/sas` and its head, direction and baseline from the "all" row of `sas_table`, and the
    same under `probe/sas/<relation>` for `relations` (one the probe set kept no arc of after
    truncation is left out)."""
    metrics: dict[str, float] = {}
    rows = table.set_index("relation")
    for relation in (depattn.ALL_RELATIONS, *relations):
        if relation not in rows.index:
            continue
        row = rows.loc[relation]
        prefix = "probe/sas" if relation == depattn.ALL_RELATIONS else f"probe/sas/{relation}"
        metrics[prefix] = float(row["uas"])
        metrics[f"{prefix}/layer"] = int(row["layer"])
        metrics[f"{prefix}/head"] = int(row["head"])
        metrics[f"{prefix}/direction"] = depattn.DIRECTIONS.index(row["direction"])
        metrics[f"{prefix}/baseline_uas"] = float(row["baseline_uas"])
        metrics[f"{prefix}/baseline_offset"] = int(row["baseline_offset"])
        metrics[f"{prefix}/count"] = int(row["count"])
    return metrics
