"""`from_pretrained` / `save_pretrained` / `load_tokenizer` over the three kinds of checkpoint.

A checkpoint is a HF-format directory (`config.json` + safetensors, or `pytorch_model.bin` when
torch is installed), a bertjax training run (orbax, see `bertjax.checkpoint`), or a hub id. Its
text is resolved once, by `open_checkpoint`, into a `Checkpoint` that the loaders here accept in its
place and that the analyses pass down (docs/layout.md).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bertjax import checkpoint as ckpt
from bertjax import convert, families, runinfo, tokenization
from bertjax.config import BertConfig, read_hf_json
from bertjax.errors import UserError
from bertjax.model import BertModel, Model

log = logging.getLogger(__name__)

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
# A byte-level BPE tokenizer saved without tokenizer.json (RoBERTa's slow format).
BPE_FILES = ("vocab.json", "merges.txt")
# What a hub checkpoint is known by before its weights are fetched: its config, tokenizer (BPE
# tokenizers keep vocab.json + merges.txt) and the small JSON files beside them (kilobytes).
HUB_FILES = ["*.json", "vocab.txt", "merges.txt"]
HUB_WEIGHTS = ["*.safetensors"]
HUB_FALLBACK = [TORCH_BIN]  # fetched only when a repo has no safetensors
# `REPO#REVISION` names a hub revision (branch, tag or commit) in any checkpoint argument. Not `@`:
# `analysis.track --ckpt SOURCE@LABEL` had it first; `#` marks a git commit-ish in npm's and
# docker's git URLs too.
REVISION_MARK = "#"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint resolved once (`open_checkpoint`) and handed down in place of its text: `kind`
    is "hf" or "orbax"; `step` only for orbax. A hub checkpoint has its `repo_id` and the `commit`
    its revision resolved to (the hub cache's snapshot folder `path` is named by it). An orbax
    step's metadata is read on first use and kept: each read reopens orbax."""

    kind: str
    path: Path
    step: int | None = None
    repo_id: str | None = None
    commit: str | None = None

    def describe(self) -> dict[str, Any]:
        hub = {} if self.repo_id is None else {"repo_id": self.repo_id, "commit": self.commit}
        return {"kind": self.kind, "path": str(self.path), "step": self.step, **hub}

    @functools.cached_property
    def meta(self) -> dict[str, Any] | None:
        """The orbax step's metadata (`bertjax.checkpoint.make_meta`); None for a HF checkpoint."""
        if self.kind == "hf":
            return None
        assert self.step is not None  # `open_checkpoint` resolves an orbax checkpoint's step
        return ckpt.read_meta(self.path, self.step)

    @functools.cached_property
    def config(self) -> BertConfig:
        return load_config(self)

    @property
    def tokenizer_directory(self) -> Path:
        return tokenizer_directory(self)


def split_revision(text: str) -> tuple[str, str | None]:
    """`REPO#REVISION` → (REPO, REVISION); text without the mark → (text, None)."""
    repo, mark, revision = str(text).partition(REVISION_MARK)
    return (repo, revision) if mark else (str(text), None)


def open_checkpoint(
    path_or_id: str | Path, step: int | None = None, revision: str | None = None, *, weights: bool = True
) -> Checkpoint:
    """The one place a checkpoint's text is resolved: finds the checkpoint behind a local path or
    a hub id (downloading the latter; `weights=False` fetches only its config and tokenizer:
    `fetch_weights` fetches the rest). A hub id's revision is `revision` or the `#REVISION` after
    it (transformers' `revision`: branch, tag or commit)."""
    path = Path(path_or_id).expanduser()
    if path.exists():
        if revision is not None:
            raise UserError(f"{path} is a local directory; a revision ({revision}) names a hub checkpoint's version")
        if (path / "config.json").is_file():
            if step is not None:
                raise UserError(f"{path} is a HF-format directory; it has no steps to choose from")
            return Checkpoint("hf", path)
        directory, resolved_step = ckpt.resolve_step(path, step)
        return Checkpoint("orbax", directory, resolved_step)
    repo_id, named = split_revision(str(path_or_id))
    if named is not None and revision is not None and named != revision:
        raise UserError(f"{path_or_id}: names revision {named!r} and revision={revision!r} is given; give one")
    revision = named if named is not None else revision
    if revision == "":
        raise UserError(f"{path_or_id}: no revision after {REVISION_MARK!r} (REPO{REVISION_MARK}BRANCH, TAG or COMMIT)")
    if not is_hub_id(repo_id):
        raise UserError(f"{path_or_id}: no such checkpoint directory (not a local path, nor a hub repository id)")
    if step is not None:
        raise UserError(
            f"{path_or_id}: a hub checkpoint has no step to choose; name its revision ({repo_id}{REVISION_MARK}REVISION)"
        )
    snapshot = _download(repo_id, revision)
    source = Checkpoint("hf", snapshot, repo_id=repo_id, commit=snapshot.name)
    if weights:
        fetch_weights(source)
    return source


