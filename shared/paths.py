"""Where things live in the data directory; one definition for the services that write and read them."""

from __future__ import annotations

from pathlib import Path


def job_dir(data_dir: Path, job_id: str) -> Path:
    return data_dir / "jobs" / job_id


def attempt_dir(data_dir: Path, job_id: str, attempt: int) -> Path:
    return job_dir(data_dir, job_id) / f"attempt-{attempt}"


def log_path(data_dir: Path, job_id: str, attempt: int, replica: int) -> Path:
    """Combined stdout and stderr of one replica of one attempt."""
    return attempt_dir(data_dir, job_id, attempt) / f"replica-{replica}.log"


def workdir(data_dir: Path, job_id: str, attempt: int, replica: int) -> Path:
    return attempt_dir(data_dir, job_id, attempt) / f"work-{replica}"


def backup_path(path: Path, n: int) -> Path:
    """The n-th rotated file of a log (1 = the most recent one)."""
    return path.with_name(f"{path.name}.{n}")


def log_files(path: Path) -> list[Path]:
    """Every file of a log that exists, oldest first; the live file (`path`) last."""
    backups: list[tuple[int, Path]] = []
    prefix = path.name + "."
    if path.parent.is_dir():
        for entry in path.parent.iterdir():
            suffix = entry.name.removeprefix(prefix)
            if entry.name.startswith(prefix) and suffix.isdigit():
                backups.append((int(suffix), entry))
    files = [p for _, p in sorted(backups, reverse=True)]
    if path.exists():
        files.append(path)
    return files
