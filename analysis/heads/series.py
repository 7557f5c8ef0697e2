"""The members of a tracked series: a run's checkpoints, a `--ckpt` list or a `{step}` pattern, each
with its step and label; checks that they share layers, heads and vocabulary; and the identity of
each checkpoint (its files) that keys the scores cache.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence
from pathlib import Path

from bertjax import checkpoint as ckpt
from bertjax.errors import UserError
from bertjax.pretrained import (
    REVISION_MARK,
    Checkpoint,
    cached_hub_repos,
    is_hub_id,
    load_config,
    load_tokenizer,
    open_checkpoint,
    split_revision,
)

STEP_PLACEHOLDER = "{step}"

INIT_LABEL = "init"


def run_steps(run: str, wanted: Sequence[int] | None) -> tuple[Path, list[int]]:
    """(orbax manager directory, sorted steps to analyse) of a training run's workdir."""
    path = Path(run).expanduser()
    if not path.is_dir():
        raise UserError(f"--run {path}: no such directory")
    if (path / "config.json").is_file():
        raise UserError(
            f"--run {path}: a HF-format directory has no checkpoints to track; pass a training run's workdir"
        )
    directory = ckpt.checkpoint_dir(path.resolve())
    if directory is None:
        raise UserError(f"--run {path}: no bertjax checkpoints found (expected {ckpt.CHECKPOINTS}/<step>/)")
    available = ckpt.available_steps(directory)
    if wanted is None:
        return directory, available
    if not wanted:
        raise UserError("--steps names no step; give comma-separated steps, or leave --steps out for every checkpoint")
    missing = sorted(set(wanted) - set(available))
    if missing:
        raise UserError(
            f"--steps: {path} has no checkpoint for step {', '.join(map(str, missing))}; available: {available}"
        )
    return directory, sorted(set(wanted))


@dataclasses.dataclass(frozen=True)
class Member:
    """One checkpoint of the tracked series: `step` places it on the x axis, `label` names it,
    `given` is the text it came from (a `--ckpt` source or the `--run` workdir)."""

    step: int
    label: str
    given: str
    source: Checkpoint

    def describe(self) -> dict:
        source = self.source
        hub = {} if source.repo_id is None else {"repo_id": source.repo_id, "commit": source.commit}
        return {"step": self.step, "label": self.label, "given": self.given, "kind": source.kind,
                "path": str(source.path), "checkpoint_step": source.step, **hub}  # fmt: skip


def run_members(run: str, wanted: Sequence[int] | None, with_init: bool) -> list[Member]:
    """The checkpoints of a training run's workdir, led by its init at step 0 with `with_init`."""
    directory, steps = run_steps(run, wanted)
    members = [Member(s, str(s), run, open_checkpoint(directory, s)) for s in steps]
    check_one_tokenizer(directory, members)
    if not with_init:
        return members
    meta = members[-1].source.meta
    assert meta is not None  # run_steps refused a HF directory: a run's members are orbax steps
    run_config = meta.get("run_config") or {}
    if not run_config.get("init") or "task" not in run_config:
        raise UserError(f"--with-init: {run} is not a fine-tuning run (its config names no init checkpoint)")
    if steps[0] == 0:
        raise UserError(f"--with-init: {run} has a checkpoint at step 0 already")
    init = Member(0, INIT_LABEL, run_config["init"], open_checkpoint(run_config["init"], run_config.get("init_step")))
    return [init, *members]


def split_label(text: str) -> tuple[str, str | None]:
    """`SOURCE@LABEL` → (SOURCE, LABEL); an `@` followed by a path separator belongs to the path."""
    source, at, label = text.rpartition("@")
    if not at or not source or not label or "/" in label:
        return text, None
    return source, label


