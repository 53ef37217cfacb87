"""Node log per tenant: a tenant's running replicas hold at most its log budget together (GPUYARD_TENANT_LOG_BUDGET),
whatever each replica's own cap (a 16-replica gang would otherwise hold 16 × 5 × 64 MiB). Beyond it their output
is truncated with a line that says so, not written (nor shipped); once one of them ends, the others' output
resumes with a line saying how much was dropped. Another tenant is not touched. A disk that refuses a write
(full) never raises: the output is dropped, said once, and the log says how much once it is written again."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from gpuyard.services.executor import logfile
from gpuyard.services.executor.logfile import LogBudget, RotatingLog
from gpuyard.shared.contracts.units import parse_size
from gpuyard.shared.runtime.paths import log_files
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.stores.logs import LogKey, open_log_store
from gpuyard.shared.stores.logs.reading import read_range
from gpuyard.shared.stores.logs.shipper import LogShipper


def line(n: int, width: int = 99) -> bytes:
    return f"{n:05d} ".encode().ljust(width, b"x") + b"\n"  # 100 bytes


def whole(path) -> bytes:
    return b"".join(f.read_bytes() for f in log_files(path))


def test_a_tenants_replicas_are_truncated_together_at_its_budget_and_another_tenant_is_not(tmp_path):
    budget = LogBudget(1000)
    a0 = RotatingLog(tmp_path / "a0.log", 0, 0, budget=budget, tenant="vision")
    a1 = RotatingLog(tmp_path / "a1.log", 0, 0, budget=budget, tenant="vision")
    b0 = RotatingLog(tmp_path / "b0.log", 0, 0, budget=budget, tenant="nlp")
    for n in range(8):
        a0.write(line(n))
        a1.write(line(n))
        b0.write(line(n))
    for name in ("a0.log", "a1.log"):  # 500 + 500: the budget
        text = whole(tmp_path / name).decode().splitlines()
        assert text[:5] == [line(n).decode().rstrip("\n") for n in range(5)] and len(text) == 6
        assert text[5].startswith("[gpuyard] output truncated: the running jobs of tenant 'vision' hold")
        assert "GPUYARD_TENANT_LOG_BUDGET" in text[5]
    assert whole(tmp_path / "b0.log") == b"".join(line(n) for n in range(8))  # 800 bytes: its own budget
    for log in (a0, a1, b0):
        log.close()
    assert budget.held == {}  # every byte given back


def test_a_chunk_over_the_budget_keeps_its_lines_that_fit_and_nothing_after_until_some_is_freed(tmp_path):
    """However the output is read (a pipe read returns what is there: one line or many), the budget is filled
    to the line and then holds: a smaller chunk after a larger one that did not fit is dropped too."""
    budget = LogBudget(1000)
    first = RotatingLog(tmp_path / "first.log", 0, 0, budget=budget, tenant="vision")
    second = RotatingLog(tmp_path / "second.log", 0, 0, budget=budget, tenant="vision")
    first.write(b"".join(line(n) for n in range(6)))
    second.write(b"".join(line(n) for n in range(10)))  # 1,000 bytes, 400 of which fit
    second.write(line(10))  # 100 bytes: they would fit beside the line that says so, but nothing was freed
    text = whole(tmp_path / "second.log").decode().splitlines()
    assert text[:4] == [line(n).decode().rstrip("\n") for n in range(4)] and len(text) == 5
    assert text[4].startswith("[gpuyard] output truncated")
    assert second.truncated and second.over_budget == 700
    first.close()
    second.close()


def test_the_output_resumes_once_another_replica_of_the_tenant_ends(tmp_path):
    budget = LogBudget(1000)
    first = RotatingLog(tmp_path / "first.log", 0, 0, budget=budget, tenant="vision")
    second = RotatingLog(tmp_path / "second.log", 0, 0, budget=budget, tenant="vision")
    first.write(b"".join(line(n) for n in range(6)))
    second.write(line(0) * 4)  # 400 + 600 = 1000: fits
    second.write(line(1))  # dropped, after the line saying so
    second.write(line(2))
    assert second.truncated and second.over_budget == 200
    first.close()  # its replica ended: its 600 bytes are given back
    second.write(line(3))
    second.close()
    text = whole(tmp_path / "second.log").decode().splitlines()
    assert text[-3].startswith("[gpuyard] output truncated") and text[-2] == (
        "[gpuyard] output resumes: 200 B dropped over the log budget of tenant 'vision'"
    )
    assert text[-1] == line(3).decode().rstrip("\n")


def test_a_replica_that_rotates_gives_back_what_its_rotation_deletes(tmp_path):
    budget = LogBudget(1000)
    log = RotatingLog(tmp_path / "r.log", max_bytes=200, backups=1, budget=budget, tenant="vision")
    for n in range(100):  # 10,000 bytes through a log that keeps at most 400
        log.write(line(n))
    assert not log.truncated and budget.held["vision"] == log.held <= 400
    assert whole(tmp_path / "r.log") == b"".join(line(n) for n in range(96, 100))
    log.close()


def test_truncated_output_is_not_shipped_either(tmp_path):
    async def run():
        store = await open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")
        shipper = LogShipper(store, interval=3600)
        key = LogKey("job", 1, 0)
        log = RotatingLog(
            tmp_path / "r.log", 0, 0, shipper=shipper, key=key, budget=LogBudget(300), tenant="vision"
        )
        for n in range(10):
            log.write(line(n))
        log.close()
        await shipper.flush()
        shipped = b"".join([p async for p in read_range(store, key)])
        await store.close()
        return shipped

    import asyncio

    shipped = asyncio.run(run())
    assert shipped == whole(tmp_path / "r.log") and b"output truncated" in shipped and len(shipped) < 1000


def test_a_log_written_before_a_restart_counts_against_the_budget_from_its_adoption(tmp_path):
    (tmp_path / "r.log").write_bytes(line(0) * 9)
    budget = LogBudget(1000)
    log = RotatingLog(tmp_path / "r.log", 0, 0, budget=budget, tenant="vision")
    assert budget.held == {"vision": 900}
    log.write(line(1))
    log.write(line(2))
    assert log.truncated
    log.close()


def test_the_budget_is_a_setting_shared_by_the_nodes_executor_processes(monkeypatch):
    monkeypatch.delenv("GPUYARD_TENANT_LOG_BUDGET", raising=False)
    settings = ExecutorSettings()
    assert settings.tenant_log_budget == parse_size("2GiB")
    assert LogBudget.share(settings.tenant_log_budget, 2).limit == parse_size("1GiB")
    assert LogBudget.share(0, 2).limit == 0 and LogBudget(0).fits("vision", 1 << 40)
    monkeypatch.setenv("GPUYARD_TENANT_LOG_BUDGET", "512MiB")
    assert ExecutorSettings().tenant_log_budget == 512 << 20
    with pytest.raises(ValueError):
        LogBudget(-1)


def test_a_full_disk_drops_the_output_says_so_once_and_the_log_says_how_much_later(
    tmp_path, monkeypatch, caplog
):
    full = [True]

    def disk(fd: int, data) -> int:
        if full[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    monkeypatch.setattr(logfile, "_write", disk)
    monkeypatch.setattr(logfile._DiskTrouble, "failing", False)
    caplog.set_level(logging.WARNING, logger=logfile.__name__)
    log = RotatingLog(tmp_path / "r.log", 0, 0)
    other = RotatingLog(tmp_path / "other.log", 0, 0)
    for n in range(3):
        log.write(line(n))  # never raises
        other.write(line(n))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "no space left on its disk" in said[0]
    full[0] = False
    log.write(line(3))
    log.close()
    other.close()
    assert whole(tmp_path / "r.log").decode().splitlines() == [
        "[gpuyard] 300 B of output lost here: the disk refused it",
        line(3).decode().rstrip("\n"),
    ]
    assert [r.getMessage() for r in caplog.records][1:] == ["the output of jobs is written again"]
