"""/v1/volumes: make, list, describe and delete volumes; upload, list, download and delete their files
(docs/storage.md).

A volume belongs to a tenant, and its name is that tenant's; an admin names another tenant's with `?tenant=`.
A volume a caller may not see is answered as one that does not exist (404). Paths inside a volume are given
as `?path=`, relative to its top: one that would leave it (`..`, an absolute path, a link on the way) is 400.

An upload (`PUT …/content`) is authenticated and checked before its body is read, then written as it comes to
a file beside the volume, counted against the room the volume has left (413 past it), and moved into place
whole: an upload that fails leaves nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from gpuyard.services.submit.auth import Context, CurrentPrincipal
from gpuyard.services.submit.bodywriter import write_body
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.downloads import file_or_tree
from gpuyard.services.submit.errors import REFUSED_422, RETRY_AFTER, Responses, answers
from gpuyard.services.submit.rawconnection import RawConnection
from gpuyard.services.submit.volumefiles import Staged, VolumeFiles, Written
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.api.common import ErrorOut
from gpuyard.shared.contracts.api.files import FileListOut, FileOut
from gpuyard.shared.contracts.api.volumes import (
    FilesDeletedOut,
    FilesWrittenOut,
    VolumeDeletedOut,
    VolumeIn,
    VolumeListOut,
    VolumeOut,
)
from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.safefolder import NotThere
from gpuyard.shared.runtime.tarstream import PathRefused, clean_path
from gpuyard.shared.runtime.uploadfile import OverQuota, UploadFile
from gpuyard.shared.stores.readmodels.volumeregistry import (
    VolumeError,
    VolumeRegistry,
    VolumeView,
    live_mounting_jobs,
)

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/volumes", tags=["volumes"], responses=answers(400, 401, 413, 503))

CONTENT_PATH = re.compile(r"/v1/volumes/[^/]+/content")
"""The upload route, which reads its own body as it streams (`app.BodyLimit`)."""
NamePath = Annotated[str, Path(pattern=NAME_PATTERN, description="The volume's name.")]
OwnerQuery = Annotated[
    str | None,
    Query(
        pattern=NAME_PATTERN, description="The tenant that owns the volume (default: yours; another: admins)."
    ),
]
PathQuery = Annotated[
    str, Query(max_length=4096, description="A path inside the volume, relative to its top ('' : the top).")
]
BUSY: Responses = {
    429: {
        "model": ErrorOut,
        "description": "The tenant has as many uploads in progress as it may (`max_uploads_per_tenant`).",
        "headers": RETRY_AFTER,
    }
}
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The file's bytes (`application/octet-stream`), or with `archive=tar` a tar stream of a "
        "folder (`application/x-tar`, compressed or not).",
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "application/x-tar": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


def _parts(ctx: SubmitContext) -> tuple[VolumeRegistry, VolumeFiles]:
    if ctx.volumes is None or ctx.volume_files is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "volumes are not available on this platform")
    return ctx.volumes, ctx.volume_files


def _owner(principal: Principal, tenant: str | None, *, whole_tenant: bool = False) -> str:
    """The tenant whose volumes a route names: the caller's, or another's for an admin. Another tenant's volume
    is answered as none (404); its list, or a volume made for it, is refused (403)."""
    owner = tenant or principal.tenant
    if owner != principal.tenant and not principal.admin:
        if whole_tenant:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}, not {owner!r}"
            )
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such volume")
    return owner


def _refused(exc: VolumeError | PathRefused | NotThere | OverQuota) -> HTTPException:
    if isinstance(exc, VolumeError):
        return HTTPException(exc.status, str(exc))
    if isinstance(exc, OverQuota):
        return HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, str(exc))
    code = status.HTTP_404_NOT_FOUND if isinstance(exc, NotThere) else status.HTTP_400_BAD_REQUEST
    return HTTPException(code, str(exc))


def _unwritable(exc: OSError) -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"cannot write to the storage root: {exc.strerror or exc}",
        headers={"Retry-After": "2"},
    )


async def _volume(ctx: SubmitContext, principal: Principal, name: str, tenant: str | None) -> VolumeView:
    registry, _ = _parts(ctx)
    view = await registry.get(_owner(principal, tenant), name)
    if view is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no volume {name!r}")
    return view


def _path(text: str) -> str:
    try:
        return clean_path(text)
    except PathRefused as exc:
        raise _refused(exc) from None


def volume_out(view: VolumeView, **described) -> VolumeOut:
    return VolumeOut(
        name=view.name, tenant=view.tenant, size_bytes=view.size_bytes, created_at=view.created_at,
        created_by=view.created_by, **described,
    )  # fmt: skip


# ---------------------------------------------------------------- volumes


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=VolumeOut,
    responses={**answers(403, 409), **REFUSED_422},
)
async def create_volume(
    body: VolumeIn, ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None
) -> VolumeOut:
    """Make an empty volume of `size` (default `volume_default_size`): 409 for a name in use, 422 past the
    tenant's volume quota (`volume_quota`: what its volumes may hold together)."""
    registry, files = _parts(ctx)
    owner = _owner(principal, tenant, whole_tenant=True)
    size = body.size if body.size is not None else ctx.volume_default_size
    if size < 1:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "a volume's size must be at least 1 byte")
    if await registry.get(owner, body.name) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"volume {body.name!r} exists")
    try:  # its folder first: a volume recorded is one whose folder is there
        await asyncio.to_thread(files.make, owner, body.name)
    except OSError as exc:
        raise _unwritable(exc) from None
    try:
        view = await registry.create(owner, body.name, size, ctx.volume_quota_of(owner), principal.user)
    except VolumeError as exc:
        if exc.status != status.HTTP_409_CONFLICT:  # (409: another request made it meanwhile, its folder)
            await asyncio.to_thread(files.remove, owner, body.name)
        raise _refused(exc) from None
    return volume_out(view)


