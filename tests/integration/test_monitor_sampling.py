"""The monitor in `gpuyard up --simulate-gpus 2`: a busy job and a sleeping job, each on a GPU of its own;
their GPUs' `gpu.sample` readings on the bus and their DCGM series on /metrics follow them (the busy one's GPU
busy, the sleeping one's idle), labelled with the job and its tenant."""

from __future__ import annotations

import asyncio
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.nodes import GpuSample

pytestmark = pytest.mark.integration

BUSY = [sys.executable, "-c", "while True: pass"]
BUSY_PCT, IDLE_PCT = 10.0, 2.0  # a busy loop reads about 100 % on a quiet machine; less on a loaded one


async def until(check, within: float, what: str):
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.2)


def util_by_job(reading_or_family) -> dict[str, float]:
    return {s.labels["job"]: s.value for s in reading_or_family.samples if s.labels["job"]}


async def test_gpu_samples_and_metrics_follow_a_busy_and_a_sleeping_job(platform):
    client = platform.client()
    bus = await platform.bus("integrator")  # a reader of every event
    samples: list[GpuSample] = []

    async def received(msg) -> None:
        samples.append(CloudEvent.from_json(msg.data).data)

    sub = await bus.subscribe("gpu.sample", received)
    busy = client.submit({"name": "busy", "command": BUSY, "resources": {"gpus": 1}}).job_id
    idle = client.submit({"name": "idle", "command": "sleep 600", "resources": {"gpus": 1}}).job_id
    try:
        await asyncio.to_thread(platform.wait_state, busy, {"running"})
        await asyncio.to_thread(platform.wait_state, idle, {"running"})
        tenant = client.job(busy).tenant

        async def on_the_bus():
            for sample in reversed(samples):
                held = {h.job_id: g for g in sample.gpus for h in g.holders}
                if (
                    sample.node == "node-a"
                    and {busy, idle} <= set(held)
                    and held[busy].utilization_pct >= BUSY_PCT
                    and held[idle].utilization_pct <= IDLE_PCT
                ):
                    return sample, held
            return None

        sample, held = await until(
            on_the_bus, 60, "a gpu.sample with the busy GPU busy and the idle one idle"
        )
        assert sample.simulated and sample.interval_seconds == 1.0 and len(sample.gpus) == 2
        assert held[busy].index != held[idle].index
        assert [(h.tenant, h.user) for h in held[busy].holders] == [(tenant, "admin")]
        assert held[idle].memory_used_bytes == held[idle].memory_total_bytes  # a whole GPU: all its memory

        async def on_metrics():
            url = f"http://127.0.0.1:{platform.monitor_port}/metrics"
            token = (platform.data_dir / METRICS_TOKEN_FILE).read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            answer = await asyncio.to_thread(httpx.get, url, headers=headers, timeout=10)
            families = {f.name: f for f in text_string_to_metric_families(answer.text)}
            util = families.get("DCGM_FI_DEV_GPU_UTIL")
            if util is None:
                return None
            by_job = util_by_job(util)
            if by_job.get(busy, 0) >= BUSY_PCT and by_job.get(idle, 100) <= IDLE_PCT:
                return families
            return None

        families = await until(on_metrics, 60, "/metrics with the busy GPU busy and the idle one idle")
        [series] = [s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples if s.labels["job"] == busy]
        assert series.labels["tenant"] == tenant and series.labels["user"] == "admin"
        assert series.labels["hostname"] == "node-a" and series.labels["UUID"].startswith("SIM-node-a-")
        assert series.labels["modelName"] and series.labels["device"] == f"nvidia{series.labels['gpu']}"
        for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"):
            assert {busy, idle} <= set(util_by_job(families[name])), name
        jobs = {(s.labels["state"], s.labels["tenant"]): s.value for s in families["gpuyard_jobs"].samples}
        assert jobs.get(("running", tenant), 0) >= 2
    finally:
        await sub.unsubscribe()
        await bus.close()
        for job in (busy, idle):
            client.cancel(job)
    for job in (busy, idle):
        await asyncio.to_thread(platform.wait_state, job, {"cancelled"})
