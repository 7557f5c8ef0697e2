"""Throughput, MFU and the metric writers (JSONL and TensorBoard), process 0 only."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax

from bertjax import runinfo
from bertjax.config import BertConfig

# Dense bf16 peak FLOP/s per device (vendor datasheets, without sparsity).
PEAK_BF16_FLOPS = {
    "H100": 989e12,
    "H200": 989e12,
    "A100": 312e12,
    "L4": 121e12,
    "TPU v3": 123e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
}


def peak_flops(device: jax.Device) -> float | None:
    kind = device.device_kind
    for name, flops in PEAK_BF16_FLOPS.items():
        if name.lower() in kind.lower():
            return flops
    return None


def flops_per_token(config: BertConfig, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6·N (forward + backward matmuls) + 12·L·T·d (attention scores
    and their use), the convention docs/pretraining.md states."""
    return 6 * n_params + 12 * config.num_hidden_layers * seq_len * config.hidden_size


def throughput(
    steps: int, elapsed: float, sequences_per_step: int, tokens: float, flops: float, peak: float | None, devices: int
) -> dict[str, float]:
    """Rates over a window of `steps` steps that took `elapsed` seconds; MFU (the achieved share of
    `peak` FLOP/s per device, all devices together) only when the peak is known."""
    rates = {
        "steps_per_s": steps / elapsed,
        "sequences_per_s": steps * sequences_per_step / elapsed,
        "tokens_per_s": tokens / elapsed,
    }
    if peak is not None:
        rates["mfu"] = flops / elapsed / (peak * devices)
    return rates


def keep_rows_up_to(path: Path, step: int) -> None:
    """Rewrites the row log `path` (metrics.jsonl, eval.jsonl) without its rows after `step` and without a last line that a
    kill cut short (the next row was appended to it); a log that needs neither is left untouched."""
    if path.is_symlink() or not path.is_file():
        return  # nothing yet; a link is refused when it is opened for appending
    lines = path.read_bytes().splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            row = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(line)
    if len(kept) < len(lines):
        with runinfo.atomic_file(path, binary=True, overwrite=True) as f:
            f.writelines(kept)


class MetricsWriter:
    """Appends one JSON object per logged step to `metrics.jsonl` and its scalars to a TensorBoard
    event file, both written and flushed in the caller's thread: tensorboardX's `SummaryWriter`
    writes from a thread of its own, and when a full disk ended that thread the trainer waited on
    its queue forever. A write that fails stops the run with one line."""

    def __init__(self, workdir: Path, enabled: bool, start: int = 0):
        """`start`: the step the run starts from (the restored checkpoint's, 0 for a new run). The
        rows after it were logged by a run killed before its next checkpoint, and are logged again
        now: dropped from metrics.jsonl (with a line torn by the kill) and purged from TensorBoard's
        view, so each step has its rows once."""
        self.enabled = enabled
        self.failed = False
        if not enabled:
            return
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self.jsonl_path = Path(workdir) / "metrics.jsonl"
        with self._stop_on_error(self.jsonl_path):
            keep_rows_up_to(self.jsonl_path, start)
        self.jsonl = runinfo.open_append(self.jsonl_path)
        directory = Path(workdir) / "tensorboard"
        with self._stop_on_error(directory):
            directory.mkdir(exist_ok=True)
            # SummaryWriter's file name: tensorboard/events.out.tfevents.<time>.<host>
            self.events = EventsWriter(str(directory / "events"))
            # tensorboardX's `purge_step`: TensorBoard hides the earlier files' events from this step on.
            self.events.write_event(Event(step=start + 1, file_version="brain.Event:2"))
            self.events.write_event(Event(step=start + 1, session_log=SessionLog(status=SessionLog.START)))
            self.events.flush()

    @contextlib.contextmanager
    def _stop_on_error(self, path: Path) -> Iterator[None]:
        self.failed = True  # stays so if the block raises
        with runinfo.log_write(path, "the training metrics"):
            yield
        self.failed = False

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        now = time.time()
        with self._stop_on_error(self.jsonl_path):
            self.jsonl.write(json.dumps({"step": step, "time": now, **metrics}) + "\n")
            self.jsonl.flush()
        with self._stop_on_error(Path(self.events._file_name)):
            for name, value in metrics.items():
                if isinstance(value, (int, float)):
                    self.events.write_event(Event(summary=scalar(name, value), wall_time=now, step=step))
            self.events.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        for close in (self.jsonl.close, self.events.close):
            try:
                close()
            except OSError:
                # What could not be written has stopped the run already, with its line.
                if not self.failed:
                    raise
