"""The cost of SQLite's synchronous=FULL against NORMAL in the event store (WAL): new jobs appended through the
ledger, one at a time and 16 at once (group commit), on a fresh store in a temporary directory.

    python benchmarks/store_sync.py     # a line per run on stderr, then the JSON of the last run of each on stdout

FULL flushes the WAL to disk on every commit (a job answered 202 survives a power loss); NORMAL only at
checkpoints (it survives a crash of the process, not of the machine).
"""

import asyncio
import json
import sys
import tempfile
import time

from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger


async def run(mode, n=400, conc=1):
    d = tempfile.mkdtemp()
    store = await open_store(f"sqlite:///{d}/events.db")
    for c in (store._conn, store._read_conn):  # (the store sets FULL; NORMAL for comparison)
        c.execute(f"PRAGMA synchronous={mode}")
    ledger = JobLedger(store, None, "/b")
    spec = JobSpec(command="true")
    lat = []

    async def one(i):
        t = time.perf_counter()
        await ledger.append(
            f"j{i}", JobSubmitted(job_id=f"j{i}", name="n", tenant="t", user="u", spec=spec), new=True
        )
        lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    for k in range(0, n, conc):
        await asyncio.gather(*(one(i) for i in range(k, min(n, k + conc))))
    el = time.perf_counter() - t0
    await store.close()
    lat.sort()
    figures = {
        "appends_per_s": round(n / el),
        "p50_ms": round(lat[len(lat) // 2] * 1e3, 2),
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 2),
    }
    print(f"{mode:6} conc={conc:2}: {figures}", file=sys.stderr)
    return figures


if __name__ == "__main__":
    result = {}
    for conc in (1, 16):
        for mode in ("NORMAL", "FULL", "NORMAL", "FULL"):  # each twice, in turn; the second of each is kept
            result[f"{mode.lower()}_{conc}"] = asyncio.run(run(mode, 400, conc))
    print(json.dumps(result, indent=2))
