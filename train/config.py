"""Every key of the training configs, declared once with its default and help (`bertjax.settings.setting`):
`python -m train.pretrain`, `train.finetune` and `train.prepare` read these dataclasses from YAML plus
dotted `key=value` overrides (`bertjax.settings.load_config`), and list their keys in `--help`
(`keys_help`); each command's own flags come from a small settings dataclass (`command_parser`).

They live here, apart from the code that uses them, because this module imports no JAX: `--help`
reads them without waiting seconds for it. Each section checks what it can in `__post_init__`, as
soon as the YAML is read; the checks that need the data, the devices or the model stay with the code
that has them (`train.prepare.validate`, `train.pretraining.check_settings`, `train.probe.check_config`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from bertjax import cli
from bertjax.errors import UserError
from bertjax.glue import TASKS, TaskSpec
from bertjax.mesh_config import MeshConfig
from bertjax.precision import TRAINING_PRECISIONS
from bertjax.settings import add_flags, describe_keys, flag_values, make, resolved_yaml, setting
from sieves.builders import DEFAULT_ROLES

# -- the data: corpora and their preparation (train.prepare) ------------------------------------


# The splits a fine-tuning run may evaluate (GLUE's test split has no labels).
EVAL_SPLITS = ("dev", "validation", "train")


@dataclasses.dataclass
class CorpusConfig:
    """One corpus: local `path` (a file or a folder) or a streamed hub dataset."""

    name: str = setting("corpus", help="the corpus's name in meta.json and the logs")
    source: str = setting("local", help="local (path) or hub (a streamed hub dataset: hub_id)")
    path: str | None = setting(None, help="the local file or folder")
    hub_id: str | None = setting(None, help="the hub dataset's id, e.g. wikimedia/wikipedia")
    hub_config: str | None = setting(None, help="the hub dataset's config, e.g. 20231101.en")
    split: str = setting("train", help="the hub dataset's split")
    text_field: str = setting("text", help="the hub record's field that holds the text")
    kind: str = setting(
        "plain",
        help="plain: a folder holds one document per file, paragraphs separated by blank lines; a single file "
        "holds blank-line separated documents with one sentence or paragraph per line (the original BERT input "
        "format); a hub record is one document with one paragraph per line. wikitext: articles split at "
        "` = Title = ` headings. gutenberg: one book per file or record, Project Gutenberg header and footer "
        "removed. wikiextractor: WikiExtractor's output (the input of Google's and NVIDIA's BERT data "
        "pipelines), files of <doc …> … </doc> articles, the title line dropped, one paragraph per line",
    )
    weight: float = setting(1.0, help="the corpus's mixing weight, in documents (see mix_stop)")
    max_documents: int | None = setting(None, help="stop this corpus after that many documents; null: all")


WIKIPEDIA = CorpusConfig(
    name="wikipedia",
    source="hub",
    hub_id="wikimedia/wikipedia",
    hub_config="20231101.en",
    split="train",
    text_field="text",
    kind="plain",
)
GUTENBERG = CorpusConfig(
    name="gutenberg",
    source="hub",
    hub_id="manu/project_gutenberg",
    split="en",
    text_field="text",
    kind="gutenberg",
)


@dataclasses.dataclass
class PrepareConfig:
    """Everything `prepare` needs; the defaults are BERT's recipe at T = 128."""

    corpora: list[CorpusConfig] = setting(
        default_factory=lambda: [dataclasses.replace(WIKIPEDIA), dataclasses.replace(GUTENBERG)],
        help="the corpora, mixed (corpora.0.path=DIR sets the first one's path)",
    )
    mix_stop: str = setting(
        "all_exhausted",
        help="all_exhausted: an exhausted corpus drops out and every document is used once (the weights set the "
        "proportions of a max_documents prefix only); first_exhausted: stop when any corpus ends, so the "
        "proportions hold throughout (train.corpora.mix)",
    )
    max_documents: int | None = setting(None, help="cap on the mixed stream of documents (hub corpora are large); null: all")  # fmt: skip
    vocab_file: str | None = setting(None, help="the WordPiece vocabulary: a vocab.txt path or a hub model id")
    lowercase: bool = setting(True, help="lowercase and strip accents before WordPiece (uncased BERT)")
    train_vocab: bool = setting(False, help="train a WordPiece vocabulary on the corpora instead of vocab_file")
    vocab_size: int = setting(30522, help="the trained vocabulary's size (only with train_vocab)")
    max_seq_length: int = setting(128, help="tokens per sequence, [CLS] and both [SEP]s included")
    # The original used 80 at max_seq_length = 512.
    max_predictions_per_seq: int = setting(20, help="the most masked tokens per sequence")
    # Wettig et al. 2022 find higher rates (e.g. 0.4) train faster.
    masked_lm_prob: float = setting(0.15, help="share of a sequence's tokens masked for MLM")
    # With "none" the loss has no pair term.
    pair_task: str = setting(
        "nsp",
        help="the sentence-pair task: nsp (BERT's next sentence), sop (ALBERT's sentence order) or none (MLM only, "
        "as RoBERTa and Cramming); see train.instances",
    )
    whole_word_mask: bool = setting(False, help="mask every wordpiece of a chosen word together")
    masking: str = setting(
        "dynamic",
        help="dynamic: new masks each time a sequence is read; static: masked once, into the shards (train.instances)",
    )
    short_seq_prob: float = setting(0.1, help="probability that an instance is cut shorter than max_seq_length")
    short_seq_per: str = setting(
        "instance", help="draw the short length per instance, or per document (the original code's behaviour)"
    )
    # The original: 10, with static masking.
    dupe_factor: int = setting(1, help="passes over each pool of documents, each cutting other instances")
    segmenter: str = setting(
        "senter",
        help="sentence splitter: senter (spaCy's trained one) or sentencizer (rules, faster); see train.corpora",
    )
    spacy_model: str = setting("en_core_web_sm", help="the spaCy pipeline whose senter splits sentences")
    segment_workers: int = setting(1, help="processes that split sentences (the same sentences as one)")
    pool_tokens: int = setting(10_000_000, help="tokens of documents pooled together; NSP's random segments come from the same pool")  # fmt: skip
    shard_size: int = setting(100_000, help="instances per shard")
    seed: int = setting(12345, help="seed of the mixing, the instances and the static masks")