def _opened(
    path_or_id: str | Path | Checkpoint, step: int | None, revision: str | None, *, weights: bool = True
) -> Checkpoint:
    """`path_or_id` opened, or the checkpoint it already is (whose step and revision are its own)."""
    if not isinstance(path_or_id, Checkpoint):
        return open_checkpoint(path_or_id, step, revision, weights=weights)
    if step is not None or revision is not None:
        raise UserError(f"{path_or_id.path}: an opened checkpoint names its own step and revision; give neither")
    return path_or_id


def _download(repo_id: str, revision: str | None = None) -> Path:
    """The snapshot folder of `repo_id` at `revision`, with its config and tokenizer files."""
    from huggingface_hub import snapshot_download

    return _from_hub(
        repo_id, revision, lambda: Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES))
    )


def fetch_weights(source: Checkpoint) -> list[Path]:
    """Downloads a hub checkpoint's weights into its snapshot (safetensors, else `pytorch_model.bin`)
    at its resolved commit; returns the files of the hub cache this call created (the weights'
    blobs and the snapshot's links to them), none for a local checkpoint or weights already cached."""
    if source.repo_id is None:
        return []
    from huggingface_hub import snapshot_download

    # A blob already in the cache (another revision's identical weights) is not this call's.
    before = {*_cache_entries(source.path), *(source.path.parent.parent / "blobs").glob("*")}

    repo_id = source.repo_id

    def fetch() -> Path:
        path = Path(snapshot_download(repo_id, revision=source.commit, allow_patterns=HUB_WEIGHTS))
        if not any(path.glob("*.safetensors")):
            path = Path(snapshot_download(repo_id, revision=source.commit, allow_patterns=HUB_FALLBACK))
        return path

    _from_hub(repo_id, source.commit, fetch)
    return sorted(set(_cache_entries(source.path)) - before)


def _cache_entries(snapshot: Path) -> list[Path]:
    """A snapshot's weight files, and the blobs they link to (or the files themselves, where the
    cache holds copies instead of links)."""
    entries = []
    for file in (*snapshot.glob("*.safetensors"), snapshot / TORCH_BIN):
        if file.is_symlink() or file.is_file():
            entries.append(file)
            if file.is_symlink() and file.resolve().is_file():
                entries.append(file.resolve())
    return entries


def remove_downloads(files: list[Path]) -> int:
    """Deletes `files` (what `fetch_weights` returned), freeing the weights it downloaded; returns
    the bytes freed. A blob another snapshot links to too is kept."""
    files = [Path(f) for f in files]
    links = [f for f in files if f.is_symlink()]
    blobs = {f for f in files if not f.is_symlink()}
    freed = 0
    for link in links:
        link.unlink(missing_ok=True)
    for blob in blobs:
        if blob.is_file() and not _linked_elsewhere(blob):
            freed += blob.stat().st_size
            blob.unlink()
    return freed


def _linked_elsewhere(blob: Path) -> bool:
    """Whether a snapshot of the blob's repository still links to it (blobs/ beside snapshots/)."""
    snapshots = blob.parent.parent / "snapshots"
    if blob.parent.name != "blobs" or not snapshots.is_dir():
        return False
    return any(f.is_symlink() and f.resolve() == blob for f in snapshots.rglob("*"))


