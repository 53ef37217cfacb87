"""`gpuyard.checkpoint.save` of a large state against the plain way of saving it atomically, in the same run.

    python benchmarks/checkpoint_save.py                                     # a 1 GiB state, 5 runs of each
    python benchmarks/checkpoint_save.py --checkpoint-size 64MB --runs 2     # a quick look

The state is a state dict of one float32 tensor of `--checkpoint-size` bytes of random values (`--bytes`: that
many random bytes instead, which both sides write as they are). `gpuyard` is `checkpoint.save(state, step)` as a
job calls it: GPUYARD_CHECKPOINT_DIR set to a folder under `--dir` (the system's temporary folder by default: give
the disk you mean), as the executor sets it for a job, and no GPUYARD_JOB_ID, so no report is sent to a platform
(inside a job, one small HTTP request after the file is saved). `plain` is `torch.save` (or a write of the bytes)
to a temporary file in a folder beside it, flushed, fsync'ed and renamed to its final name; save does that too,
and also flushes the folder after the rename and lists it to remove older checkpoints (none here).

Runs interleave: gpuyard then plain, then plain then gpuyard, and so on. Each run's file is removed after it (not
timed), and before each run the page cache is written back and dropped where the machine lets us (root;
`--keep-cache`: written back only), so that no run pays for what an earlier one left to write. Prints one JSON
object: each side's seconds and MB/s (the checkpoint file's bytes / 10^6 / seconds), min / median / max, every
run's seconds, and the plain way's median seconds / save's (1.0: as fast)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuyard import checkpoint
from gpuyard.shared.contracts.units import parse_size

# imported as benchmarks.checkpoint_save (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks.storage import drop_caches, summary
else:
    from storage import drop_caches, summary

SIDES = ("gpuyard", "plain")


def make_state(size: int, raw: bool) -> Any:
    """`size` bytes of random values: bytes, or a state dict of one float32 tensor."""
    if raw:
        return os.urandom(size)
    import torch

    return {"model": torch.rand(size // 4, dtype=torch.float32)}


def plain_save(state: Any, final: Path) -> Path:
    """The plain way: written to a temporary file beside `final`, flushed to disk, renamed; `final`."""
    temporary = final.with_name(f".tmp-{final.name}")
    with open(temporary, "xb") as out:
        if isinstance(state, bytes):
            out.write(state)
        else:
            import torch

            torch.save(state, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, final)
    return final


@contextlib.contextmanager
def job_environment(folder: Path) -> Iterator[None]:
    """What a job's process sees of its checkpoint folder (GPUYARD_CHECKPOINT_DIR), and no job id (no report to
    a platform); the environment as it was afterwards."""
    names = (checkpoint.DIR_VARIABLE, "GPUYARD_JOB_ID")
    before = {name: os.environ.get(name) for name in names}
    os.environ[checkpoint.DIR_VARIABLE] = str(folder)
    os.environ.pop("GPUYARD_JOB_ID", None)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def timed(action: Callable[[], Path], drop: bool) -> tuple[float, int, bool]:
    """Seconds `action` took, the bytes of the file it saved (then removed), and whether the page cache was
    dropped before it."""
    if drop:
        dropped = drop_caches()
    else:
        os.sync()
        dropped = False
    start = time.perf_counter()
    saved = action()
    seconds = time.perf_counter() - start
    size = saved.stat().st_size
    saved.unlink()
    return seconds, size, dropped


def side_figures(seconds: list[float], sizes: list[int]) -> dict:
    return {
        "seconds": summary(seconds),
        "mb_per_s": {
            key: round(value, 1)
            for key, value in summary([n / 1e6 / s for s, n in zip(seconds, sizes, strict=True)]).items()
        },
        "file_bytes": max(sizes),
        "all_seconds": [round(s, 3) for s in seconds],
    }


def measure(size: int, runs: int, raw: bool, drop: bool, where: Path) -> dict:
    """Both sides `runs` times each, interleaved, in folders under `where`: one JSON object's figures."""
    state = make_state(size, raw)
    folders = {side: where / side for side in SIDES}
    for path in folders.values():
        path.mkdir()
    suffix = checkpoint.RAW if raw else checkpoint.TORCH
    actions = {
        "gpuyard": lambda step: checkpoint.save(state, step),
        "plain": lambda step: plain_save(state, folders["plain"] / f"step-{step:020d}.{suffix}"),
    }
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    sizes: dict[str, list[int]] = {side: [] for side in SIDES}
    dropped = []
    with job_environment(folders["gpuyard"]):
        for step in range(runs):
            for side in SIDES if step % 2 == 0 else SIDES[::-1]:
                s, n, d = timed(lambda side=side, step=step: actions[side](step), drop)
                seconds[side].append(s)
                sizes[side].append(n)
                dropped.append(d)
    figures = {side: side_figures(seconds[side], sizes[side]) for side in SIDES}
    return {
        "state": "bytes" if raw else "torch state dict (one float32 tensor)",
        "state_bytes": size,
        "runs": runs,
        "folder": str(where),
        "page_cache_dropped": all(dropped),
        **(
            {}
            if all(dropped)
            else {"note": "page cache not dropped (not root, or --keep-cache): written back only"}
        ),
        **figures,
        "plain_over_gpuyard_median_s": round(
            figures["plain"]["seconds"]["median"] / figures["gpuyard"]["seconds"]["median"], 3
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint-size", default="1GiB", help="the state's bytes (default 1GiB)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each side (default 5)")
    parser.add_argument("--bytes", action="store_true", help="save bytes rather than a torch state dict")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where to save them")
    parser.add_argument("--keep-cache", action="store_true", help="do not drop the page cache between runs")
    args = parser.parse_args()
    try:
        size = parse_size(args.checkpoint_size)
    except ValueError as exc:
        parser.error(f"--checkpoint-size: {exc}")
    if size < 4 or args.runs < 1:
        parser.error("--checkpoint-size must be at least 4 bytes and --runs at least 1")
    where = Path(tempfile.mkdtemp(prefix="gpuyard-checkpoint-", dir=args.dir))
    try:
        result = measure(size, args.runs, args.bytes, not args.keep_cache, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