@router.get("", response_model=VolumeListOut, responses=answers(403))
async def list_volumes(ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None) -> VolumeListOut:
    """The tenant's volumes, oldest first, with its quota and what their sizes take of it."""
    registry, _ = _parts(ctx)
    owner = _owner(principal, tenant, whole_tenant=True)
    views = await registry.listed(owner)
    return VolumeListOut(
        items=[volume_out(v) for v in views],
        quota_bytes=ctx.volume_quota_of(owner),
        reserved_bytes=sum(v.size_bytes for v in views),
    )


@router.get("/{name}", response_model=VolumeOut, responses=answers(404))
async def describe_volume(
    name: NamePath, ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None
) -> VolumeOut:
    """The volume with what its files hold now and the live jobs that mount it."""
    view = await _volume(ctx, principal, name, tenant)
    _, files = _parts(ctx)
    count, used = await asyncio.to_thread(files.usage, view.tenant, name)
    jobs = await live_mounting_jobs(ctx.store, view.tenant, name)
    return volume_out(view, used_bytes=used, files=count, mounted_by=[j.job_id for j in jobs])


@router.delete("/{name}", response_model=VolumeDeletedOut, responses=answers(404, 409))
async def delete_volume(
    name: NamePath, ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None
) -> VolumeDeletedOut:
    """Delete the volume and its files: 409 while a live job mounts it."""
    view = await _volume(ctx, principal, name, tenant)
    registry, files = _parts(ctx)
    _, used = await asyncio.to_thread(files.usage, view.tenant, name)
    try:
        await registry.delete(view.tenant, name, used, principal.user)
    except VolumeError as exc:
        raise _refused(exc) from None
    try:
        await asyncio.to_thread(files.remove, view.tenant, name)
    except OSError as exc:  # deleted all the same: a folder left over, which a volume of the name replaces
        log.warning("volume %s/%s deleted, its folder not removed: %s", view.tenant, name, exc)
    return VolumeDeletedOut(name=name, tenant=view.tenant, freed_bytes=used)


# ---------------------------------------------------------------- files


@router.get("/{name}/files", response_model=FileListOut, responses=answers(404))
async def list_files(
    name: NamePath, ctx: Context, principal: CurrentPrincipal, path: PathQuery = "", tenant: OwnerQuery = None
) -> FileListOut:
    """The entries of a folder of the volume (its top by default), one level, by name."""
    view = await _volume(ctx, principal, name, tenant)
    _, files = _parts(ctx)
    where = _path(path)
    try:
        entries, more = await asyncio.to_thread(files.listing, view.tenant, name, where)
    except (NotThere, PathRefused) as exc:
        raise _refused(exc) from None
    items = [
        FileOut(
            path=e.path, kind=e.kind, size_bytes=e.size, modified_at=datetime.fromtimestamp(e.modified, UTC)
        )
        for e in entries
    ]
    return FileListOut(path=where, items=items, truncated=more)


@router.get(
    "/{name}/content",
    responses={
        200: {
            "description": "A file's bytes, or a folder as a tar stream.",
            "content": {"application/octet-stream": {}, "application/x-tar": {}},
        },
        **answers(404),
    },
)
async def download(
    name: NamePath, ctx: Context, principal: CurrentPrincipal, path: PathQuery = "", tenant: OwnerQuery = None
) -> StreamingResponse:
    """A file of the volume as it is, or a folder (the whole volume by default) as an uncompressed tar stream,
    sent as it is read."""
    view = await _volume(ctx, principal, name, tenant)
    _, files = _parts(ctx)
    where = _path(path)
    missing = f"no file or folder {where!r} in volume {name!r}"
    return await file_or_tree(files.folder(view.tenant, name), where, name, missing)


