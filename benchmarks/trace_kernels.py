"""GPU kernel time of a profiler trace, by kind: where a step's device time goes.

Reads the `.xplane.pb` that `benchmarks.step_profile --trace DIR` writes (under
DIR/<part>/plugins/profile/<run>/) with xprof's converter (`pip install xprof`; it is not a
dependency of bertjax) and prints the device time per call in matrix multiplies, scatters,
reductions and other fusions, then the costliest kernels.

    python -m benchmarks.trace_kernels step.xplane.pb --calls 2
"""

from __future__ import annotations

import argparse
import collections
import json

from bertjax import cli


def kind(kernel: str) -> str:
    name = kernel.lower()
    if any(k in name for k in ("nvjet", "gemm", "cutlass", "cublas", "sm90_xmma")):
        return "matmul"
    if "scatter" in name:
        return "scatter"
    if "reduce" in name:
        return "reduction fusion"
    return "other fusion"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_verbose_argument(p)
    p.add_argument("xplane", help="an .xplane.pb file")
    p.add_argument("--calls", type=int, default=2, help="calls the trace holds (step_profile --trace-calls)")
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args(argv)
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([a.xplane], "kernel_stats", {})
    table = json.loads(data)
    columns = [c["id"] for c in table["cols"]]
    rows = [dict(zip(columns, [(cell or {}).get("v") for cell in row["c"]], strict=True)) for row in table["rows"]]
    total = sum(r["total_duration_us"] for r in rows) / a.calls
    print(f"device kernel time per call: {total / 1000:.1f} ms in {len(rows)} distinct kernels")
    by_kind = collections.Counter()
    for r in rows:
        by_kind[kind(r["kernel_name"])] += r["total_duration_us"] / a.calls
    for name, us in by_kind.most_common():
        print(f"  {name:18s} {us / 1000:6.1f} ms  {us / total:5.1%}")
    print("costliest kernels (ms per call, launches per call):")
    for r in sorted(rows, key=lambda r: -r["total_duration_us"])[: a.top]:
        print(
            f"  {r['total_duration_us'] / a.calls / 1000:6.2f}  x{r['occurrences'] / a.calls:<4.0f} {r['kernel_name'][:80]}"
        )


if __name__ == "__main__":
    cli.run(main)
