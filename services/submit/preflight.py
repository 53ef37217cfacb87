"""What the submit service refuses to start with, said in one line before anything starts (`run_service`'s
preflight): tokens it cannot read, job users it cannot use, a volume or output store fsspec cannot reach, and a
non-loopback address without tokens."""

from __future__ import annotations

import contextlib
import ipaddress

from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.runtime.jobusers import JobUsers
from gpuyard.shared.runtime.objectstore import ObjectStoreError, filesystem
from gpuyard.shared.settings.submit import SubmitSettings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


def preflight(settings: SubmitSettings) -> str | None:
    """Refuse to serve a non-loopback address without tokens (anyone on the network could submit), and a volume
    or output store that cannot be reached through fsspec."""
    try:
        tokens = Tokens(settings.tokens_file, settings.tokens).check()
    except (OSError, ValueError) as exc:
        return f"cannot read the tokens: {exc}"
    try:
        JobUsers.from_setting(settings.job_users, settings.job_uid_base)
    except ValueError as exc:
        return str(exc)
    for url, what in (
        (settings.volume_store, "the volume store"),
        (settings.output_store, "the output store"),
    ):
        try:
            if url:
                filesystem(url, what)
        except ObjectStoreError as exc:
            return str(exc)
    if not tokens and not is_loopback(settings.submit_host):
        return f"no tokens configured and {settings.submit_host} is not loopback: set GPUYARD_TOKENS_FILE or GPUYARD_TOKENS"
    return None