# -- the model, the loop, the optimizer, the checkpoints ----------------------------------------

# Beside each compute dtype: the precision of the matrix products (bertjax.precision,
# docs/precision.md). "default" is what every run trained with before the setting existed.
MATMUL_PRECISION_HELP = (
    "the matrix products: default (JAX's: float32 on a CPU, TF32 on recent NVIDIA GPUs), float32 (true float32 on "
    "every device), tf32, or bfloat16 (bfloat16 operands, float32 sums); for the step, the held-out evaluation "
    "and the probes"
)


def check_matmul_precision(value: str, key: str) -> None:
    if value not in TRAINING_PRECISIONS:
        raise UserError(f"{key}: {value!r} is not one of {', '.join(TRAINING_PRECISIONS)}")


@dataclasses.dataclass
class ModelSettings:
    preset: str = setting("tiny", help="model size: tiny, mini, small, medium, base or large (bertjax.config.PRESETS)")
    dtype: str = setting("auto", help="compute dtype: auto (bfloat16 on GPU/TPU, float32 on CPU), float32, bfloat16 or float16")  # fmt: skip
    matmul_precision: str = setting("default", help=MATMUL_PRECISION_HELP)
    max_position_embeddings: int = setting(512, help="learned positions: the longest sequence the model takes")
    hidden_dropout_prob: float = setting(0.1, help="dropout of the embeddings and of every layer's outputs")
    attention_probs_dropout_prob: float = setting(0.1, help="dropout of the attention weights")
    # The preset's shape, resized; the feed-forward width stays 4 × hidden.
    num_hidden_layers: int | None = setting(None, help="layers; null: the preset's")
    hidden_size: int | None = setting(None, help="hidden width (the feed-forward width is 4 × it); null: the preset's")  # fmt: skip
    num_attention_heads: int | None = setting(None, help="attention heads per layer; null: the preset's")
    # Recipe options for small budgets (docs/pretraining.md); the defaults are BERT's.
    layer_norm_position: str = setting(
        "post", help="post (BERT) or pre (Xiong et al. 2020; not exportable to HF): where each layer normalises"
    )
    position_embedding_init: str = setting(
        "normal", help="normal (BERT) or sinusoidal: how the position embeddings start (learned either way)"
    )

    def __post_init__(self) -> None:
        check_matmul_precision(self.matmul_precision, "model.matmul_precision")


