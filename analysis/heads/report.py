"""The data of `report.html` (`python -m analysis.report`): a run's statistics as its table has
them, the example attention computed from its checkpoint, and the page written atomically.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pandas as pd

from analysis.common.examples import CONLLU_TASK, examples_for, make_parser, parse_segments
from analysis.heads.config import RolesConfig
from analysis.heads.report_page import render
from bertjax import runinfo
from bertjax.errors import UserError
from bertjax.pretrained import from_pretrained, load_tokenizer
from sieves.align import EncodedSequence, encode_batch, pad_batch
from sieves.builders import SieveOptions, build_batch, get_role, present_roles
from sieves.kernel import sieve_scores

log = logging.getLogger(__name__)

REPORT = "report.html"

# The table that says which analysis wrote a directory.
TABLES = {"roles": "roles.csv", "track": "track.csv", "effect": "head_means.csv"}

# Per-head GAP coreference accuracy (`analysis.clark --analyses coref`), shown on the head cards.
COREF_TABLE = "coref_heads.csv"

STAT_FIELDS = ("n", "mean", "std", "ci_low", "ci_high", "t", "p_value", "p_adjusted", "assigned")

# Sequences longer than this make unreadable line views and large pages; the pool is drawn from
# the shorter ones (the shortest are taken when none is this short).
MAX_SHOWN_TOKENS = 64

# The pool is picked from the first this many short sequences: one small forward pass.
CANDIDATES = 32


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    run_dir: str
    examples: int = 4
    out: str | None = None
    coref: str | None = None

    def __post_init__(self) -> None:
        if self.examples < 0:
            raise UserError(f"--examples must be at least 0, got {self.examples}")

    @property
    def path(self) -> Path:
        return Path(self.out).expanduser() if self.out else Path(self.run_dir).expanduser() / REPORT


@dataclasses.dataclass
class Run:
    """An analysis output as read: its kind, table, run.json and the settings it ran with."""

    kind: str
    directory: Path
    table: pd.DataFrame
    info: dict
    settings: RolesConfig


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
    config = info.get("config") if isinstance(info, dict) else None
    if kind == "track" and isinstance(config, dict):
        config = config.get("roles")
    elif kind == "effect" and isinstance(config, dict):
        config = config.get("data")
    if not isinstance(config, dict) or "ckpt" not in config:
        raise UserError(f"{directory / 'run.json'}: no analysis settings in it (config.ckpt missing)")
    needed = {"roles": {"task", "layer", "head", "role", *STAT_FIELDS}, "track": {"step", "task", "layer", "head", "role", *STAT_FIELDS},
              "effect": {"post_ckpt", "task", "layer", "head", "role", "n", "pre", "post"}}[kind]  # fmt: skip
    missing = sorted(needed - set(table.columns))
    if missing or table.empty:
        raise UserError(
            f"{directory / TABLES[kind]}: not the table analysis.{kind} writes (missing columns: {', '.join(missing) or 'no rows'})"
        )
    return Run(kind, directory, table, info, settings_of(config))


def settings_of(config: dict) -> RolesConfig:
    """The run's RolesConfig from its run.json (keys this version does not know are ignored)."""
    known = {f.name for f in dataclasses.fields(RolesConfig)}
    values = {k: v for k, v in config.items() if k in known}
    if "roles" in values:
        values["roles"] = tuple(values["roles"])
    return RolesConfig(**values)


def _numbers(values: np.ndarray) -> list:
    """JSON numbers; NaN (no test) as null."""
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values.tolist()]


