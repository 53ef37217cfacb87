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