# Both are deterministic given the seed, so a resumed run draws the masks it would have drawn.
# unsafe_rbg is left out: its fold_in does not promise independent streams.
DropoutRng = Literal["threefry2x32", "rbg"]


@dataclasses.dataclass
class LoopConfig:
    steps: int = setting(1000, help="optimizer steps")
    global_batch_size: int = setting(32, help="sequences per step, over all devices and processes")
    grad_accum_steps: int = setting(1, help="micro-batches per step; each is global_batch_size / this")
    seed: int = setting(0, help="seed of the init, the dropout and the batches' order")
    dropout_rng: DropoutRng = setting(
        "threefry2x32",
        help="JAX's generator of the dropout masks: threefry2x32 (its default: the same bits on every backend) "
        "or rbg (XLA's RngBitGenerator: cheaper bits on GPUs and TPUs; other masks, the same distribution)",
    )
    log_every: int = setting(10, help="steps between metric lines (metrics.jsonl, TensorBoard)")
    init_from: str | None = setting(
        None,
        help="start from these params (a HF directory or a bertjax run), with a fresh optimizer; null: a random init",
    )
    init_step: int | None = setting(None, help="the step of init_from's run to start from; null: its latest")

    def __post_init__(self) -> None:
        # Checked with the other settings, before any data is prepared. Every config names this
        # section `train`.
        if self.global_batch_size < 1:
            raise UserError(f"train.global_batch_size: must be an integer ≥ 1, got {self.global_batch_size}")
        if self.log_every < 1:
            raise UserError(f"train.log_every: must be an integer ≥ 1, got {self.log_every}")
        if self.seed < 0:  # numpy's generators (the batches' shuffling) take no negative seed
            raise UserError(f"train.seed: must be an integer ≥ 0, got {self.seed}")


OPTIMIZERS = ("lamb", "adamw")


