"""A job's start with a volume mounted against with none, on a platform of its own: a volume's bytes are never
copied, so its size must not show in a start.

    python benchmarks/volume_start.py                                # a 10 GB volume, 50 jobs of each kind
    python benchmarks/volume_start.py --volume-size 50MB --jobs 5    # a quick look

Starts `gpuyard up --simulate-gpus 1` on free ports (removed afterwards), makes a volume of `--volume-size` and
fills it through the API, as `gpuyard volumes upload` sends a file, with that many bytes of random data in files
of at most 1 GiB (real data: every block written, no hole; the JSON says what the volume's files take on disk),
then drops the page cache where the machine lets us (root), so that a copy, were there one, would read the disk.
It then submits jobs one at a time, each after the previous one ended, alternating a job that mounts the volume
read-only with a job that mounts nothing (with, without, with...), after `--warmup` pairs that are not counted.
Each job is as short as `true`: one with the volume runs `test -s data/part-00000.bin` (its first file is there
and not empty: a job that cannot see it fails, and the benchmark with it), one without runs `test -d .`.

From each job's events, followed on NATS as pipeline.py does (their own timestamps, one host's clock):
placed→running (the executor's part, where a copy would show) and submit→running, in milliseconds, min / median /
max per kind, and the median with the volume minus the median without. The first counted `job.started` with the
volume gives its `notes` and `isolation`, and says how the volume was mounted: bound read-only in a mount
namespace of the replica's own (which a job without a volume may not get: the difference then includes making
it), or a link. Prints one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from gpuyard import transfers
from gpuyard.client import Client
from gpuyard.services.executor.volumemounts import READ_ONLY_NOT_ENFORCED
from gpuyard.shared.bus.credentials import credentials_path
from gpuyard.shared.contracts.units import parse_size
from gpuyard.shared.runtime.service import event_loop_factory

# imported as benchmarks.volume_start (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks.pairs import one_at_a_time, paired_figures
    from benchmarks.pipeline import NOOP, Tap, job_root_of, start_platform, stop_platform
    from benchmarks.storage import drop_caches
else:
    from pairs import one_at_a_time, paired_figures
    from pipeline import NOOP, Tap, job_root_of, start_platform, stop_platform
    from storage import drop_caches

VOLUME = "bench"
MOUNT = "data"
PART = 1 << 30
"""The largest file the volume is filled with."""
BLOCK = 1 << 20
WITH, WITHOUT = "with_volume", "without"
SPECS = {
    WITH: {
        **NOOP,
        "command": ["test", "-s", f"{MOUNT}/part-00000.bin"],
        "volumes": [{"name": VOLUME, "path": MOUNT, "read_only": True}],
    },
    WITHOUT: {**NOOP, "command": ["test", "-d", "."]},
}


def parts(total: int) -> list[int]:
    """The sizes of the files that hold `total` bytes: PART each, the last one what is left."""
    return [min(PART, total - start) for start in range(0, total, PART)] or [0]


def random_chunks(size: int) -> Iterator[bytes]:
    """`size` bytes of random data, a block at a time."""
    for start in range(0, size, BLOCK):
        yield os.urandom(min(BLOCK, size - start))


def fill(client: Client, size: int) -> dict:
    """The volume made and filled with `size` bytes: how long the uploads took."""
    client.request("POST", "/v1/volumes", json={"name": VOLUME, "size": size + BLOCK})
    url = f"/v1/volumes/{VOLUME}/content"
    start = time.perf_counter()
    for i, part in enumerate(parts(size)):
        name = f"part-{i:05d}.bin"
        transfers.upload(client, url, {"path": name}, random_chunks(part), "application/octet-stream")
    seconds = time.perf_counter() - start
    return {"fill_s": round(seconds, 3), "fill_mb_per_s": round(size / seconds / 1e6, 1)}


def allocated_bytes(tmp: Path) -> int | None:
    """What the volume's files take on disk (their blocks), wherever the platform's storage root put it."""
    for top in (tmp, job_root_of(tmp)):
        for folder in top.glob(f"**/volumes/*/{VOLUME}"):
            return sum(
                os.lstat(os.path.join(root, name)).st_blocks * 512
                for root, _, names in os.walk(folder)
                for name in names
            )
    return None


class StartTap(Tap):
    """The jobs' event times (Tap), and the data of their `job.started` and `job.failed` events."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, dict[str, dict]] = {}

    async def on_msg(self, msg) -> None:
        await super().on_msg(msg)
        event = json.loads(msg.data)
        kind = event["type"].rsplit(".", 1)[-1]
        if kind in ("started", "failed"):
            self.data.setdefault(event["subject"], {})[kind] = event.get("data") or {}