def _integer(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def series_members(specs: Sequence[str], steps: Sequence[int] | None) -> list[Member]:
    """The members of a `--ckpt` series, ordered by step (resolving, hence downloading, hub ids)."""
    patterns = [s for s in specs if STEP_PLACEHOLDER in s]
    if patterns:
        if len(specs) > 1:
            raise UserError(f"--ckpt {patterns[0]}: a {STEP_PLACEHOLDER} pattern is the only --ckpt of its series")
        if steps is None:
            raise UserError(f"--ckpt {patterns[0]}: a {STEP_PLACEHOLDER} pattern needs --steps (comma-separated)")
        if not steps:
            raise UserError("--steps names no step; give comma-separated steps")
        pattern = specs[0]
        if split_label(pattern)[1] is not None:
            raise UserError(f"--ckpt {pattern}: a {STEP_PLACEHOLDER} pattern takes no @LABEL (steps label it)")
        filled = [(s, pattern.replace(STEP_PLACEHOLDER, str(s))) for s in sorted(set(steps))]
        return [Member(s, str(s), text, _resolve_step(pattern, s, text)) for s, text in filled]
    if steps is not None:
        raise UserError(f"--steps goes with --run or a --ckpt pattern holding {STEP_PLACEHOLDER}, not a --ckpt list")
    parts = [split_label(s) for s in specs]
    # A hub member's weights are fetched when it is scored: a member whose scores are cached
    # needs only its config and tokenizer files.
    sources = [open_checkpoint(text, weights=False) for text, _ in parts]
    # An integer label is the step; an unlabelled bertjax checkpoint brings its own.
    numeric = [_integer(label) if label is not None else (src.step if src.kind == "orbax" else None)
               for (_, label), src in zip(parts, sources, strict=True)]  # fmt: skip
    known = [n for n in numeric if n is not None]
    if len(known) == len(numeric):
        members = [Member(n, label if label is not None else str(n), text, src)
                   for n, (text, label), src in zip(known, parts, sources, strict=True)]  # fmt: skip
        members.sort(key=lambda m: m.step)
    else:
        members = [Member(i, label if label is not None else text, text, src)
                   for i, ((text, label), src) in enumerate(zip(parts, sources, strict=True))]  # fmt: skip
    for a, b in itertools.pairwise(members):
        if a.step == b.step or a.label == b.label:
            what = f"step {a.step}" if a.step == b.step else f"label {a.label!r}"
            raise UserError(f"--ckpt {a.given} and {b.given} are both at {what}; give each a distinct @LABEL")
    return members


def _resolve_step(pattern: str, step: int, text: str) -> Checkpoint:
    """One member of a `{step}` pattern, or one line naming the steps the local hub cache holds."""
    try:
        return open_checkpoint(text, weights=False)
    except UserError as e:
        if not is_hub_id(split_revision(text)[0]):
            raise  # a local series: the error names the folder
        have = ", ".join(map(str, cached_steps(pattern))) or "none"
        raise UserError(
            f"--ckpt {pattern}: no checkpoint for step {step} ({e}); steps in the local hub cache: {have}"
        ) from None


def cached_steps(pattern: str) -> list[int]:
    """The steps of a hub `{step}` pattern (in the repository name, the revision or both) that the
    local hub cache holds; a pattern without a revision names each repository's main branch."""
    first, *rest = re.escape(pattern).split(re.escape(STEP_PLACEHOLDER))
    regex = re.compile(
        first + "".join(("(?P<step>\\d+)" if i == 0 else "(?P=step)") + part for i, part in enumerate(rest))
    )
    with_revision = split_revision(pattern)[1] is not None
    found = set()
    for repo, revisions in cached_hub_repos().items():
        for revision in revisions if with_revision else ["main"] if "main" in revisions else []:
            match = regex.fullmatch(f"{repo}{REVISION_MARK}{revision}" if with_revision else repo)
            if match is not None:
                found.add(int(match.group("step")))
    return sorted(found)


def check_series(members: Sequence[Member]) -> list:
    """The members' model configs, after checking that they share layers, heads and the tokenizer
    vocabulary: the sequences are encoded once, and the tables and figures index heads by
    (layer, head). The first mismatch with the first member is one line."""
    configs = [load_config(m.source) for m in members]
    first, shape = members[0], (configs[0].num_hidden_layers, configs[0].num_attention_heads)
    for member, config in zip(members[1:], configs[1:], strict=True):
        other = (config.num_hidden_layers, config.num_attention_heads)
        if other != shape:
            raise UserError(
                f"the series mixes model shapes: {first.given} ({first.label}) has {shape[0]} layers × {shape[1]} heads, "
                f"{member.given} ({member.label}) has {other[0]} layers × {other[1]} heads; track them separately"
            )
    locations = {tokenizer_location(m.source): m for m in members}
    if len(locations) == 1:  # one tokenizer (a run's steps): nothing to compare
        return configs
    vocabularies = [(m, load_tokenizer(m.source).get_vocab()) for m in locations.values()]
    (first, vocabulary), *others = vocabularies
    for member, other in others:
        if other != vocabulary:
            raise UserError(
                f"the series mixes tokenizers: {member.given} ({member.label}) has another tokenizer vocabulary "
                f"({len(other)} tokens) than {first.given} ({first.label}, {len(vocabulary)} tokens); track them separately"
            )
    return configs


def tokenizer_location(source: Checkpoint) -> tuple:
    """Where a checkpoint's tokenizer is stored: members sharing one are compared once."""
    if source.kind == "hf":
        return ("hf", str(source.path.resolve()))
    assert source.meta is not None  # only a HF checkpoint has none
    return ("orbax", str(source.path.resolve()), source.meta["tokenizer"])


def check_one_tokenizer(directory: Path, members: Sequence[Member]) -> None:
    """Sequences are encoded once for all steps, so every step must name the same tokenizer."""
    tokenizers = {}
    for m in members:
        assert m.source.meta is not None  # a run's members are orbax steps, each with its metadata
        tokenizers[m.step] = m.source.meta["tokenizer"]
    if len(set(tokenizers.values())) > 1:
        found = ", ".join(f"step {s}: {t}" for s, t in tokenizers.items())
        raise UserError(f"{directory}: the checkpoints use different tokenizers ({found}); track them separately")


def checkpoint_identity(directory: Path, step: int) -> dict:
    """Path, step and the params files' names, sizes and mtimes: a re-trained step misses the cache."""
    folder = (directory / str(step)).resolve()
    files = sorted(p for p in (folder / ckpt.PARAMS).rglob("*") if p.is_file())
    return {
        "path": str(folder),
        "step": step,
        "params": [[str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns] for p in files],
    }


def hf_identity(path: Path, step: int) -> dict:
    """A HF directory's resolved path and its files' resolved names, sizes and mtimes. In the hub
    cache the path names the revision and each file resolves to a blob named by its content hash."""
    folder = path.resolve()
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {
        "path": str(folder),
        "step": step,
        "files": [[p.name, str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files],
    }


def member_identity(member: Member) -> dict:
    if member.source.repo_id is not None:
        # A hub checkpoint is its commit: the weights need not be on disk to find its scores (they
        # are fetched when it is scored, and --remove-downloads deletes them again).
        return {"repo_id": member.source.repo_id, "commit": member.source.commit, "step": member.step}
    if member.source.kind == "hf":
        return hf_identity(member.source.path, member.step)
    # The path names the checkpoint's own step; "step" is its place in the series (and the cache
    # file's name), the same for a run's members.
    assert member.source.step is not None  # neither hub nor HF: an orbax checkpoint, which has its step
    return {**checkpoint_identity(member.source.path, member.source.step), "step": member.step}