@dataclasses.dataclass
class OptimizerConfig:
    name: str = setting("lamb", help=f"the optimizer: {' or '.join(OPTIMIZERS)}")
    learning_rate: float = setting(1e-3, help="the peak learning rate, reached at the end of warm-up")
    warmup_steps: int = setting(0, help="steps of linear warm-up")
    # Warm-up as a share of the budget keeps the schedule's shape when the budget changes, e.g. 0.5
    # for Cramming's triangle (Izsak et al. 2021 and Geiping & Goldstein 2022 end warm-up and decay
    # with the budget).
    warmup_fraction: float | None = setting(
        None,
        help="warm-up as a share of the step budget instead (exclusive with warmup_steps); the decay always ends "
        "at the last step",
    )
    decay_power: float = setting(1.0, help="power of the polynomial decay after warm-up; 1.0: linear, as in BERT")
    end_learning_rate: float = setting(0.0, help="the learning rate at the last step")
    weight_decay: float = setting(0.01, help="decoupled weight decay (not of biases and LayerNorm parameters)")
    b1: float = setting(0.9, help="Adam's β1")
    b2: float = setting(0.999, help="Adam's β2")
    eps: float = setting(1e-6, help="Adam's ε")
    max_grad_norm: float = setting(1.0, help="clip the gradient's global norm to this; 0: no clipping")

    def __post_init__(self) -> None:
        # Checked with the other settings, before a run writes anything: a NaN rate would only
        # show as a non-finite update at step 1. Every config names this section `optimizer`.
        if self.name not in OPTIMIZERS:
            raise UserError(f"optimizer.name: {self.name!r} is not {' or '.join(OPTIMIZERS)}")
        for name in ("learning_rate", "end_learning_rate"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise UserError(f"optimizer.{name}: must be a finite number ≥ 0, got {value}")
        for name, low, high in (("b1", 0, 1), ("b2", 0, 1)):  # Adam's moment decays: in [0, 1)
            value = getattr(self, name)
            if not low <= value < high:
                raise UserError(f"optimizer.{name}: must be in [0, 1), got {value}")
        # Accepted before, and trained on: a negative eps or decay turned the update around, a NaN
        # clipping norm turned every update into NaN.
        for name in ("eps", "weight_decay", "max_grad_norm", "decay_power"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise UserError(f"optimizer.{name}: must be a finite number ≥ 0, got {value}")
        if self.warmup_fraction is not None:
            if not 0 <= self.warmup_fraction <= 1:
                raise UserError(f"optimizer.warmup_fraction: must be in [0, 1], got {self.warmup_fraction}")
            if self.warmup_steps:
                raise UserError("optimizer.warmup_fraction: set it or warmup_steps, not both")


@dataclasses.dataclass
class CheckpointConfig:
    every: int = setting(1000, help="steps between periodic saves; 0: none")
    keep: int | None = setting(3, help="how many periodic saves to keep; null: all")
    steps: list[int] = setting(default_factory=list, help="steps always saved and kept")
    log_spaced: int = setting(0, help="also save this many log-spaced steps in [1, total] (for tracking roles over training)")  # fmt: skip
    best_metric: str | None = setting(None, help="also keep the save with the highest value of this eval metric")

    def __post_init__(self) -> None:
        if self.every < 0:  # 0 turns periodic saves off; a negative period would do so silently
            raise UserError(f"checkpoint.every: must be an integer ≥ 0 (0: no periodic saves), got {self.every}")
        # Accepted before: ignored (no log-spaced step, no save at a negative step), or a numpy
        # traceback at the second save (a negative keep).
        if self.log_spaced < 0:
            raise UserError(f"checkpoint.log_spaced: must be an integer ≥ 0, got {self.log_spaced}")
        if self.keep is not None and self.keep < 0:
            raise UserError(f"checkpoint.keep: must be an integer ≥ 0 or null (all), got {self.keep}")
        negative = [step for step in self.steps if step < 0]
        if negative:
            raise UserError(f"checkpoint.steps: steps are integers ≥ 0, got {negative[0]}")


# -- pre-training's evaluation and probes --------------------------------------------------------


@dataclasses.dataclass
class HeldOutConfig:
    corpora: list[CorpusConfig] = setting(
        default_factory=list, help="held-out corpora, prepared as the training data; empty: heldout.data_dir's, or none"
    )
    # One folder given to several runs scores them all on the same sequences and masks.
    data_dir: str | None = setting(
        None, help="a prepared held-out folder (train.prepare's, a run's heldout-T<len>) used as is; null: none"
    )
    sequences: int = setting(1024, help="the evaluation set: this many instances, the same at every evaluation")
    batch_size: int = setting(64, help="sequences per evaluation batch")
    seed: int = setting(0, help="which instances and which masked tokens")
    # A loss changepoint is placed on the evaluation grid, which checkpoints alone make coarse.
    every: int = setting(0, help="steps between evaluations besides those at every checkpoint; 0: at checkpoints only")  # fmt: skip

    def __post_init__(self) -> None:
        if self.corpora and self.data_dir:
            raise UserError(
                "heldout.data_dir and heldout.corpora: set one, not both (a prepared folder, or corpora to prepare; "
                "heldout.corpora=[] clears a config's corpora)"
            )
        if self.every < 0:
            raise UserError(f"heldout.every: must be an integer ≥ 0 (0: at checkpoints only), got {self.every}")
        for key in ("sequences", "batch_size"):
            if getattr(self, key) < 1:
                raise UserError(f"heldout.{key}: must be an integer ≥ 1, got {getattr(self, key)}")


@dataclasses.dataclass
class ProbeConfig:
    task: str | None = setting(
        None, help="null: no probes; a GLUE task (its dev split), text:FILE (one example per line) or conllu:FILE"
    )
    glue_dir: str | None = setting(None, help="local GLUE directory (<TASK>/dev.tsv); null: the hub")
    n: int = setting(200, help="the first n examples (file order)")
    max_length: int = setting(64, help="tokens per probe sequence")
    batch_size: int = setting(32, help="sequences per probe batch")
    every: int = setting(200, help="steps between probes; also at every checkpoint save")
    roles: list[str] = setting(default_factory=lambda: list(DEFAULT_ROLES), help="the roles probed")
    tau: float = setting(3.0, help="threshold τ of the role tests")
    alpha: float = setting(0.05, help="level of each one-sided test")
    # A series-wide correction needs every step: analysis.track --correction-scope series.
    test: str = setting("t", help="as analysis.roles' --test: t, z or bootstrap")
    correction: str = setting(
        "none", help="as analysis.roles' --correction: none, holm or bh, over one probe step's tests"
    )
    spacy_model: str | None = setting(None, help="spaCy pipeline for the syntactic roles of GLUE and text: sets; null: en_core_web_sm")  # fmt: skip
    parse_cache: str = setting(str(cli.CACHE_ROOT), help="where spaCy parses are cached (the analyses' cache)")
    # SAS (Chen et al. 2023) needs gold trees.
    sas: bool | None = setting(None, help="log the syntactic attention score (SAS); null: on for conllu:FILE, off otherwise")  # fmt: skip
    sas_relations: list[str] = setting(default_factory=list, help="relations whose SAS is logged beside the overall SAS, e.g. [nsubj]")  # fmt: skip
    # SAS reads the weights.
    attention: str = setting(
        "weights",
        help="what β reads, as the analyses' --attention: the weights, or the norm-weighted attention of "
        "Kobayashi et al. 2020 (docs/attention-norms.md)",
    )


# -- steering head roles (train.interventions) ---------------------------------------------------


@dataclasses.dataclass
class InterventionConfig:
    """One penalty on a role's sieve bias β, added to the training loss (docs/pretraining.md). Checked
    with the model's shape by `train.interventions.check_config`, before any data work."""

    role: str = setting("", help="the role whose β is steered (required): local, prev, next, block, cls, sep or delimiter")  # fmt: skip
    mode: str = setting("suppress", help="suppress: push β to chance (1) or below; promote: pull it up to `target`")
    weight: float = setting(1.0, help="the penalty's weight in the loss")
    target: float = setting(3.0, help="promote's β target (the role tests' τ); suppress's is chance, 1")
    layers: list[int] | None = setting(None, help="the layers (0-based) steered; null: every layer")
    heads: list[int] | None = setting(None, help="the heads (0-based) steered in each of those layers; null: every head")  # fmt: skip
    start: int = setting(0, help="the first step steered: the update from step `start` to `start` + 1")
    stop: int | None = setting(None, help="steered before this step, not from it; null: to the end of the run")


# -- the commands' configs -----------------------------------------------------------------------


@dataclasses.dataclass
class Phase2Config:
    steps: int = setting(1000, help="phase 2's steps, after phase 1's")
    max_seq_length: int = setting(512, help="phase 2's sequence length")
    max_predictions_per_seq: int = setting(80, help="phase 2's most masked tokens per sequence")
    global_batch_size: int = setting(256, help="phase 2's sequences per step")
    learning_rate: float = setting(5e-4, help="phase 2's peak learning rate (the optimizer section's other settings hold)")  # fmt: skip
    warmup_steps: int = setting(100, help="phase 2's warm-up steps")


@dataclasses.dataclass
class PretrainConfig:
    """`python -m train.pretrain`: BERT's pre-training (MLM + NSP), in one or two phases."""

    model: ModelSettings = setting(default_factory=ModelSettings, help="the encoder: its size and recipe options")
    data: PrepareConfig = setting(default_factory=PrepareConfig, help="phase 1's data, prepared into the workdir (as train.prepare)")  # fmt: skip
    data_dir: str | None = setting(None, help="prepared shards of phase 1; null: prepared into the workdir")
    train: LoopConfig = setting(default_factory=LoopConfig, help="phase 1's training loop")
    optimizer: OptimizerConfig = setting(default_factory=OptimizerConfig, help="the optimizer and its schedule")
    checkpoint: CheckpointConfig = setting(default_factory=CheckpointConfig, help="which steps are saved and kept")
    mesh: MeshConfig = setting(default_factory=MeshConfig, help="how the devices split into the mesh's axes")
    phase2: Phase2Config | None = setting(
        None,
        help="a second phase (BERT's recipe: a short phase at T = 512), from phase 1's last params with its own "
        "data, batch size and schedule (e.g. phase2={steps: 1000}); null: none",
    )
    heldout: HeldOutConfig = setting(default_factory=HeldOutConfig, help="the held-out evaluation")
    distributed: bool = setting(False, help="call jax.distributed.initialize() (multi-host TPU pods, SLURM)")
    probe: ProbeConfig = setting(default_factory=ProbeConfig, help="role probes during training (off while probe.task is null)")  # fmt: skip
    intervene: list[InterventionConfig] = setting(
        default_factory=list,
        help="penalties that steer head roles during training, e.g. intervene=[{role: prev, mode: suppress}]; "
        "empty: none (docs/pretraining.md)",
    )


@dataclasses.dataclass
class DataSettings:
    glue_dir: str | None = setting(None, help="local GLUE directory (<TASK>/<split>.tsv; --glue-dir); null: the hub, nyu-mll/glue")  # fmt: skip
    max_seq_length: int = setting(128, help="tokens per sequence; longer pairs are truncated")
    max_train_examples: int | None = setting(None, help="the first N training examples (quick runs); null: all")
    eval_split: str = setting("dev", help="the split evaluated: dev, validation or train (test has no labels)")
    eval_batch_size: int = setting(128, help="sequences per evaluation batch")
    # Several times less compute on GLUE's short sentences; see train/glue_data.py.
    group_by_length: bool = setting(True, help="batches of similar length, each cut to its longest sequence (rounded up to pad_multiple)")  # fmt: skip
    pad_multiple: int = setting(16, help="a length-grouped batch's length is a multiple of this")


@dataclasses.dataclass
class FinetuneLoop:
    epochs: int = setting(3, help="passes over the training examples")
    global_batch_size: int = setting(32, help="sequences per step, over all devices and processes")
    grad_accum_steps: int = setting(1, help="micro-batches per step; each is global_batch_size / this")
    seed: int = setting(0, help="the classifier's init, dropout and shuffling; seed s of --seeds K is seed + s")
    log_every: int = setting(50, help="steps between metric lines")
    # A ratio, because the step count depends on the data size.
    warmup_ratio: float | None = setting(0.1, help="linear warm-up over this fraction of all steps; null: optimizer.warmup_steps instead")  # fmt: skip


@dataclasses.dataclass
class FinetuneCheckpoints:
    log_spaced: int = setting(
        0,
        help="also keep this many log-spaced steps in [1, last step] (as pre-training's checkpoint.log_spaced), "
        "for analysis.track --run WORKDIR",
    )


# Each task's fine-tuning config, read when --config names none.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "finetune"


def task_spec(task: str) -> TaskSpec:
    if task not in TASKS:
        raise UserError(f"unknown task {task!r} (--task): choose one of {', '.join(TASKS)}")
    return TASKS[task]


@dataclasses.dataclass
class FinetuneConfig:
    """`python -m train.finetune`: a classifier on BERT's pooled output, fine-tuned on a GLUE task."""

    task: str = setting("mrpc", help="the GLUE task (set by --task)")
    init: str = setting("", help="the checkpoint to start from: a bertjax run workdir, a HF-format directory or hub id (set by --ckpt)")  # fmt: skip
    init_step: int | None = setting(None, help="a step of init's bertjax run; null: its latest")
    seeds: int = setting(1, help="runs with seeds train.seed, +1, …, reported as mean ± std (--seeds)")
    best_metric: str | None = setting(None, help="the metric that picks the best checkpoint; null: the task's own, F1 for MRPC and QQP, else accuracy")  # fmt: skip
    dtype: str = setting("auto", help="compute dtype: auto (bfloat16 on GPU/TPU, float32 on CPU), float32, bfloat16 or float16")  # fmt: skip
    matmul_precision: str = setting("default", help=MATMUL_PRECISION_HELP)
    data: DataSettings = setting(default_factory=DataSettings, help="the task's examples and their batches")
    train: FinetuneLoop = setting(default_factory=FinetuneLoop, help="the training loop")
    optimizer: OptimizerConfig = setting(
        default_factory=lambda: OptimizerConfig(name="adamw", learning_rate=2e-5),
        help="the optimizer and its schedule",
    )
    mesh: MeshConfig = setting(default_factory=MeshConfig, help="how the devices split into the mesh's axes")
    checkpoint: FinetuneCheckpoints = setting(default_factory=FinetuneCheckpoints, help="which steps are kept besides the last and the best")  # fmt: skip

    def __post_init__(self) -> None:
        check_matmul_precision(self.matmul_precision, "matmul_precision")


# -- the commands' own flags ---------------------------------------------------------------------
# Each command declares its few flags (the config file, the workdir, ...) as a settings dataclass,
# as the analyses do, and they are drawn from it (`command_parser`); the config's keys are set in
# the file or by `key=value`, and listed in the epilog.

F = TypeVar("F")


def overrides_setting(example: str) -> Any:
    return setting((), flag="key=value", help=f"dotted.key=value, e.g. {example}")


def print_config_setting() -> Any:
    return setting(False, help="print the resolved config as YAML, a file for --config, and stop")


def command_parser(prog: str, doc: str, flags: type, schema: type, note: str = "") -> argparse.ArgumentParser:
    """The parser of the training command `prog`: the flags of `flags`, and in its `--help` every
    key of the config it reads, `schema` (`keys_help`)."""
    parser = cli.parser(prog, doc)
    # --config names the run's config, not a file of these flags: the required ones stay required.
    add_flags(parser, flags, file_supplies=False)
    parser.epilog = keys_help(schema, note)
    return parser


def parse_command(parser: argparse.ArgumentParser, flags: type[F], argv: Sequence[str] | None, intermixed: bool = False) -> F:  # fmt: skip
    """The command's flags, typed; `intermixed`: flags may follow the overrides."""
    args = parser.parse_intermixed_args(argv) if intermixed else parser.parse_args(argv)
    return make(flags, flag_values(flags, args))


def print_config_if_asked(print_config: bool, config: Any) -> None:
    """`--print-config`: the resolved config on stdout, then exit 0."""
    if print_config:
        print(resolved_yaml(config), end="")
        raise SystemExit(0)


def keys_help(schema: type, note: str = "") -> str:
    """The `--help` epilog of a command that reads `schema` from YAML and `key=value` overrides:
    every key with its default and help."""
    head = (
        "config keys (set in the --config file, or as key=value on the command line: a list as [a,b], a section as "
        f"{{k: v}}, null for none){note}:"
    )
    return "\n".join([head, *describe_keys(schema)])
