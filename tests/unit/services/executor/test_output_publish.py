"""`OutputPublisher`: the line a job's log gets once its outputs were copied to the output store, or why not (a
copy that fails never fails the job, and leaves the folder on the node)."""

from __future__ import annotations

from pathlib import Path

from gpuyard.services.executor.outputpublish import OutputPublisher
from gpuyard.shared.runtime.paths import job_storage

JOB = "0123456789abcdef"


class Store:
    """An output store that copies `answer` files, or raises `error`."""

    def __init__(self, answer: tuple[int, int] = (0, 0), error: Exception | None = None):
        self.answer, self.error = answer, error
        self.folders: list[str] = []

    def publish(self, tenant, job_id, folder):
        self.folders.append(str(folder.top))
        if self.error is not None:
            raise self.error
        return self.answer


def outputs(root: Path) -> Path:
    top = Path(job_storage(root, "vision", JOB).outputs)
    top.mkdir(parents=True)
    (top / "model.bin").write_bytes(b"w" * 2048)
    return top


async def test_what_was_copied_is_said_and_the_jobs_own_folder_is_read(tmp_path):
    store = Store(answer=(3, 2048))
    line = await OutputPublisher(store, tmp_path, lambda tenant: None).publish("vision", JOB)
    assert line == "outputs: copied 3 file(s), 2 KiB, to the output store"
    assert store.folders == [str(job_storage(tmp_path, "vision", JOB).outputs)]
    nothing = await OutputPublisher(Store(), tmp_path, lambda tenant: None).publish("vision", JOB)
    assert nothing == "outputs: nothing new to copy to the output store"


async def test_a_copy_that_fails_is_said_and_leaves_the_folder(tmp_path):
    top = outputs(tmp_path)
    store = Store(error=OSError("the store is unreachable"))
    line = await OutputPublisher(store, tmp_path, lambda tenant: None).publish("vision", JOB)
    assert line == "outputs: not copied to the output store (the store is unreachable); kept on this node"
    assert (top / "model.bin").read_bytes() == b"w" * 2048