def grid_of(rows: pd.DataFrame, column: str, layers: int, heads: int) -> list:
    """`column` of one (task, role[, step]) as a flat layer-major [L·H] list."""
    flat = np.full(layers * heads, np.nan, dtype=object)
    flat[(rows["layer"] * heads + rows["head"]).to_numpy()] = rows[column].to_numpy()
    out = []
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
        cos_path = run.directory / "attention_similarity.csv"
        cosine = pd.read_csv(cos_path) if cos_path.is_file() else None
        for task in pd.unique(table["task"]):
            data[task] = {}
            for post in pd.unique(table["post_ckpt"]):
                part = table[(table["task"] == task) & (table["post_ckpt"] == post)]
                if part.empty:
                    continue
                entry = {"roles": {r: {f: grid_of(g, f, layers, heads) for f in ("n", "pre", "post")}
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
            role: {f: [grid_of(s, f, layers, heads) for _, s in g.groupby("step", sort=True)] for f in STAT_FIELDS}
            for role, g in part.groupby("role", sort=False)
        }
    return data


@dataclasses.dataclass
class Model:
    """A model whose attention the report shows, under the name the page gives it."""

    name: str
    ckpt: str
    step: int | None = None


def models_of(run: Run) -> list[Model]:
    config = run.info["config"]
    if run.kind == "roles":
        return [Model("model", run.settings.ckpt, run.settings.step)]
    if run.kind == "track":
        last = int(run.table["step"].max())
        return [Model(f"step {last}", run.settings.ckpt, last)]
    return [Model("pre", run.settings.ckpt)] + [Model(p["label"], p["ckpt"]) for p in config.get("posts", [])]


def _pack(bits: np.ndarray) -> str:
    return base64.b64encode(np.packbits(bits.astype(bool).ravel()).tobytes()).decode()


def _quantised(attention: np.ndarray) -> str:
    """Attention probabilities as bytes (k/255): the pictures need no more, and the page stays small."""
    return base64.b64encode(np.round(np.clip(attention, 0, 1) * 255).astype(np.uint8).tobytes()).decode()


def attention_and_scores(model, seqs: Sequence[EncodedSequence], settings: RolesConfig, present: Sequence[str]):
    """(attention [L, B, H, T, T], β [R, B, L, H], scored-row counts [R, B], rows, sieves) of `seqs`
    padded to one length, for the roles `present`, as the run computed them."""
    length = max(s.length for s in seqs)
    arrays = pad_batch(seqs, len(seqs), length)
    out = model(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"], output_attentions=True)
    attention = jnp.stack(out.attentions)
    rows, sieves = build_batch(
        seqs, present, SieveOptions(settings.window, settings.special_rows, settings.block_first_sep == "b"), length
    )
    scores, counts = sieve_scores(attention, jnp.asarray(arrays["attention_mask"], bool), rows, sieves)
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


def task_examples(run: Run, task: str, loaded: list[tuple[Model, object]], tokenizer, parser, size: int) -> dict:
    settings = run.settings
    segments, indices, _ = examples_for(settings, task)
    plain = encode_batch(tokenizer, segments, None, settings.max_length, indices)
    short = [i for i, s in enumerate(plain) if s.length <= MAX_SHOWN_TOKENS]
    candidates = (short or sorted(range(len(plain)), key=lambda i: plain[i].length))[:CANDIDATES]
    chosen_segments = [segments[i] for i in candidates]
    if task == CONLLU_TASK:
        every = parse_segments(settings, task, segments, parser)
        parses = [every[i] for i in candidates]
    else:
        parses = parse_segments(settings, task, chosen_segments, parser) if parser else None
    seqs = encode_batch(tokenizer, chosen_segments, parses, settings.max_length, [indices[i] for i in candidates])
    present, absent = present_roles((s.num_segments for s in seqs), settings.roles)
    layers, heads = loaded[0][1].config.num_hidden_layers, loaded[0][1].config.num_attention_heads
    computed = {m.name: attention_and_scores(model, seqs, settings, present) for m, model in loaded}
    _, first_scores, counts, rows, sieves = computed[loaded[0][0].name]
    pool = pick_pool(first_scores, counts, held_roles(run, task, present, layers, heads), size)
    shown = []
    for c in pool:
        seq = seqs[c]
        n = seq.length
        shown.append(
            {
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
        )
    return {"sequences": shown, "absent": absent, "models": [m.name for m, _ in loaded]}


def examples_data(run: Run, tasks: Sequence[str], size: int) -> tuple[dict, str | None]:
    """({task: example sequences}, None) or ({}, why there are none)."""
    if size == 0:
        return {}, "no example sequences were asked for (--examples 0)"
    changed = changed_data_files(run.info.get("data_files") or {})
    if changed:
        return _missing(f"the data file {changed} is gone or differs from the one the run read (sha256 in run.json)")
    models = models_of(run)
    try:
        loaded = [(m, from_pretrained(m.ckpt, step=m.step)) for m in models]
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
    print(f"report: no example attention maps: {reason}")
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
    run directory's own; None when neither has one."""
    directory = Path(config.coref).expanduser() if config.coref else run.directory
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
    if len(table) != layers * heads or table["layer"].max() + 1 != layers or table["head"].max() + 1 != heads:
        raise UserError(f"{path}: its heads are not this run's {layers} layers × {heads} heads")
    number = lambda v: None if pd.isna(v) else float(v)
    return {
        "source": str(directory.resolve()),
        "heads": {f"{r.layer}-{r.head}": {f: number(getattr(r, f)) for f in fields} for r in table.itertuples()},
    }


def report_data(run: Run, config: ReportConfig) -> dict:
    table = run.table
    layers, heads = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    tasks = [str(t) for t in pd.unique(table["task"])]
    stats = stats_data(run, layers, heads)
    examples, missing = examples_data(run, tasks, config.examples)
    info = run.info
    tau = info.get("tau")
    return {
        "kind": run.kind,
        "title": f"{run.directory.resolve().name}: {dict(roles='head roles', track='head roles during training', effect='fine-tuning effect')[run.kind]}",
        "run_dir": str(run.directory.resolve()),
        "checkpoint": run.settings.ckpt,
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
        },
        "stats": stats,
        "examples": examples,
        "examples_missing": missing,
        "coref": coref_data(run, config, layers, heads),
        "report": {"examples": config.examples},
    }


def write_report(config: ReportConfig) -> Path:
    """Reads the run, computes the example attention and writes the page (atomically)."""
    run = read_run(config.run_dir)
    data = report_data(run, config)
    path = config.path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(render(data), encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write the report ({e.strerror})") from None
    print(f"report: wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return path
