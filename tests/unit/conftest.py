"""What every unit test gets, wherever its folder."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _the_umask_as_it_was():
    """A test that runs `gpuyard up` in process (`run_up` makes the platform's files private: umask 0o077) leaves
    the process's umask behind: it is put back after each test, so that a later test whose files another user
    must read (a job's tenant user) does not depend on the order the tests run in."""
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)
