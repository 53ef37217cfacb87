"""Jobs with an environment of their own on the local backend (real processes, uv offline from wheels made
here): the job runs in it, a second job reuses it, a build that fails fails the job once (no retry), and the
node's heartbeat says what it offers and holds."""

from __future__ import annotations

import pytest

from gpuyard.services.executor.environments.pythons import find_pythons
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobCancelRequested
from gpuyard.shared.contracts.events.nodes import EnvironmentRemoveRequested, GpuInfo, NodeHeartbeat
from gpuyard.shared.runtime.paths import log_path
from tests.tinywheels import make_wheel, offline_settings

pytestmark = pytest.mark.skipif(not find_pythons("/usr/local/bin:/usr/bin"), reason="no system python3.N")

PRINT = 'python -c \'import sys, tinypkg; print("value", tinypkg.VALUE, "prefix", sys.prefix)\''


@pytest.fixture(autouse=True)
def wheels(tmp_path, monkeypatch):
    folder = tmp_path / "wheels"
    make_wheel(folder, "tinypkg", body="VALUE = 42\n")
    for name, value in offline_settings(folder).items():
        monkeypatch.setenv(name, value)
    return folder


async def test_a_job_runs_in_its_environment_and_the_next_one_reuses_it(h):
    ex = await h.executor()
    first = await h.submit(command=PRINT, environment={"pip": ["tinypkg"]})
    await h.place(ex, first)
    await h.wait(first, "succeeded")
    text = log_path(h.data_dir, first, 1, 0).read_text()
    root = h.data_dir / "environments"
    [built] = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert f"building environment {built.name}" in text
    assert f"value 42 prefix {built}" in text
    second = await h.submit(
        command=PRINT + "; echo VIRTUAL_ENV=$VIRTUAL_ENV", environment={"pip": ["tinypkg"]}
    )
    await h.place(ex, second)
    await h.wait(second, "succeeded")
    again = log_path(h.data_dir, second, 1, 0).read_text()
    assert f"reusing environment {built.name}" in again and "building environment" not in again
    assert f"VIRTUAL_ENV={built}" in again
    [own] = await ex.backend.nodes(NodeHeartbeat(node="node-a", gpus=[], cpus=1, memory_bytes=1))
    assert own.pythons and own.environments[0].key == built.name and own.environments[0].in_use == 0


async def test_a_job_without_one_keeps_the_platform_s_python(h):
    ex = await h.executor()
    job = await h.submit(command="python -c 'import sys; print(\"prefix\", sys.prefix)'")
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    assert "environments" not in log_path(h.data_dir, job, 1, 0).read_text()


async def test_a_build_that_fails_fails_the_job_with_its_last_lines_and_no_retry(h):
    ex = await h.executor()
    job = await h.submit(command="true", environment={"pip": ["no-such-package"]}, max_retries=3)
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "environment_failed" and view.attempt == 1
    assert "uv pip exited" in view.message and "no-such-package" in view.message
    assert "no-such-package" in log_path(h.data_dir, job, 1, 0).read_text()
    assert "requeued" not in await h.types(job)


async def test_an_image_on_the_local_backend_fails_to_start_saying_so(h):
    ex = await h.executor()
    job = await h.submit(command="true", environment={"image": "python:3.11"})
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and "runs no images" in view.message


def test_the_heartbeat_keeps_its_fields_small():
    hb = NodeHeartbeat(
        node="n", gpus=[GpuInfo(index=0, uuid="u", model="m", memory_bytes=1)], cpus=1, memory_bytes=1
    )
    assert hb.pythons == [] and hb.environments == []


async def test_an_admin_s_removal_is_done_once_and_never_under_a_running_job(h):
    ex = await h.executor()
    job = await h.submit(command="sleep 30", environment={"pip": ["tinypkg"]})
    await h.place(ex, job)
    await h.wait(job, "running")
    [built] = [p for p in (h.data_dir / "environments").iterdir() if not p.name.startswith(".")]

    async def remove(node: str = "node-a") -> None:
        data = EnvironmentRemoveRequested(node=node, key=built.name, by="admin")
        await ex.backend.on_environment_remove(data, make_event(data, source="/test"))

    await remove()
    assert built.exists()  # (in use: kept)
    await h.record(ex, JobCancelRequested(job_id=job, by="ana"))
    await h.wait(job, "cancelled")
    await remove("node-b")  # (another node's: nothing here)
    assert built.exists()
    await remove()
    await remove()  # (again: already gone, nothing to do)
    assert not built.exists() and ex.backend.environments.announced() == []
