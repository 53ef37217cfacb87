"""Fit y = a·x + b to the points of a volume, checkpointing as it goes, and keep the result.

The job (examples/storage/job.yaml) mounts the volume `points` read-only at `data/`, where this script and its
CSV files were uploaded: they are read where they are, never copied. Every 100 steps it saves its state with `gpuyard.checkpoint` (a preempted attempt's
next one resumes from there), and at the end it writes `model.json` to GPUYARD_OUTPUT_DIR, which the platform
keeps after the job ends (`gpuyard artifacts JOB`). See docs/volumes.md and docs/storage.md."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

from gpuyard import checkpoint

STEPS, EVERY, RATE = 600, 100, 0.02


def points(folder: Path) -> list[tuple[float, float]]:
    rows = []
    for part in sorted(folder.glob("**/*.csv")):
        with open(part, newline="") as f:
            rows += [(float(r["x"]), float(r["y"])) for r in csv.DictReader(f)]
    return rows


def main() -> int:
    data = points(Path(sys.argv[1] if len(sys.argv) > 1 else "data"))
    if not data:
        print("no points found: is the volume mounted at data/?", file=sys.stderr)
        return 1
    found = checkpoint.load_latest()
    start, (a, b) = (found[0] + 1, json.loads(found[1])) if found else (0, (0.0, 0.0))
    print(f"{len(data)} points; starting at step {start}", flush=True)
    for step in range(start, STEPS):
        da = sum((a * x + b - y) * x for x, y in data) * 2 / len(data)
        db = sum(a * x + b - y for x, y in data) * 2 / len(data)
        a, b = a - RATE * da, b - RATE * db
        if (step + 1) % EVERY == 0:
            checkpoint.save(json.dumps([a, b]).encode(), step)
    out = Path(os.environ.get("GPUYARD_OUTPUT_DIR", "."))
    (out / "model.json").write_text(
        json.dumps({"a": round(a, 3), "b": round(b, 3), "points": len(data)}) + "\n"
    )
    print(f"fitted y = {a:.3f}·x {'-' if b < 0 else '+'} {abs(b):.3f}; kept model.json", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
