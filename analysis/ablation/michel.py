"""Michel et al. 2019 §4 (`python -m analysis.prune`): head importance from ∂L/∂ξ, iterative
pruning by importance against random orders, and how many heads go before a one-point drop.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.ablation.evaluation import (
    ONE_POINT,
    MaskedEvaluator,
    check_classifier,
    check_split,
    full_mask,
    load_eval_set,
)
from analysis.ablation.figures import head_heatmap, plot_pruning
from analysis.common.examples import fit_max_length
from analysis.common.figures import figure_formats, select_formats
from analysis.common.flags import check_device_count
from analysis.common.forward import Devices
from analysis.common.settings import check_types
from bertjax import glue, runinfo
from bertjax.errors import UserError
from bertjax.pretrained import from_pretrained, load_tokenizer, resolve
from bertjax.progress import tqdm


@dataclasses.dataclass(frozen=True)
class MichelConfig:
    """Everything that decides the numbers of a run; saved in run.json.

    `importance_n` None means `n`: the importance set is the metric's examples unless told
    otherwise (on another split, its first `n`)."""

    ckpt: str
    task: str = "mrpc"
    step: int | None = None
    glue_dir: str | None = None
    split: str = "dev"
    n: int | None = None
    importance_split: str = "dev"
    importance_n: int | None = None
    max_length: int = 128
    batch_size: int = 32
    metric: str | None = None
    prune_step: float = 0.1
    reestimate: bool = False
    random_seeds: int = 3
    out: str = "prune_out"
    overwrite: bool = False
    figure_format: str = "png"
    devices: int | None = None  # --devices: the first N local devices (None: all)
    allow_nonfinite: bool = False  # analyse weights holding NaN or ±Inf, with a warning

    def __post_init__(self) -> None:
        check_types(self)
        check_device_count(self.devices)
        spec = glue.task_spec(self.task)
        check_split("--split", self.split)
        check_split("--importance-split", self.importance_split)
        if self.metric is not None and self.metric not in spec.metrics:
            raise UserError(f"--metric {self.metric!r}: task {self.task} reports {', '.join(spec.metrics)}")
        if not 0.0 < self.prune_step <= 0.5:
            raise UserError(f"--prune-step must be in (0, 0.5], got {self.prune_step}")
        if self.random_seeds < 0:
            raise UserError(f"--random-seeds must be ≥ 0, got {self.random_seeds}")
        for flag, value in (("--n", self.n), ("--importance-n", self.importance_n), ("--batch-size", self.batch_size)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1, got {value}")
        if self.importance_n is None:
            object.__setattr__(self, "importance_n", self.n)

    @property
    def metric_name(self) -> str:
        return self.metric or glue.task_spec(self.task).metrics[0]


def normalise_per_layer(importance: np.ndarray) -> np.ndarray:
    """Each layer's row scaled to unit L2 norm (an all-zero row stays zero)."""
    norms = np.linalg.norm(importance, axis=-1, keepdims=True)
    return np.divide(importance, norms, out=np.zeros_like(importance, dtype=float), where=norms > 0)


def pruning_counts(n_total: int, step: float) -> list[int]:
    """Heads pruned at each step: round(k · step · n_total) for k = 0, 1, … up to all heads."""
    steps = math.ceil(round(1.0 / step, 9))
    return sorted({min(n_total, round(k * step * n_total)) for k in range(steps + 1)} | {n_total})


@dataclasses.dataclass(frozen=True)
class PruneStep:
    heads_pruned: int
    metric: float
    mask: np.ndarray  # [L, H] float, 0 = pruned
    newly_pruned: tuple[int, ...] = ()  # flat indices (layer-major) masked at this step, in pruning order


def prune_in_order(
    order: Sequence[int], counts: Sequence[int], metric_fn: Callable[[np.ndarray], float], shape: tuple[int, int]
) -> list[PruneStep]:
    """Prunes heads (flat indices, layer-major) in a fixed order, measuring at each count."""
    steps = []
    previous = 0
    for count in counts:
        mask = full_mask(*shape).ravel()
        mask[list(order[:count])] = 0.0
        mask = mask.reshape(shape)
        steps.append(PruneStep(count, metric_fn(mask), mask, tuple(int(i) for i in order[previous:count])))
        previous = count
    return steps


