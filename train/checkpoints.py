"""The checkpoint policy of a training run, in one place: when to save, what to keep, what to resume.

Layout: `bertjax.checkpoint` (params and meta items, readable without this module) plus
`opt_state` and `trainer` (step, data position, RNG key, phase). Orbax writes each step into a
temporary folder and renames it when complete, so a step folder is either whole or absent.

Kept: the explicit steps and the last, the latest `keep` periodic saves and, with `best_metric`, the
save whose evaluation scored highest (ties: the later), its metrics stored beside it by orbax. A
later phase of a run keeps every step an earlier phase left.

Load order at start-up: the latest readable checkpoint of this workdir (a corrupt one is reported
and skipped), else the params of `init_from` with a fresh optimizer, else a random init.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import operator
import shutil
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from bertjax import checkpoint as ckpt
from bertjax import runinfo
from bertjax.errors import UserError
from train.config import CheckpointConfig

log = logging.getLogger(__name__)

OPT_STATE = "opt_state"
TRAINER = "trainer"
OPT_SIGNATURE = "opt_state_signature"  # in the meta item: which optimizer state a step holds
ITEMS = (ckpt.PARAMS, ckpt.META, OPT_STATE, TRAINER)


def log_spaced_steps(count: int, total: int) -> list[int]:
    """`count` distinct steps spaced evenly in log scale from 1 to `total` (both included)."""
    if count <= 0 or total < 1:
        return []
    steps = {round(math.exp(math.log(total) * i / max(count - 1, 1))) for i in range(count)}
    return sorted(s for s in steps if 1 <= s <= total)


# What a resumed run may change: how it logs, evaluates, probes, saves and spreads over devices, not
# what it trains (runs from before held-out evaluation or probes existed record no such settings).
RESUMABLE_SETTINGS = ("train.log_every", "checkpoint.", "mesh.", "distributed", "seeds", "data.eval_batch_size",
                      "data.segment_workers", "data.shard_size", "heldout.", "probe.")  # fmt: skip
# Settings added since runs were first recorded, at the value a run that records none trained with.
ADDED_SETTINGS = {"model.matmul_precision": "default", "matmul_precision": "default", "intervene": [],
                  "train.dropout_rng": "threefry2x32"}  # fmt: skip


def setting_changes(
    stored: dict[str, Any] | None, current: dict[str, Any] | None, ignore: tuple[str, ...] = RESUMABLE_SETTINGS
) -> list[str]:
    """`key: stored vs current` for each setting that differs, dotted keys, those starting with
    one of `ignore` aside; nothing when either side records no settings."""
    if not stored or not current:
        return []

    def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out = {}
        for key, value in tree.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    old, new = flat(json.loads(json.dumps(stored))), flat(json.loads(json.dumps(current)))
    old = {key: value for key, value in ADDED_SETTINGS.items() if key in new} | old
    keys = [k for k in dict.fromkeys([*new, *old]) if not k.startswith(ignore)]
    return [f"{k}: {old.get(k)!r} vs {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def saved_steps(workdir: Path) -> list[int]:
    """The steps a training run has saved in `workdir` (a run starts afresh where there are none)."""
    directory = Path(workdir) / ckpt.CHECKPOINTS
    return ckpt.available_steps(directory) if directory.is_dir() else []


def check_resumable(workdir: Path, run_config: dict[str, Any]) -> None:
    """Before a run writes anything into `workdir`: refuse it when the newest readable checkpoint
    there was trained with other settings. Without this a rerun with, say, another seed or epoch
    count went on from the old run's step under a new schedule, its config.yaml and run.json
    recording settings the early steps never had."""
    directory = Path(workdir) / ckpt.CHECKPOINTS
    for step in reversed(saved_steps(workdir)):
        try:
            stored = ckpt.read_meta(directory, step)
        except UserError:
            continue  # restore_latest reports it and falls back
        changes = setting_changes(stored.get("run_config"), run_config)
        if changes:
            raise UserError(
                f"{directory}: step {step} was trained with other settings ({'; '.join(changes)}); "
                "resume with the run's own config or use a new --workdir"
            )
        return


def saved_line(workdir: Path) -> str:
    """The last line of a training run: where its checkpoints are, and their first and last step."""
    directory = Path(workdir).expanduser().resolve() / ckpt.CHECKPOINTS
    steps = saved_steps(directory.parent)
    if not steps:
        return f"no checkpoint saved in {directory}"
    which = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]} to {steps[-1]}"
    return f"checkpoints in {directory} ({len(steps)} saved, {which})"


def tree_signature(tree: Any) -> str:
    """A digest of a tree's paths, shapes and dtypes: two trees share it iff a checkpoint of one
    restores into the other."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    text = ";".join(f"{jax.tree_util.keystr(path)}:{tuple(x.shape)}:{x.dtype}" for path, x in leaves)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _HeldThreadErrors(logging.Filter):
    """Holds back the errors orbax's writer threads (through absl) and asyncio log while a save
    runs, each with its traceback, one per array (~300 lines for a tiny model): a save that fails
    for lack of room is then one line, and any other outcome logs them after all."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if record.levelno >= logging.ERROR and ("raised an exception" in message or "never retrieved" in message):
            self.records.append(record)
            return False
        return True

    def release(self, loggers: list[logging.Logger]) -> None:
        """Stops holding, and logs what was held."""
        for logger in loggers:
            logger.removeFilter(self)
        for record in self.records:
            logging.getLogger(record.name).handle(record)
        self.records = []


class Checkpointer:
    def __init__(self, workdir: Path, config: CheckpointConfig, total_steps: int, first_step: int = 0):
        """`first_step`: where this phase of the run begins."""
        self.directory = Path(workdir).resolve() / ckpt.CHECKPOINTS
        self.explicit = sorted(set(config.steps) | set(log_spaced_steps(config.log_spaced, total_steps)))
        self.every = config.every
        self.total_steps = total_steps
        # Orbax applies the policy to every step in the directory, and this phase's log-spaced
        # steps are not the earlier phase's: without this, phase 2 deleted most of phase 1's.
        earlier = [step for step in self._stored_steps() if step <= first_step]
        policies = [checkpoint_managers.CustomSteps(self.explicit + [total_steps] + earlier)]
        policies.append(checkpoint_managers.LatestN(config.keep))
        best_fn = None
        if config.best_metric is not None:
            best_fn = operator.itemgetter(config.best_metric)
            # Saves without metrics (a SIGTERM mid-epoch) are kept only while they are the latest.
            policies.append(
                checkpoint_managers.BestN(get_metric_fn=best_fn, n=1, keep_checkpoints_without_metrics=False)
            )
        self.manager = ocp.CheckpointManager(
            self.directory,
            item_names=ITEMS,
            options=ocp.CheckpointManagerOptions(
                create=True,
                preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
                # Orbax writes a save's metrics next to it (and reads them back on resume) only
                # when best_fn is set; BestN above is what keeps the best.
                best_fn=best_fn,
                enable_async_checkpointing=False,
            ),
        )

    def _stored_steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

    def should_save(self, step: int) -> bool:
        return step in self.explicit or step == self.total_steps or (self.every > 0 and step % self.every == 0)

    def save(
        self,
        step: int,
        params: dict,
        opt_state: Any,
        trainer: dict,
        meta: dict,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """`metrics`: this step's evaluation, which ranks the save for `best_metric`."""
        args = ckpt.save_args(params, meta) | {
            OPT_STATE: ocp.args.StandardSave(opt_state),
            TRAINER: ocp.args.JsonSave(trainer),
        }
        held = _HeldThreadErrors()
        loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
        for logger in loggers:
            logger.addFilter(held)
        try:
            with ckpt.orbax_race_reports_held():
                self.manager.save(step, args=ocp.args.Composite(**args), metrics=metrics, force=True)
                self.manager.wait_until_finished()
        except Exception as e:
            reason = runinfo.no_space(e)
            if reason is None:
                held.release(loggers)
                raise
            # The filters stay for the rest of the process, which this error ends: orbax's other
            # writer threads log their failures after the first has reached us, asyncio its
            # unretrieved ones when they are collected, at exit, and TensorStore's callbacks of the
            # pending writes find orbax's event loop closed until then.
            self._remove_partial(step)
            kept = self._stored_steps()
            raise UserError(
                f"no space left saving checkpoint step {step} into {self.directory} ({reason}); the partial "
                f"step was removed; {f'the last saved step is {kept[-1]}' if kept else 'no step was saved'}: "
                "make room and run the same command again to resume"
            ) from None
        held.release(loggers)

    def _remove_partial(self, step: int) -> None:
        """Removes what a failed save wrote: orbax's temporary for `step` (the step's folder
        itself appears only when the save is complete), so nothing is left for a resume to try."""
        if jax.process_index() == 0:
            for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def restore_latest(self, abstract_params, abstract_opt, meta: dict) -> tuple[int, dict] | None:
        """(step, items) of the newest readable checkpoint, or None when there is none. `meta`:
        this run's, to which a checkpoint's must match (model shapes, optimizer state)."""
        for step in reversed(self.steps()):
            try:
                stored = ckpt.read_meta(self.directory, step)
            except UserError as e:
                log.error("checkpoint step %d is unreadable (%s); trying the previous one", step, e)
                continue
            if stored.get("param_shapes") != meta["param_shapes"]:
                raise UserError(
                    f"{self.directory}: holds a checkpoint of another model shape "
                    f"(step {step}); use a new --workdir or the matching model config"
                )
            # Another optimizer's state does not restore; without this check that failure read as
            # a corrupt checkpoint, and the run moved every step aside and began again.
            if stored.get(OPT_SIGNATURE, meta[OPT_SIGNATURE]) != meta[OPT_SIGNATURE]:
                raise UserError(
                    f"{self.directory}: step {step} holds the state of another optimizer than this run's "
                    f"(optimizer.name differs from the one it was saved with); resume with the run's config or use a new --workdir"
                )
            try:
                with ckpt.orbax_race_reports_held():
                    restored = self.manager.restore(
                        step,
                        args=ocp.args.Composite(
                            **{
                                ckpt.PARAMS: ocp.args.StandardRestore(abstract_params),
                                OPT_STATE: ocp.args.StandardRestore(abstract_opt),
                                TRAINER: ocp.args.JsonRestore(),
                            }
                        ),
                    )
            except Exception as e:  # noqa: BLE001 (orbax raises many types for truncated or missing files)
                log.error(
                    "checkpoint step %d is corrupt or partial (%s: %s); moved to %s, trying the previous one",
                    step,
                    type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "",
                    self._set_aside(step),
                )
                continue
            return step, {k: restored[k] for k in (ckpt.PARAMS, OPT_STATE, TRAINER)}
        return None

    def _set_aside(self, step: int) -> Path:
        """Moves a bad step out of the manager's directory, so the resumed run can save it anew;
        kept, not deleted, in case it is worth a look."""
        target = self.directory.parent / "corrupt_checkpoints" / str(step)
        for copy in itertools.count(1):  # an earlier copy of this step stays too
            if not target.exists():
                break
            target = target.with_name(f"{step}.{copy}")
        if jax.process_index() == 0:
            target.parent.mkdir(exist_ok=True)
            (self.directory / str(step)).rename(target)
        self.manager.reload()
        return target

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_with_shardings(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
