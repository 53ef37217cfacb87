"""The batch jobs' output, as the backend serves it: each replica's output file in the spool folder (where
`sbatch --output` has Slurm write it, on the compute node) copied into the replica's log file in the data
directory, which the log store and `gpuyard logs -f` read as they read the local backend's (size-capped,
rotated, within the tenant's log budget)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuyard.services.executor.exits import AttemptKey, ReplicaKey
from gpuyard.services.executor.logfile import LogBudget, RotatingLog
from gpuyard.services.executor.slurm.batch import spool_files
from gpuyard.shared.runtime.paths import log_path
from gpuyard.shared.stores.logs import NOTE, LogKey
from gpuyard.shared.stores.logs.shipper import LogShipper

TAIL_BYTES = 16384


@dataclass
class _Mirror:
    sink: RotatingLog
    source: str
    offset: int = 0


class SpoolLogs:
    def __init__(
        self,
        spool: str,
        data_dir: Path,
        *,
        max_bytes: int,
        backups: int,
        shipper: LogShipper | None,
        budget: LogBudget | None,
    ):
        self.spool = spool
        self.data_dir = data_dir
        self.max_bytes = max_bytes
        self.backups = backups
        self.shipper = shipper
        self.budget = budget
        self.mirrors: dict[ReplicaKey, _Mirror] = {}

    def _mirror(self, key: AttemptKey, replica: int, tenant: str) -> _Mirror:
        ident = (*key, replica)
        mirror = self.mirrors.get(ident)
        if mirror is None:
            sink = RotatingLog(
                log_path(self.data_dir, key[0], key[1], replica),
                self.max_bytes,
                self.backups,
                shipper=self.shipper,
                key=LogKey(*key, replica),
                budget=self.budget if tenant else None,
                tenant=tenant,
            )
            mirror = self.mirrors[ident] = _Mirror(sink, spool_files(self.spool, *key, replica).output)
        return mirror

    def copy(
        self, key: AttemptKey, replica: int, tenant: str, *, final: bool = False, note: str | None = None
    ) -> None:
        """Append what the batch job wrote since the last copy to the replica's log file: whole lines while it
        runs, everything at its end (`final`, which closes the log file), then `note` (the platform's word, such
        as its outputs' copy) as a line of its own."""
        mirror = self._mirror(key, replica, tenant)
        try:
            with open(mirror.source, "rb") as source:
                source.seek(mirror.offset)
                data = source.read()
        except OSError:
            data = b""
        if not final:
            data = data[: data.rfind(b"\n") + 1]
        if data:
            mirror.sink.write(data)
            mirror.offset += len(data)
        if note:
            mirror.sink.write(f"\n{NOTE}{note}\n".encode())
        if final:
            mirror.sink.close()
            self.mirrors.pop((*key, replica), None)

    def tail(self, key: AttemptKey, replica: int, lines: int = 20) -> list[str]:
        """The last lines of the replica's output (for the cause of a failure)."""
        try:
            with open(spool_files(self.spool, *key, replica).output, "rb") as file:
                file.seek(max(0, os.fstat(file.fileno()).st_size - TAIL_BYTES))
                text = file.read().decode(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]

    def forget(self, key: AttemptKey) -> None:
        """The attempt is over: its log files are closed, its output and exit files in the spool removed."""
        for ident in [i for i in self.mirrors if i[:2] == key]:
            self.mirrors.pop(ident).sink.close()
        folder = os.path.dirname(spool_files(self.spool, *key, 0).output)
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            if name.startswith("replica-"):
                try:
                    os.unlink(os.path.join(folder, name))
                except OSError:
                    continue

    def close(self) -> None:
        for mirror in self.mirrors.values():
            mirror.sink.close()
        self.mirrors.clear()
