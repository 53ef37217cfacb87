"""Object stores reached through fsspec (`s3://bucket/prefix` through s3fs, or any URL fsspec knows): the
filesystem of a URL, and the URL as it may be shown. What the model store (`modelfiles/store.py`) and the
volumes in an object store (`GPUYARD_VOLUME_STORE`) share; credentials and endpoint come from the standard AWS
variables or `~/.aws` (e.g. `AWS_ENDPOINT_URL` for MinIO), never from the URL shown."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from gpuyard.shared.runtime.installhint import install_command

S3_PROTOCOLS = {"s3", "s3a"}


class ObjectStoreError(Exception):
    """A store URL that cannot be used; the message says why (never a credential)."""


def shown(url: str) -> str:
    """A URL as it may be shown: without a user or password in it."""
    return re.sub(r"//[^/@]*@", "//***@", url)


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def filesystem(url: str, what: str, *, fresh_listings: bool = False) -> tuple[Any, str]:
    """(fsspec filesystem, path in it) of a URL. `what` names the store in a refusal; `fresh_listings`: every
    listing asks the store (no cache of listings: another process may have written since)."""
    import fsspec

    protocol = url.split("://", 1)[0]
    options = {"use_listings_cache": False} if fresh_listings and protocol in S3_PROTOCOLS else {}
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        extra = f" ({install_command('s3')})" if protocol in S3_PROTOCOLS else ""
        raise ObjectStoreError(
            f"{what} {shown(url)} needs a package that is not installed{extra}: {exc}"
        ) from None
    except ValueError as exc:
        raise ObjectStoreError(f"{what} {shown(url)} is not a URL fsspec knows: {exc}") from None


def mtime_of(info: dict[str, Any]) -> float:
    """When an object was last written, from what fsspec says of it (S3: `LastModified`)."""
    for field in ("LastModified", "mtime", "created"):
        value = info.get(field)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
    return 0.0


def files_under(fs: Any, prefix: str) -> dict[str, dict[str, Any]]:
    """The objects under `prefix/` (key below it -> what fsspec says of it), folder markers left out."""
    found = fs.find(prefix, detail=True)  # (none under it: {}; no bucket: FileNotFoundError)
    start = len(prefix) + 1
    return {
        key[start:]: info
        for key, info in found.items()
        if info.get("type") == "file" and key.startswith(prefix + "/") and not key.endswith("/")
    }
