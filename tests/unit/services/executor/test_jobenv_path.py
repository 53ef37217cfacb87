"""A job of the local backend finds the platform's own interpreter and console scripts first on its PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpuyard.services.executor.jobenv import platform_path

SCRIPTS = str(Path(sys.executable).parent)


def test_the_platforms_scripts_come_first_and_the_rest_of_the_path_is_kept_once():
    env = platform_path(f"/usr/local/bin:{SCRIPTS}:/usr/bin")
    assert env["PATH"].split(os.pathsep) == [SCRIPTS, "/usr/local/bin", "/usr/bin"]
    assert (Path(env["PATH"].split(os.pathsep)[0]) / "python").exists()
    if sys.prefix != sys.base_prefix:  # the tests run in the project's venv
        assert env["VIRTUAL_ENV"] == sys.prefix


def test_without_a_path_the_systems_default_follows():
    assert platform_path(None)["PATH"].split(os.pathsep)[1:] == [p for p in os.defpath.split(os.pathsep) if p]
