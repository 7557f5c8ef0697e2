"""Throughput, MFU and the metric writers (JSONL and TensorBoard), process 0 only."""

from __future__ import annotations

import json
import time
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
    and their use), the convention in DESIGN.md."""
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


class MetricsWriter:
    """Appends one JSON object per logged step to `metrics.jsonl` and mirrors it to TensorBoard."""

    def __init__(self, workdir: Path, enabled: bool):
        self.enabled = enabled
        if not enabled:
            return
        from tensorboardX import SummaryWriter

        self.jsonl = runinfo.open_append(Path(workdir) / "metrics.jsonl")
        self.tensorboard = SummaryWriter(str(Path(workdir) / "tensorboard"))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self.jsonl.flush()
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                self.tensorboard.add_scalar(name, value, step)

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            self.tensorboard.close()
