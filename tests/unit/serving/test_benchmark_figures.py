"""benchmarks/serving.py's figures that need no server: the CPU time of a process, and the batching target's
ceiling (no server carries more than the null endpoint) computed from a run's figures."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
serving = pytest.importorskip("serving", reason="benchmarks/serving.py needs fastapi")


def test_the_cpu_time_of_a_process_counts_its_threads():
    before = serving.process_cpu_seconds(os.getpid())
    if before is None:
        pytest.skip("no /proc here")

    def spin() -> None:  # 0.3 s of CPU in a thread other than the main one
        spin_until = time.thread_time() + 0.3
        while time.thread_time() < spin_until:
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    # /proc counts whole clock ticks, sampled: a margin of a few ticks (and of float rounding) either way
    assert serving.process_cpu_seconds(os.getpid()) - before >= 0.25
    assert serving.process_cpu_seconds(2**22 + 12345) is None  # no such process


def figures(c1_p50: float, per_s: float | None = None, p95: float = 1.0, cpu: float | None = None) -> dict:
    out = {"c1": {"p50_ms": c1_p50}}
    if per_s is not None:
        out["c16"] = {"throughput_per_s": per_s, "p95_ms": p95}
        if cpu is not None:
            out["c16"]["server_cpu_us_per_request"] = cpu
    return out


def model(batched_per_s: float, batched_p95: float) -> dict:
    platform = {"platform_beyond_run": {"p50_ms": 0.1}}
    return {
        "servers": {
            "null": {
                "binary": figures(0.07, 30_000, cpu=30.0),
                "json": figures(0.08, 29_000, cpu=31.0),
                "tritonclient": figures(0.13),
            },
            "fastapi": {"json": figures(0.4, 3_000)},
            "gpuyard": {
                "binary": {**figures(0.2, 10_000, p95=2.0, cpu=90.0), **platform},
                "json": {**figures(0.37, 3_000, p95=6.0), **platform},
                "tritonclient": {**figures(0.28), **platform},
            },
            "gpuyard_batched": {
                "binary": figures(0.21, batched_per_s, p95=batched_p95, cpu=60.0),
                "json": figures(0.38, 3 * 3_000, p95=1.0),
            },
        }
    }


def test_the_batching_target_gives_the_ceiling_the_null_endpoint_sets():
    targets = serving.targets_of_model("mlp", model(15_000, 1.5), 16)
    binary, json = targets["dynamic_batching_3x_throughput_lower_p95_at_c16"]["checks"]
    assert binary["speedup"] == 1.5 and binary["holds"] is False
    assert binary["null_per_s"] == 30_000 and binary["ceiling_speedup"] == 3.0
    assert (binary["null_server_cpu_us_per_request"], binary["unbatched_server_cpu_us_per_request"]) == (
        30,
        90,
    )
    assert binary["batched_server_cpu_us_per_request"] == 60
    assert json["speedup"] == 3.0 and json["holds"] is True and json["ceiling_speedup"] == pytest.approx(9.67)
    assert "json_server_cpu_us_per_request" not in json
    assert targets["dynamic_batching_3x_throughput_lower_p95_at_c16"]["holds"] is False


def test_the_wide_model_reports_batching_too_marked_as_no_target_of_the_issue():
    targets = serving.targets_of_model("wide", model(30_000, 1.5), 16)
    batching = targets["dynamic_batching_3x_throughput_lower_p95_at_c16"]
    assert batching["holds"] is True and "mlp" in batching["note"]