def interleaved(pairs: int) -> list[str]:
    """The kinds of `pairs` pairs of jobs in the order they are submitted: with, without, with..."""
    return [WITH, WITHOUT] * pairs


def first_of(tap: StartTap, jobs: list[tuple[str, str]], kind: str, event: str) -> dict | None:
    """The data of the first `event` (started, failed) of a job of `kind`."""
    return next((tap.data[j][event] for k, j in jobs if k == kind and event in tap.data.get(j, {})), None)


def mounted_as(notes: list[str]) -> str:
    """How the executor gave the job its volume, from its `job.started` notes (volumemounts.py)."""
    unenforced = READ_ONLY_NOT_ENFORCED.split("{", 1)[0]
    if any(note.startswith(unenforced) for note in notes):
        return "a link (no mount namespace: read-only not enforced)"
    return "bound read-only in a mount namespace of the replica's own"


def measure(args: argparse.Namespace, client: Client, tmp: Path, nats_url: str) -> dict:
    size = parse_size(args.volume_size)
    result = {"volume_bytes": size, "jobs_per_kind": args.jobs, "warmup_pairs": args.warmup}
    result.update(fill(client, size))
    result["volume_used_bytes"] = client.request("GET", f"/v1/volumes/{VOLUME}")["used_bytes"]
    result["volume_allocated_bytes"] = allocated_bytes(tmp)
    result["page_cache_dropped"] = drop_caches()
    order = interleaved(args.warmup) + interleaved(args.jobs)
    credentials = credentials_path(tmp / "data", "integrator")
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        specs = [(kind, SPECS[kind]) for kind in order]
        done, tap = runner.run(one_at_a_time(client, nats_url, credentials, specs, StartTap()))
    counted = done[2 * args.warmup :]
    result.update(paired_figures(tap.times, counted, (WITH, WITHOUT)))
    started = first_of(tap, counted, WITH, "started") or {}
    result["with_volume_mounted_as"] = mounted_as(started.get("notes") or []) if started else None
    result["with_volume_started_notes"] = started.get("notes")
    result["with_volume_started_isolation"] = started.get("isolation")
    failures = {kind: first_of(tap, counted, kind, "failed") for kind in (WITH, WITHOUT)}
    result["first_failure"] = {kind: data for kind, data in failures.items() if data} or None
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--volume-size", default="10GB", help="what the volume holds (default 10GB)")
    parser.add_argument("--jobs", type=int, default=50, help="jobs of each kind (default 50)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="pairs of jobs run first, not counted (default 1)"
    )
    args = parser.parse_args()
    try:
        parse_size(args.volume_size)
    except ValueError as exc:
        parser.error(f"--volume-size: {exc}")
    if args.jobs < 1 or args.warmup < 0:
        parser.error("--jobs must be at least 1 and --warmup at least 0")
    proc, client, tmp, nats_url = start_platform(1, None)
    try:
        result = measure(args, client, tmp, nats_url)
    finally:
        stop_platform(proc, tmp)
    print(json.dumps(result, indent=2))
    return 1 if result["first_failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
