"""`gpuyard up` started from a folder that holds packages named like the platform's folders (`services/submit/`,
`shared/`, even `gpuyard/`: a training repository's own) runs the platform's own services: each starts as
`python -P -m gpuyard.services.NAME`, which does not search the working directory."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Platform

pytestmark = pytest.mark.integration

ROGUE = "import pathlib, sys; pathlib.Path(__file__).with_name('ran').write_text('rogue'); sys.exit(3)\n"


def test_up_in_a_folder_with_its_own_services_and_shared_runs_the_platforms_own(tmp_path):
    repo = tmp_path / "repo"
    for package in (
        "services",
        "services/submit",
        "services/scheduler",
        "shared",
        "gpuyard",
        "gpuyard/services",
    ):
        (repo / package).mkdir(parents=True)
        (repo / package / "__init__.py").write_text(ROGUE)
    for service in ("submit", "scheduler"):
        (repo / "services" / service / "__main__.py").write_text(ROGUE)
    (repo / "gpuyard" / "services" / "submit.py").write_text(ROGUE)
    platform = Platform(tmp_path / "data", tmp_path / "config", simulate_gpus=1, executors=1, cwd=repo)
    platform.start()  # (ready: the API answers and the node has registered its GPU)
    try:
        client = platform.client()
        job = client.submit({"command": ["true"], "name": "from-the-repo"}).job_id
        assert platform.wait_state(job, {"succeeded", "failed"}, 60).state == "succeeded"
        running = {s.service for s in client.services() if s.state == "running"}
        assert {"submit", "scheduler", "executor"} <= running, running
    finally:
        platform.stop()
    assert not list(repo.rglob("ran")), "a service of the folder's ran in the platform's place"
