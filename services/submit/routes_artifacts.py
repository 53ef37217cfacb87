"""/v1/jobs/{job_id}/artifacts: what a job kept, the files it wrote to its output folder (GPUYARD_OUTPUT_DIR,
`<storage root>/outputs/<tenant>/<job id>/`; docs/storage.md), listed and downloaded.

The job is named as the other job routes name it (its id, or a unique prefix of it): another tenant's job is
answered as one that does not exist (404), an admin sees every tenant's. A job that kept nothing (no output
folder: not started yet, or a backend that makes none) has an empty listing. Paths are given as `?path=`,
relative to the folder's top, and read through `SafeFolder`, as the job's own files: one that would leave the
folder (`..`, an absolute path, a NUL, a link on the way) is 400; a link, or a file that is not the job's user's,
is never read. Where an object store keeps outputs (`GPUYARD_OUTPUT_STORE`), they are read from there
(`OutputStore`): what the job's attempts had written when each ended."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status
from fastapi.responses import StreamingResponse

from gpuyard.services.submit.auth import Context, CurrentPrincipal
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.downloads import attachment, file_or_tree
from gpuyard.services.submit.errors import Responses, answers
from gpuyard.services.submit.jobs import visible_job
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.api.common import ErrorOut
from gpuyard.shared.contracts.api.files import FileListOut, FileOut
from gpuyard.shared.runtime.safefolder import NotThere, ReadableFolder
from gpuyard.shared.runtime.tarstream import END, PathRefused, clean_path

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=answers(400, 401, 413, 503))

EXAMPLE_JOB = "3f2a9c1e5b7d4a60"
JobPath = Annotated[
    str,
    Path(
        description="The job's id, or a unique prefix of it (4 characters or more).", examples=[EXAMPLE_JOB]
    ),
]
_STEP = r"(?:\.?[^/\x00.][^/\x00]*|\.\.[^/\x00]+|\.)"
"""One name of a path: anything but '/', a NUL, or '..'."""
PATH_PATTERN = rf"^(?:{_STEP}(?:/+{_STEP})*/*)?$"
"""A path inside a folder as the document says it, what `clean_path` takes: relative (not starting with '/'), no
'..' step, no NUL; '' or '.' for the top. A path it does not take is refused by `_path` (400, with its reason)."""
PathQuery = Annotated[
    str,
    Query(
        max_length=4096,
        description="A path in the job's output folder, relative to its top ('' : the top; no '..' step).",
        json_schema_extra={"pattern": PATH_PATTERN},  # (said, not checked here: `_path` says why it refuses)
    ),
]
NOT_THERE: Responses = {
    404: {
        "model": ErrorOut,
        "description": "No such job (or one of another tenant), or nothing at that path of its outputs.",
    }
}
CONTENT: Responses = {
    200: {
        "description": "A file's bytes, or a folder as a tar stream.",
        "content": {"application/octet-stream": {}, "application/x-tar": {}},
    }
}


async def _outputs(ctx: SubmitContext, principal: Principal, job_id: str) -> tuple[str, ReadableFolder]:
    """The job's full id and its output folder, if the caller may see the job (404 otherwise, 409 for an
    ambiguous prefix)."""
    view = await visible_job(ctx, principal, job_id)
    if ctx.job_outputs is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, "jobs' outputs are not available on this platform"
        )
    return view.job_id, ctx.job_outputs.folder(view.tenant, view.job_id)


def _path(text: str) -> str:
    """The path asked for, clean: 400 for one that would leave the folder."""
    try:
        where = clean_path(text)
    except PathRefused as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from None
    return where


def _refused(exc: NotThere | PathRefused) -> HTTPException:
    code = status.HTTP_404_NOT_FOUND if isinstance(exc, NotThere) else status.HTTP_400_BAD_REQUEST
    return HTTPException(code, str(exc))


@router.get("/{job_id}/artifacts", response_model=FileListOut, responses={**NOT_THERE, **answers(409)})
async def list_artifacts(
    job_id: JobPath, ctx: Context, principal: CurrentPrincipal, path: PathQuery = ""
) -> FileListOut:
    """The entries of a folder of the job's outputs (their top by default), one level, by name: empty for a job
    that kept nothing."""
    _, folder = await _outputs(ctx, principal, job_id)
    where = _path(path)
    try:
        entries, more = await asyncio.to_thread(folder.listing, where)
    except NotThere as exc:
        if where:
            raise _refused(exc) from None
        entries, more = [], False  # (no output folder: the job kept nothing)
    except PathRefused as exc:
        raise _refused(exc) from None
    items = [
        FileOut(
            path=e.path, kind=e.kind, size_bytes=e.size, modified_at=datetime.fromtimestamp(e.modified, UTC)
        )
        for e in entries
    ]
    return FileListOut(path=where, items=items, truncated=more)


@router.get("/{job_id}/artifacts/content", responses={**CONTENT, **NOT_THERE, **answers(409)})
async def download_artifacts(
    job_id: JobPath, ctx: Context, principal: CurrentPrincipal, path: PathQuery = ""
) -> StreamingResponse:
    """A file of the job's outputs as it is, or a folder (all of them by default) as an uncompressed tar stream,
    sent as it is read; links and files that are not the job's are left out. A job that kept nothing: an empty
    tar stream."""
    full_id, folder = await _outputs(ctx, principal, job_id)
    where = _path(path)
    if not where and await asyncio.to_thread(folder.kind_of, "") is None:  # (nothing kept: an empty tree)
        return StreamingResponse(
            iter([END]),
            media_type="application/x-tar",
            headers={"Content-Disposition": attachment(f"{full_id}-outputs.tar")},
        )
    missing = f"no file or folder {where!r} in job {full_id}'s outputs"
    return await file_or_tree(folder, where, f"{full_id}-outputs", missing)
