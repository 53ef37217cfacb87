"""The start helper is built from its source once per folder and version, and its absence (no compiler, a
failed build) is said and leaves the reaper forking (start_helper.py)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.services.executor import start_helper as module
from gpuyard.services.executor.start_helper import helper_name, start_helper

needs_cc = pytest.mark.skipif(
    module.compiler() is None, reason="no C compiler to build the start helper with"
)


@needs_cc
def test_it_is_built_once_in_a_private_folder_under_its_sources_hash(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir(0o700)
    (folder / "gpuyard-replica-start-0123456789abcdef.so").write_text("an earlier version's")
    helper = start_helper(folder)
    assert helper == str(folder / helper_name(module.SOURCE.read_bytes()))
    assert stat.S_IMODE(os.stat(helper).st_mode) == 0o700 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert os.listdir(folder) == [os.path.basename(helper)]  # (no temporary file, no earlier version left)

    def no_build(*_args, **_kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(subprocess, "run", no_build)
    assert start_helper(folder) == helper


def test_without_a_compiler_there_is_no_helper_and_it_is_said(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # (no cc, no gcc)
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        assert start_helper(tmp_path / "bin") is None
    assert "no C compiler" in caplog.text


def test_a_failed_build_is_said_with_the_compilers_words(tmp_path, monkeypatch, caplog):
    cc = tmp_path / "cc"
    cc.write_text('#!/bin/sh\necho "fatal: out of luck" >&2\nexit 1\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        assert start_helper(tmp_path / "bin") is None
    assert "out of luck" in caplog.text and os.listdir(tmp_path / "bin") == []


@needs_cc
def test_the_images_stage_builds_it_with_this_file_alone(tmp_path):
    """The Dockerfile's stage copies the source and this module, nothing else, and runs the module."""
    for name in ("replica_start.c", "start_helper.py"):
        shutil.copy(module.SOURCE.with_name(name), tmp_path / name)
    built = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "start_helper.py"), str(tmp_path / "bin")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert built.stdout == str(tmp_path / "bin" / helper_name(module.SOURCE.read_bytes()))
    dockerfile = (Path(module.__file__).parents[2] / "Dockerfile").read_text()
    assert "python /build/start_helper.py /build/bin" in dockerfile
    installed = (
        "/usr/local/lib/python3.11/site-packages/gpuyard/"  # (services/ installs as gpuyard/services/)
    )
    assert f"{installed}{module.PREBUILT.relative_to(Path(module.__file__).parents[2])}/" in dockerfile


@needs_cc
def test_a_helper_built_beforehand_beside_the_module_comes_first(tmp_path, monkeypatch):
    prebuilt = tmp_path / "prebuilt"
    helper = start_helper(prebuilt)
    monkeypatch.setattr(module, "PREBUILT", prebuilt)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # (no compiler now)
    assert start_helper(tmp_path / "data-bin") == helper
