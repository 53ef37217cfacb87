"""`gpuyard up --demo`: once the platform is up, a small job submitted and followed to its end."""

from __future__ import annotations

import asyncio

from rich.console import Console

from gpuyard.client import Client

DEMO_SPEC = {
    "name": "demo-hello",
    "command": 'echo "hello from replica $RANK of $WORLD_SIZE on GPU(s) $CUDA_VISIBLE_DEVICES"; sleep 1; echo done',
    "resources": {"gpus": 1, "cpus": 0.5, "memory": "256MB"},
    "replicas": 2,
}


async def run_demo(client: Client, console: Console, server_url: str) -> None:
    """Submit a small 2-replica job and follow it to the end, its events and its output."""
    from gpuyard.follow import follow_job

    try:
        accepted = await asyncio.to_thread(client.submit, DEMO_SPEC)
        console.print(f"[bold]demo[/] submitted job {accepted.job_id} ({accepted.name})")
        final = await asyncio.to_thread(follow_job, client, accepted.job_id, console, logs=True)
        console.print(
            f"[bold]demo[/] job {final}. GPUYARD is still running (API {server_url}): submit more from another "
            "terminal; Ctrl-C here stops it.",
            highlight=False,
        )
    except Exception as exc:  # the demo must never take the platform down
        console.print(f"[bold red]demo failed:[/] {exc}")
