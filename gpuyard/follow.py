"""Following a job's events until it ends (used by `submit --follow` and the demo)."""

from __future__ import annotations

import time

from rich.console import Console

from gpuyard.client import Client

TERMINAL = {"succeeded", "failed", "cancelled"}


def describe_event(event: dict) -> str:
    kind = event["type"].removeprefix("io.gpuyard.job.")
    data = event["data"]
    if kind == "placed":
        where = ", ".join(
            f"r{p['replica']}→{p['node']}"
            + (f"[{','.join(str(g['index']) for g in p['gpus'])}]" if p["gpus"] else "")
            for p in data["placements"]
        )
        return f"placed (attempt {data['attempt']}): {where}"
    if kind == "pending":
        return f"waiting: {data['reason']['message']}"
    if kind == "replica_exited":
        how = (
            f"exit {data['exit_code']}"
            if data.get("exit_code") is not None
            else f"signal {data.get('signal')}"
        )
        return (
            f"replica {data['replica']} exited ({how}){': ' + data['message'] if data.get('message') else ''}"
        )
    if kind == "failed":
        return f"failed: {data['message']}"
    if kind == "preempted":
        by = f" by job {data['by_job']}" if data.get("by_job") else ""
        return f"preempted ({data['reason']}){by}: stopping within {data.get('grace_seconds', 0):g}s"
    if kind == "started":
        return f"started on {data['node']} (replicas {', '.join(map(str, data['replicas']))})"
    if kind == "requeued":
        return f"requeued as attempt {data['attempt']} ({data['reason']}): {data.get('message', '')}"
    return kind


def follow_job(client: Client, job_id: str, console: Console, poll: float = 0.3, quiet: bool = False) -> str:
    """Print each new event of the job until it reaches a final state; returns that state."""
    after = 0
    while True:
        for item in client.events(job_id, after=after):
            after = item["version"]
            if not quiet:
                console.print(
                    f"  {item['event']['time'][11:23]}  {describe_event(item['event'])}", highlight=False
                )
        state = client.job(job_id)["state"]
        if state in TERMINAL:
            return state
        time.sleep(poll)