def hub_file(repo_id: str, filename: str) -> Path:
    """One file of a hub repository (cached by huggingface_hub), or a UserError naming the repo."""
    from huggingface_hub import hf_hub_download

    return _from_hub(repo_id, None, lambda: Path(hf_hub_download(repo_id, filename)))


def is_hub_id(text: str) -> bool:
    """Whether a path that does not exist may name a hub repository (`owner/name` or `name`, as the
    hub spells them). `runs/nope` where `runs/` is a local folder is a local path, not a repository
    of a user `runs`: asking the hub about it named a missing folder a failed download."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    owner, slash, _ = text.partition("/")
    return not (slash and Path(owner).expanduser().is_dir())


def _from_hub(repo_id: str, revision: str | None, fetch: Callable[[], Path]) -> Path:
    try:
        return fetch()
    except Exception as e:  # noqa: BLE001 (the hub client raises many types for offline/unknown-repo cases)
        name = repo_id if revision is None else f"{repo_id}{REVISION_MARK}{revision}"
        cached = cached_hub_repos()
        from huggingface_hub.errors import RevisionNotFoundError

        if isinstance(e, RevisionNotFoundError) and (on_hub := _hub_revisions(repo_id)) is not None:
            have = f"the hub has its revisions {', '.join(on_hub) or 'none'}"
        elif repo_id in cached:
            have = f"the local hub cache has its revisions {', '.join(cached[repo_id]) or 'none'}"
        else:
            have = "the local hub cache has no copy of it; pass a local path when offline"
        raise UserError(f"{name}: not a local path, and the hub download failed ({type(e).__name__}); {have}") from None


def _hub_revisions(repo_id: str) -> list[str] | None:
    """The branches and tags the hub lists for a repository, or None when it cannot be asked."""
    from huggingface_hub import HfApi

    try:
        refs = HfApi().list_repo_refs(repo_id)
    except Exception:  # noqa: BLE001 (offline, gated, the hub down: the error line then names the local cache)
        return None
    return sorted(r.name for r in [*refs.branches, *refs.tags])


def cached_hub_repos() -> dict[str, list[str]]:
    """The model repositories in the local hub cache (`HF_HUB_CACHE`), each with the revisions it
    holds: its branch and tag names (`refs/`), then the commits of its snapshots no ref names."""
    from huggingface_hub import constants

    repos = {}
    for folder in sorted(Path(constants.HF_HUB_CACHE).glob("models--*")):
        refs = folder / "refs"
        # errors="replace": a ref file of other bytes names no snapshot, and must not turn every
        # failed hub lookup into a UnicodeDecodeError.
        named = {
            str(p.relative_to(refs)): p.read_text(errors="replace").strip() for p in refs.rglob("*") if p.is_file()
        }
        commits = sorted(p.name for p in (folder / "snapshots").glob("*") if p.name not in named.values())
        repos[folder.name.removeprefix("models--").replace("--", "/")] = sorted(named) + commits
    return repos


def model_class(name: str | type[Model], config: BertConfig | None = None) -> type[Model]:
    """The class named, as the config's family has it (`bertjax.families`): the bare encoder
    (`BertModel`, what every analysis asks for) of a ModernBERT config is `ModernBertModel`, its
    only class here."""
    known = families.class_names()
    asked = name if isinstance(name, str) else name.__name__
    if isinstance(name, str) and name not in known:
        raise UserError(f"unknown model class {name!r}; choose from {', '.join(known)}")
    if config is not None:
        return config.family.model_class(name)
    if isinstance(name, str):
        return next(f.model_class(asked) for f in families.FAMILIES.values() if asked in f.classes)
    return name


def init_model(config: BertConfig, cls: str | type[Model] = BertModel, seed: int = 0) -> Model:
    return model_class(cls, config)(config, rngs=nnx.Rngs(params=seed))


def load_config(source: Checkpoint, **overrides: Any) -> BertConfig:
    if source.kind == "hf":
        return BertConfig.from_json_file(source.path / "config.json", **overrides)
    meta = source.meta
    assert meta is not None  # an orbax step has its metadata
    if "model_config" not in meta:
        raise UserError(f"{source.path / str(source.step)}: unreadable checkpoint metadata (model_config is missing)")
    return BertConfig.from_hf_dict(meta["model_config"], source=str(source.path), **overrides)


def trained_task(source: Checkpoint) -> str | None:
    """The GLUE task a checkpoint's classifier was fine-tuned on, where the checkpoint says: a
    `train.finetune` run's config, or a HF config's `finetuning_task` (as HF's run_glue writes it,
    `sst-2` or `sst2`); None for anything else."""
    if source.kind == "hf":
        task = read_hf_json(source.path / "config.json").get("finetuning_task")
    else:
        assert source.meta is not None  # an orbax step has its metadata
        task = (source.meta.get("run_config") or {}).get("task")
    return task.lower().replace("-", "") if isinstance(task, str) and task else None


def from_pretrained(
    path_or_id: str | Path | Checkpoint,
    cls: str | type[Model] = BertModel,
    *,
    step: int | None = None,
    revision: str | None = None,
    seed: int = 0,
    trained_heads: bool = False,
    allow_nonfinite: bool = False,
    **config_overrides: Any,
) -> Model:
    """Loads a BERT of class `cls` (default the bare encoder): from a HF-format directory, a
    bertjax run (`step`: its latest by default) or a hub id at `revision` (a branch, tag or commit,
    as transformers' `revision`; or `REPO#REVISION`; default the main branch).

    Task heads that the checkpoint lacks (a classifier on a pre-trained encoder) are initialised
    from `seed` and logged, or, with `trained_heads` (for analyses that read the head's output),
    are an error; a missing encoder tensor is always an error. A stored tensor holding NaN or ±Inf
    is an error naming the first such tensor, or with `allow_nonfinite` a warning. `config_overrides`
    set fields such as `dtype="bfloat16"` or `num_labels=3`. `path_or_id` may be a checkpoint
    already opened (`open_checkpoint`), which names its own step and revision.
    """
    source = _opened(path_or_id, step, revision)
    config = load_config(source, **config_overrides)
    cls = model_class(cls, config)
    tensors = None
    if source.kind == "hf" and not _safetensors_files(source.path):
        _, tensors = _read_hf_tensors(source.path)  # a pytorch_model.bin has no header: read once
    file = check_structure(source, config, tensors)
    graphdef, abstract_state = abstract_model(cls, config)
    if source.kind == "hf":
        if tensors is None:
            _, tensors = _read_hf_tensors(source.path)
        leaves, missing = convert.from_hf(abstract_state, tensors, str(file), config.model_type)
    else:
        leaves, missing = _read_orbax_leaves(source, abstract_state)
    # Heads (and the pooler, which HF's BertForMaskedLM does not save) may be missing: they are
    # initialised; any other missing tensor is fatal.
    optional = (*convert.HEAD_PREFIXES, "pooler.")
    fatal = [p for p in missing if convert.hf_name(p)[0].split(".")[0] + "." not in optional]
    if fatal:
        name = convert.hf_name(fatal[0])[0]
        raise UserError(f"{file}: tensor {name} is missing")
    if missing and trained_heads:
        name = convert.hf_name(missing[0])[0]
        raise UserError(
            f"{file}: tensor {name} is missing: this analysis needs a fine-tuned task head, not a random one"
        )
    check_finite(file, [(p, leaves[p]) for p, _ in nnx.to_flat_state(abstract_state) if p in leaves], allow_nonfinite)
    if missing:
        log.warning("%s: initialising %s from seed %d", file, ", ".join(convert.hf_name(p)[0] for p in missing), seed)
        initial = dict(nnx.to_flat_state(nnx.state(cls(config, rngs=nnx.Rngs(params=seed)))))
        leaves.update({p: initial[p].get_value() for p in missing})
    # One transfer for every leaf: MiniLM's 103 tensors took 0.80 s one jnp.asarray at a time,
    # 0.20 s in one device_put (one measurement, on the shared 2-core CPU).
    abstract = list(nnx.to_flat_state(abstract_state))
    values = jax.device_put([leaves[p] for p, _ in abstract])
    flat = [(p, v.replace(value=x)) for (p, v), x in zip(abstract, values, strict=True)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


# A stored tensor's name: `encoder.layer.3.…` (HF) or `bert/encoder/layer/3/…` (a bertjax step).
_LAYER = re.compile(r"(?:^|[./])(?:encoder[./]layer|layers)[./](\d+)[./]")
# The token-embedding table (ModernBERT's is `tok_embeddings`), named as `_LAYER`'s tensors are.
_TOKEN_TABLE = re.compile(r"(?:^|[./])embeddings[./](?:word|tok)_embeddings[./](?:weight|embedding)$")
# safetensors' dtype names (a file's header) → numpy's.
_SAFETENSORS_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
                       "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16",
                       "BF16": "bfloat16", "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
                       "F8_E5M2": "float8_e5m2"}  # fmt: skip


def check_structure(source: Checkpoint, config: BertConfig, tensors: dict[str, np.ndarray] | None = None) -> Path:
    """`check_weights` over the shapes a checkpoint stores, read without its values (the safetensors
    headers, or an orbax step's meta; `tensors`, a pytorch_model.bin's already read): what every
    command that builds or traces a model from a checkpoint's config runs first. Returns the file
    the weights are in."""
    if source.kind == "orbax":
        assert source.meta is not None  # an orbax step has its metadata
        stored = source.meta["param_shapes"]
        file, shapes = source.path / str(source.step), {n: (tuple(s), d) for n, (s, d) in stored.items()}
    elif tensors is not None:
        file, shapes = source.path / TORCH_BIN, {n: (v.shape, v.dtype.name) for n, v in tensors.items()}
    else:
        file, shapes = _stored_hf_shapes(source.path)
        shapes = convert.normalize_hf_names(shapes, config.model_type)
    check_weights(file, config, shapes)
    return file


def _safetensors_files(directory: Path) -> tuple[Path, list[Path]] | None:
    """(the file that names the weights, the safetensors files holding them) of a HF directory, or
    None where it has no safetensors."""
    if (directory / SAFETENSORS).is_file():
        return directory / SAFETENSORS, [directory / SAFETENSORS]
    if (directory / SAFETENSORS_INDEX).is_file():
        file = directory / SAFETENSORS_INDEX
        index = read_hf_json(file).get("weight_map")
        if not isinstance(index, dict) or not all(isinstance(v, str) for v in index.values()):
            raise UserError(f"{file}: no weight_map of tensor names to shard files")
        return file, [directory / shard for shard in sorted(set(index.values()))]
    return None


def _stored_hf_shapes(directory: Path) -> tuple[Path, dict[str, tuple[tuple, str]]]:
    """(weights file, {name: (shape, dtype)}) of a HF-format directory, from the safetensors
    headers (a pytorch_model.bin has none: it is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        file, files = _safetensors_files(directory) or (None, [])
        shapes: dict[str, tuple[tuple, str]] = {}
        for shard in files:
            with safe_open(shard, framework="numpy") as f:
                for name in f.keys():  # noqa: SIM118 (a safetensors file is not iterable)
                    dtype = f.get_slice(name).get_dtype()
                    shapes[name] = (tuple(f.get_slice(name).get_shape()), _SAFETENSORS_DTYPES.get(dtype, dtype))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{directory}: unreadable safetensors ({e})") from None
    if files:
        assert file is not None  # the file that names them
        return file, shapes
    file, tensors = _read_hf_tensors(directory)
    return file, {n: (v.shape, v.dtype.name) for n, v in tensors.items()}


def check_weights(file: Path, config: BertConfig, stored: dict[str, tuple[tuple, Any]]) -> None:
    """The stored tensors' dtypes, and the config's layer count and vocabulary against the tensors,
    before any model is built from the config: an int8 or bool weight was cast to float without a
    word, and a config.json claiming 100,000 layers over 2 layers of weights (or over none: an
    embeddings-only file) kept the loader tracing them for 15+ minutes; one claiming fewer layers
    than the weights hold loaded the first ones without a word. (Other widths cost nothing
    to trace; a shape that disagrees is named once the weights are matched to the model.)"""
    for name, (_, dtype) in stored.items():
        try:
            kind = jnp.dtype(dtype)
        except TypeError:  # a safetensors dtype numpy has no name for
            kind = None
        if kind is None or not jnp.issubdtype(kind, jnp.floating):
            name_of = str(dtype) if kind is None else kind.name
            raise UserError(f"{file}: tensor {name} is {name_of}, not floating point; refusing to load it")
    layers = [int(m.group(1)) for name in stored if (m := _LAYER.search(name))]
    held = max(layers) + 1 if layers else 0
    if config.num_hidden_layers > held:
        raise UserError(
            f"{file}: the config says num_hidden_layers {config.num_hidden_layers}, the weights hold {held} layers"
        )
    if config.num_hidden_layers < held:
        # The model built from the config would load the first layers and drop the rest unread.
        raise UserError(
            f"{file}: the config says num_hidden_layers {config.num_hidden_layers}, the weights hold {held} layers; "
            f"refusing to drop the last {held - config.num_hidden_layers} unread (the config must say {held})"
        )
    needed = (config.vocab_size, config.embedding_width)
    for name, (shape, _) in stored.items():
        if _TOKEN_TABLE.search(name) and tuple(shape) != needed:
            raise UserError(
                f"{file}: tensor {name} has shape {list(shape)}, the config's vocab_size and width need {list(needed)}"
            )


def check_finite(file: Path, tensors: list[tuple[tuple, Any]], allow: bool = False) -> None:
    """Refuses weights holding NaN or ±Inf (one line naming the first such tensor, in the model's
    order), or with `allow` warns: every attention map and score downstream of one would be NaN,
    and an analysis would report it as a head with no skill."""
    bad = [(p, int(np.size(v) - np.count_nonzero(np.isfinite(v)))) for p, v in tensors if not np.isfinite(v).all()]
    if not bad:
        return
    path, count = bad[0]
    what = f"tensor {convert.hf_name(path)[0]} holds {count} non-finite value(s) (NaN or ±Inf)"
    if len(bad) > 1:
        what += f", and {len(bad) - 1} other tensor(s) do too"
    if not allow:
        raise UserError(f"{file}: {what}; refusing to load it (the analyses take --allow-nonfinite to go on)")
    log.warning("%s: %s; analysed anyway (--allow-nonfinite): its results may be NaN", file, what)


@functools.cache
def abstract_model(cls: type[Model], config: BertConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """(graph, state of shapes and dtypes) of a `cls` model: what a checkpoint's arrays fill.

    Traced with `_ShapeRngs` in place of `nnx.Rngs`: each of nnx.Rngs' counter updates made JAX
    describe a tracer for an error message no one reads (~2.7 ms a parameter, growing with the
    trace: 0.5 s of MiniLM's load, ~1.2 s at BERT-base size). Cached per architecture:
    `analysis.track` loads one architecture once per checkpoint."""
    return nnx.split(nnx.eval_shape(lambda: cls(config, rngs=cast(nnx.Rngs, _ShapeRngs()))))


class _ShapeRngs:
    """What a model's constructor asks of its `rngs` (`rngs.params()`, through flax's layers), with
    one key for every parameter: under `eval_shape` only the shapes and dtypes are kept, and those
    do not depend on the key."""

    def __init__(self) -> None:
        self.key = jax.random.key(0)

    def params(self) -> jax.Array:
        return self.key


def _read_hf_tensors(directory: Path) -> tuple[Path, dict[str, np.ndarray]]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        if (directory / SAFETENSORS).is_file():
            return directory / SAFETENSORS, load_file(directory / SAFETENSORS)
        if (directory / SAFETENSORS_INDEX).is_file():
            index = json.loads((directory / SAFETENSORS_INDEX).read_text())
            tensors = {}
            for shard in sorted(set(index["weight_map"].values())):
                tensors.update(load_file(directory / shard))
            return directory / SAFETENSORS_INDEX, tensors
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise UserError(f"{directory}: unreadable safetensors ({e})") from None
    if (directory / TORCH_BIN).is_file():
        return directory / TORCH_BIN, _read_torch_bin(directory / TORCH_BIN)
    raise UserError(f"{directory}: no {SAFETENSORS} or {TORCH_BIN}")


def _read_torch_bin(file: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise UserError(f"{file}: reading pytorch_model.bin needs torch (pip install torch)") from None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # weights_only refused to build an object: loading it fully would run code from the file.
        raise UserError(
            f"{file}: cannot be loaded safely (it holds Python objects, not only tensors); "
            "convert it to model.safetensors where you trust it"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise UserError(f"{file}: unreadable ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{file}: not a state dict of tensors")
    return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def _read_orbax_leaves(source: Checkpoint, abstract_state: nnx.State) -> tuple[dict, list]:
    """Reads the checkpoint's params, keeping the ones this model class has."""
    meta = source.meta
    assert meta is not None and source.step is not None  # an orbax step, with its metadata
    wanted = {ckpt.path_key(p): p for p, _ in nnx.to_flat_state(abstract_state)}
    shapes = {k: jax.ShapeDtypeStruct(tuple(s), jnp.dtype(d)) for k, (s, d) in meta["param_shapes"].items()}
    restored = ckpt.read_params(source.path, source.step, shapes)
    # The checkpoint is of a headed class (pre-training, classification); this model may be the
    # bare encoder: map "bert/encoder/..." onto "encoder/...".
    prefix = "" if any(k.startswith("bert/") for k in wanted) else "bert/"
    leaves, missing = {}, []
    for key, path in wanted.items():
        stored = key if prefix == "" else prefix + key
        if stored not in restored:
            missing.append(path)
            continue
        leaves[path] = restored[stored]
    abstract = dict(nnx.to_flat_state(abstract_state))
    # As from_hf does: the config's param_dtype (an override, say) wins over the stored one.
    leaves = {path: value.astype(abstract[path].get_value().dtype) for path, value in leaves.items()}
    for path, value in leaves.items():
        expected = abstract[path].get_value()
        if value.shape != expected.shape:
            name = ckpt.path_key(path)
            raise UserError(
                f"{source.path / str(source.step)}: tensor {name} has shape {list(value.shape)}, "
                f"the config needs {list(expected.shape)}"
            )
    return leaves, missing


def save_pretrained(model: Model, directory: str | Path, overwrite: bool = False) -> Path:
    """Writes HF-format `config.json` + `model.safetensors` (loadable by `transformers`); files
    already there are replaced only with `overwrite`."""
    from safetensors.numpy import save

    if not model.config.family.exportable:
        raise UserError(
            f"{directory}: bertjax writes HF's format for BERT only, not model_type {model.config.model_type!r}"
        )
    if model.config.layer_norm_position != "post":
        raise UserError(
            f"{directory}: a {model.config.layer_norm_position}-LN model cannot be written in HF's format "
            "(transformers' BERT is post-LN only); analyse the bertjax checkpoint itself"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in (SAFETENSORS, "config.json"):  # both before either is written
        runinfo.check_writable(directory / name, overwrite)
    architecture = type(model).__name__
    tensors = convert.to_hf(nnx.state(model, nnx.Param), headed=architecture != "BertModel")
    with runinfo.atomic_file(directory / SAFETENSORS, binary=True, overwrite=overwrite) as f:
        f.write(save(tensors, metadata={"format": "pt"}))
    model.config.to_json_file(directory / "config.json", architecture, overwrite=overwrite)
    return directory


def tokenizer_directory(source: Checkpoint) -> Path:
    """The directory holding a checkpoint's tokenizer: the HF directory itself, or the one a
    bertjax run's step names."""
    if source.kind == "hf":
        return source.path
    meta = source.meta
    assert meta is not None  # an orbax step has its metadata
    if "tokenizer" not in meta:
        raise UserError(f"{source.path / str(source.step)}: unreadable checkpoint metadata (tokenizer is missing)")
    location = Path(meta["tokenizer"])
    return location if location.is_absolute() else source.path.parent / location


def tokenizer_digest(source: Checkpoint) -> str:
    """sha256 of the files that define a checkpoint's tokenizer, read without loading it (a
    cache key that a re-run can compute without importing transformers)."""
    location = tokenizer_directory(source)
    digest = hashlib.sha256()
    # The BPE files only where present: every other tokenizer's digest stays what it was.
    present = tuple(name for name in BPE_FILES if (location / name).is_file())
    for name in (*TOKENIZER_FILES, "tokenizer_config.json", "special_tokens_map.json", *present):
        path = location / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
    return digest.hexdigest()


def _tokenizer_class(location: Path):
    """BertTokenizer (transformers 5's fast one, which BertTokenizerFast also names) for a BERT
    tokenizer (what AutoTokenizer resolves it to), imported on its own: AutoTokenizer's import
    pulls in transformers' model configuration and with it torch where torch is installed, a
    second and a half of every analysis's start. Any other class named in tokenizer_config.json
    goes through AutoTokenizer as before."""
    config = location / "tokenizer_config.json"
    named = read_hf_json(config).get("tokenizer_class") if config.is_file() else None
    # Unnamed (roberta-base's tokenizer_config.json names none): the model's type says, as for AutoTokenizer.
    model = location / "config.json"
    model_type = read_hf_json(model).get("model_type", "bert") if named is None and model.is_file() else "bert"
    if named in (None, "BertTokenizer", "BertTokenizerFast") and model_type == "bert":
        from transformers import BertTokenizer

        return BertTokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer


def _check_tokenizer_json(file: Path) -> None:
    """The top-level fields transformers reads from a tokenizer.json before `tokenizers` parses it:
    a file of another schema was a `KeyError: 'added_tokens'` traceback."""
    if not file.is_file():
        return
    content = read_hf_json(file)
    if not isinstance(content.get("added_tokens"), list) or not isinstance(content.get("model"), dict):
        raise UserError(
            f"{file}: not a tokenizer.json of the tokenizers library (no list of added_tokens and model object)"
        )


def load_tokenizer(
    path_or_id: str | Path | Checkpoint, step: int | None = None, revision: str | None = None, *, light: bool = False
):
    """The fast tokenizer stored with a checkpoint (offsets are needed for alignment); a hub id's
    `revision` as in `from_pretrained` (only the tokenizer and config files are fetched).

    `light`: where it encodes as transformers' would, the `tokenizers` library's tokenizer alone
    (`bertjax.tokenization.LightTokenizer`: what `sieves.align.encode_batch` needs, none of
    transformers' other methods), without importing transformers."""
    source = _opened(path_or_id, step, revision, weights=False)
    location = tokenizer_directory(source)
    # Checked first: transformers reads config.json too, and fails on a bad one with a traceback.
    vocab_size = load_config(source).vocab_size
    # Without these files transformers builds a 5-token tokenizer and every word becomes [UNK].
    if location.is_dir() and not any((location / name).is_file() for name in (*TOKENIZER_FILES, BPE_FILES[0])):
        raise UserError(f"{location}: no tokenizer ({' or '.join(TOKENIZER_FILES)}); save one beside the weights")
    _check_tokenizer_json(location / TOKENIZER_FILES[0])
    try:
        tokenizer = (light and tokenization.light_tokenizer(location)) or _tokenizer_class(location).from_pretrained(
            str(location)
        )
    except (OSError, ValueError) as e:
        raise UserError(f"{location}: no usable tokenizer ({e})") from None
    except Exception as e:
        # The tokenizers library's parse errors are bare Exceptions; anything more specific is a bug.
        if type(e) is not Exception:
            raise
        raise UserError(f"{location}: no usable tokenizer ({e})") from None
    if not tokenizer.is_fast:
        raise UserError(f"{location}: the tokenizer is not a fast tokenizer (no offsets)")
    # Ids past the embedding table would give NaN embeddings (jnp.take's fill), not an error; a
    # shorter vocabulary (a truncated vocab.txt) turns the words it lost into [UNK], silently. A
    # table padded to a multiple of 8 (fewer than 128 unused rows: MosaicBERT's 30528, TPU-friendly
    # sizes) is a model of this tokenizer: its extra rows are never looked up.
    padded = vocab_size % 8 == 0 and 0 < vocab_size - len(tokenizer) < 128
    if padded:
        log.info("%s: the embedding table is padded to %d rows for %d tokens", location, vocab_size, len(tokenizer))
    elif len(tokenizer) != vocab_size:
        raise UserError(
            f"{location}: the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}; "
            "they do not belong together"
        )
    return tokenizer
