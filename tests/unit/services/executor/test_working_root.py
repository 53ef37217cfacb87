"""Where a backend's jobs have folders of their own besides the data dir's (`backends.working_root`), which the
retention deletes with a job's other folders (test_executor_retention.py): the job root of jobs run as other
users on the local backend, the spool folder on Slurm (its `<job id>/attempt-<n>/`: output, exit and working
folders)."""

from __future__ import annotations

from pathlib import Path

from gpuyard.services.executor.backends import working_root
from gpuyard.services.executor.slurm.batch import spool_files
from gpuyard.shared.settings.executor import ExecutorSettings


def test_the_local_backend_s_is_its_job_root_and_slurm_s_its_spool_folder(tmp_path):
    local = ExecutorSettings(data_dir=tmp_path, job_root=tmp_path / "work")
    assert working_root(local) == tmp_path / "work"
    slurm = ExecutorSettings(data_dir=tmp_path, executor_backend="slurm")
    spool = working_root(slurm)
    assert spool == tmp_path / "slurm"
    assert Path(spool_files(str(spool), "j1", 2, 0).output).parent == spool / "j1" / "attempt-2"
    shared = ExecutorSettings(
        data_dir=tmp_path, executor_backend="slurm", slurm={"spool_dir": "/shared/spool"}
    )
    assert working_root(shared) == Path("/shared/spool")
