"""The one reading of an `Authorization` header: the submit API's routes (`services/submit/auth.py`) and fast
path, and the serving entry point (`services/serving/access.py`)."""

from __future__ import annotations

SCHEME = "bearer"


def bearer_token(header: str | None) -> str | None:
    """The token of 'Bearer <token>' (the scheme in any case, spaces around and between the two ignored);
    None when there is no header, another scheme, no token, or more than one word after the scheme."""
    if header is None:
        return None
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != SCHEME:
        return None
    return parts[1]