@router.put(
    "/{name}/content",
    status_code=status.HTTP_201_CREATED,
    response_model=FilesWrittenOut,
    responses={**answers(404), **BUSY},
    openapi_extra=UPLOAD_BODY,
)
async def upload(
    request: Request,
    name: NamePath,
    ctx: Context,
    principal: CurrentPrincipal,
    path: PathQuery,
    archive: Annotated[
        bool, Query(description="The body is a tar stream of files to unpack into the folder `path`.")
    ] = False,
    tenant: OwnerQuery = None,
) -> FilesWrittenOut:
    """Write a file at `path` (its folders made as needed; a file there replaced), or with `archive=true` unpack
    a tar stream of files and folders into the folder `path`. All or nothing: an upload that fails, or does not
    fit in the volume's room left (413), leaves nothing in the volume."""
    view = await _volume(ctx, principal, name, tenant)
    registry, files = _parts(ctx)
    where = _path(path)
    if not where and not archive:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "name the file to write: ?path=dir/file")
    _, used = await asyncio.to_thread(files.usage, view.tenant, name)
    room = max(0, view.size_bytes - used)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and not archive and int(declared) > room:
        raise HTTPException(
            status.HTTP_413_CONTENT_TOO_LARGE,
            f"the file ({format_size(int(declared))}) does not fit: volume {name!r} has {format_size(room)} left "
            f"of {format_size(view.size_bytes)}",
        )
    if not ctx.uploads.take(principal.tenant):
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"tenant {principal.tenant!r} has {ctx.uploads.limit} uploads in progress, as many as it may "
            "(max_uploads_per_tenant): retry when one has ended",
            headers={"Retry-After": "10"},
        )
    try:
        written = await _receive(request, files, view, where, room, archive)
    finally:
        ctx.uploads.give_back(principal.tenant)
    try:
        await registry.written(view.tenant, name, written.path, written.files, written.bytes, principal.user)
    except VolumeError as exc:  # deleted while the bytes came
        raise _refused(exc) from None
    return FilesWrittenOut(volume=name, path=written.path, files=written.files, bytes=written.bytes)


def tar_room(room: int) -> int:
    """The most bytes a tar stream of `room` bytes of files may take: its headers and padding besides (its
    files' own sizes are checked against `room` when it is unpacked)."""
    return room + room // 4 + (64 << 20)


async def _receive(
    request: Request, files: VolumeFiles, view: VolumeView, where: str, room: int, archive: bool
) -> Written:
    """The body written to a staged file as it comes, then placed in the volume (the staged file removed
    whatever happens)."""
    staging: Staged = await asyncio.to_thread(
        files.staging, view.tenant, *((tar_room(room), None) if archive else (room, (view.name, where)))
    )
    try:
        raw = RawConnection.body_of(request)
        if raw is not None and isinstance(staging, UploadFile) and staging.spliceable:
            await raw[0].take_body(raw[1], staging)
        else:
            await write_body(request.stream(), staging.write)
        await asyncio.to_thread(staging.finish)
        if archive:
            return await asyncio.to_thread(files.place_tree, view.tenant, view.name, staging, where, room)
        return await asyncio.to_thread(files.place_file, view.tenant, view.name, staging, where)
    except ClientDisconnect:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "the upload ended before its last byte") from None
    except (OverQuota, PathRefused, NotThere) as exc:
        raise _refused(exc) from None
    except OSError as exc:
        raise _unwritable(exc) from None
    finally:
        await asyncio.to_thread(staging.discard)


@router.delete("/{name}/content", response_model=FilesDeletedOut, responses=answers(404))
async def delete_files(
    name: NamePath, ctx: Context, principal: CurrentPrincipal, path: PathQuery, tenant: OwnerQuery = None
) -> FilesDeletedOut:
    """Remove a file, or a folder with everything in it, from the volume."""
    view = await _volume(ctx, principal, name, tenant)
    registry, files = _parts(ctx)
    where = _path(path)
    if not where:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            "name what to remove: ?path=dir/file (DELETE the volume to remove it all)",
        )
    try:
        count, size = await asyncio.to_thread(files.remove_path, view.tenant, name, where)
    except (NotThere, PathRefused) as exc:
        raise _refused(exc) from None
    with contextlib.suppress(VolumeError):
        await registry.files_deleted(view.tenant, name, where, count, size, principal.user)
    return FilesDeletedOut(volume=name, path=where, files=count, bytes=size)
