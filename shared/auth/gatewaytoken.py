"""The gateway token (`gpuyard.shared.settings.gateway`): every request to a node's executor gateway carries it
(`Authorization: Bearer <token>`), and only the submit service has it (a file of the data dir, 0600; on
Kubernetes a Secret). Checked in constant time; read again when its file changes (docs/access.md)."""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

from gpuyard.shared.auth.bearer import bearer_token
from gpuyard.shared.auth.secretfile import SecretFileError, ensure_secret, read_secret
from gpuyard.shared.settings.gateway import GATEWAY_TOKEN_WHAT

log = logging.getLogger(__name__)
REFUSED = "the executor gateway answers the submit service only: 'Authorization: Bearer <gateway token>'"


class GatewayToken:
    def __init__(self, path: Path, *, make: bool = True):
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._token = b""
        if make:
            try:
                ensure_secret(path, GATEWAY_TOKEN_WHAT)
            except (SecretFileError, OSError) as exc:
                log.error("every request to the gateway is refused: %s", exc)

    def token(self) -> bytes:
        """The token, read again when its file changed; b'' when it cannot be read (nothing matches it)."""
        try:
            found = self.path.stat()
        except OSError:
            return b""
        seen = (found.st_mtime_ns, found.st_ino)
        if seen != self._seen:
            try:
                self._token = read_secret(self.path, GATEWAY_TOKEN_WHAT)
            except SecretFileError as exc:
                log.error("the gateway token cannot be used: %s", exc)
                self._token = b""
            self._seen = seen
        return self._token

    def allows(self, authorization: str | None) -> bool:
        given = bearer_token(authorization)
        token = self.token()
        return given is not None and bool(token) and hmac.compare_digest(given.encode(), token)

    def header(self) -> dict[str, str]:
        """The header that carries it (the submit service's side)."""
        return {"authorization": f"Bearer {self.token().decode()}"}