def prune_by_importance(
    importance: np.ndarray,
    counts: Sequence[int],
    metric_fn: Callable[[np.ndarray], float],
    reestimate_fn: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[list[PruneStep], list[np.ndarray]]:
    """Michel's iterative pruning: at each step mask the least important heads still unpruned.

    `importance` [L, H] is the estimate at ξ = 1; with `reestimate_fn`, `reestimate_fn(mask)`
    replaces it after every step. Ties go to the lower flat index. Returns the steps and the
    importance estimates used.
    """
    mask = full_mask(*importance.shape)
    estimates = [importance]
    steps = []
    for count in counts:
        pruned = int((mask == 0).sum())
        chosen = np.array([], int)
        if count > pruned:
            if reestimate_fn is not None and pruned:
                estimates.append(reestimate_fn(mask))
            ranked = np.where(mask.ravel() > 0, estimates[-1].ravel(), np.inf)
            chosen = np.argsort(ranked, kind="stable")[: count - pruned]
            mask = mask.copy()
            mask.ravel()[chosen] = 0.0
        steps.append(PruneStep(count, metric_fn(mask), mask, tuple(int(i) for i in chosen)))
    return steps, estimates


def pruning_order(steps: Sequence[PruneStep], shape: tuple[int, int]) -> pd.DataFrame:
    """One row per head in the order it was pruned, with the curve point (`heads_pruned`) at which
    it was first masked: under --reestimate the order is not recoverable from any one estimate."""
    rows = [
        {"layer": flat // shape[1], "head": flat % shape[1], "heads_pruned": step.heads_pruned}
        for step in steps for flat in step.newly_pruned
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=["layer", "head", "heads_pruned"]).rename_axis("rank").reset_index()


def heads_within(curve: pd.DataFrame, tolerance: float = ONE_POINT) -> int:
    """The most heads pruned with the metric never below (unpruned metric − tolerance) up to there."""
    curve = curve.sort_values("heads_pruned")
    baseline = curve["metric"].iloc[0]
    # A tiny slack absorbs float noise in metrics that are ratios of counts.
    ok = (curve["metric"] >= baseline - tolerance - 1e-12).cummin()
    return int(curve["heads_pruned"][ok].max())


def heads_within_per_seed(random_runs: pd.DataFrame, tolerance: float = ONE_POINT) -> dict:
    """`heads_within` of each random order on its own, and their median and range: the mean curve
    over seeds can stay within the tolerance where every single order has already left it."""
    per_seed = [heads_within(runs, tolerance) for _, runs in random_runs.groupby("seed")]
    return {"median": float(np.median(per_seed)), "min": min(per_seed), "max": max(per_seed), "per_seed": per_seed}


def run(config: MichelConfig, model=None, tokenizer=None) -> dict:
    """The whole analysis; returns what run.json records about the task. `model` and
    `tokenizer`: `config.ckpt` already loaded (a BertForSequenceClassification), used instead of
    loading it again."""
    started = time.perf_counter()
    formats = select_formats(config.figure_format)
    with runinfo.atomic_out(config.out, config.overwrite) as tmp, figure_formats(formats):
        return _run(config, tmp, started, model, tokenizer)


def _run(config: MichelConfig, tmp: Path, started: float, model, tokenizer) -> dict:
    timings: dict[str, float] = {}
    task, metric = config.task, config.metric_name
    clock = time.perf_counter()
    source = resolve(config.ckpt, config.step)
    if model is None:
        model = from_pretrained(
            config.ckpt, "BertForSequenceClassification", step=config.step, trained_heads=True,
            allow_nonfinite=config.allow_nonfinite,
        )  # fmt: skip
    check_classifier(model, config.ckpt, config.step, [task])
    if tokenizer is None:
        tokenizer = load_tokenizer(config.ckpt, step=config.step)
    config = fit_max_length(config, model.config.max_sequence_length)
    shape = (model.config.num_hidden_layers, model.config.num_attention_heads)
    glue_dir = None if config.glue_dir is None else Path(config.glue_dir)
    devices = Devices.local(config.devices)
    metric_set, files = load_eval_set(
        tokenizer, task, config.split, glue_dir, config.n, config.max_length, config.batch_size
    )  # fmt: skip
    evaluator = MaskedEvaluator(model, metric_set, devices)
    if config.importance_split == config.split and config.importance_n == config.n:
        importance_evaluator = evaluator
    else:
        importance_set, more = load_eval_set(
            tokenizer, task, config.importance_split, glue_dir, config.importance_n,
            config.max_length, config.batch_size,
        )  # fmt: skip
        files += more
        importance_evaluator = MaskedEvaluator(model, importance_set, devices)
    evaluators = list({id(e): e for e in (evaluator, importance_evaluator)}.values())
    timings["load"] = time.perf_counter() - clock

    counts = pruning_counts(shape[0] * shape[1], config.prune_step)

    def metric_fn(mask: np.ndarray) -> float:
        return evaluator.metrics(head_mask=mask)[metric]

    def importance_fn(mask: np.ndarray) -> np.ndarray:
        return normalise_per_layer(importance_evaluator.mask_gradients(head_mask=mask))

    clock = time.perf_counter()
    raw = importance_evaluator.mask_gradients()
    importance = normalise_per_layer(raw)
    timings["importance"] = time.perf_counter() - clock
    layers, heads = np.indices(shape)
    columns = {"layer": layers, "head": heads, "importance": importance, "importance_raw": raw}
    pd.DataFrame({k: v.ravel() for k, v in columns.items()}).to_csv(tmp / f"{task}_importance.csv", index=False)
    importance_examples = importance_evaluator.eval_set.size
    figures = head_heatmap(
        importance,
        f"{task}: head importance E|∂L/∂ξ| on {config.importance_split} ({importance_examples} examples), "
        "unit L2 norm per layer",
        "normalised importance", tmp, f"{task}_importance",
    )  # fmt: skip

    clock = time.perf_counter()
    with tqdm(total=len(counts) * (1 + config.random_seeds), desc=f"{task} prune", unit="step") as progress:

        def measured(mask: np.ndarray) -> float:
            progress.update()
            return metric_fn(mask)

        reestimate_fn = importance_fn if config.reestimate else None
        steps, estimates = prune_by_importance(importance, counts, measured, reestimate_fn)
        random_steps = {
            seed: prune_in_order(np.random.default_rng(seed).permutation(shape[0] * shape[1]), counts, measured, shape)
            for seed in range(config.random_seeds)
        }
    timings["pruning"] = time.perf_counter() - clock

    n_total = shape[0] * shape[1]
    rows = [
        {"fraction_pruned": s.heads_pruned / n_total, "heads_pruned": s.heads_pruned, "metric": s.metric,
         "order": "importance"}
        for s in steps
    ]  # fmt: skip
    random_runs = pd.DataFrame(
        [{"seed": seed, "fraction_pruned": s.heads_pruned / n_total, "heads_pruned": s.heads_pruned, "metric": s.metric}
         for seed, run_steps in random_steps.items() for s in run_steps]
    )  # fmt: skip
    if len(random_runs):
        mean = random_runs.groupby(["fraction_pruned", "heads_pruned"], as_index=False)["metric"].mean()
        rows += [{**r, "order": "random"} for r in mean.to_dict("records")]
        random_runs.to_csv(tmp / f"{task}_pruning_random_seeds.csv", index=False)
    curve = pd.DataFrame(rows, columns=["fraction_pruned", "heads_pruned", "metric", "order"])
    curve.to_csv(tmp / "pruning.csv", index=False)
    pruning_order(steps, shape).to_csv(tmp / f"{task}_pruning_order.csv", index=False)
    figures += plot_pruning(curve, random_runs, metric, task, config.split, tmp)

    within: dict = {"importance": heads_within(curve[curve["order"] == "importance"])}
    if len(random_runs):
        within["random"] = heads_within_per_seed(random_runs)
    result = {
        "task": task,
        "metric": metric,
        "split": config.split,
        "examples": metric_set.size,
        "importance_set": {"split": config.importance_split, "examples": importance_examples},
        "baseline": evaluator.metrics(),
        "heads_prunable_within_one_point": within,
        "importance_estimates": len(estimates),
        "forward_passes": evaluator.forward_passes,
        "importance_passes": importance_evaluator.gradient_passes,
        "compiled_executables": sum(e.compiled_shapes() for e in evaluators),
        "data_files": [{"path": str(f), "sha256": runinfo.input_sha256(f)} for f in dict.fromkeys(files)],
    }
    timings["total"] = time.perf_counter() - started
    runinfo.write_run_json(
        tmp,
        {
            "config": dataclasses.asdict(config),
            "checkpoint": source.describe(),
            "model_config": model.config.to_hf_dict(),
            "result": result,
            "figures": sorted(p.name for p in figures),
            "mesh": devices.record(),
            "timings_s": {k: round(v, 3) for k, v in timings.items()},
        },
    )
    summary = f"importance {within['importance']}/{n_total}"
    if "random" in within:
        r = within["random"]
        summary += (
            f", random median {r['median']:g}/{n_total} (range {r['min']}–{r['max']} over {len(r['per_seed'])} seeds)"
        )
    print(f"{task}: unpruned {metric} {steps[0].metric:.4f}; heads prunable before a one-point drop: {summary}")
    return result
