"""A command's failure as a server reports it: `{ok: 0, code, codeName, errmsg, errorLabels}`, which the
driver turns into the same exception as a real server's (OperationFailure, with its code and labels)."""

from __future__ import annotations

from typing import Any

# The server's own codes (src/mongo/base/error_codes.yml) for the failures this stand-in reports.
BAD_VALUE = 2
FAILED_TO_PARSE = 9
ILLEGAL_OPERATION = 20
NAMESPACE_NOT_FOUND = 26
INDEX_NOT_FOUND = 27
COMMAND_NOT_FOUND = 59
INDEX_OPTIONS_CONFLICT = 85
INDEX_KEY_SPECS_CONFLICT = 86
WRITE_CONFLICT = 112
DOCUMENT_VALIDATION_FAILURE = 121
NOT_IMPLEMENTED = 238
NO_SUCH_TRANSACTION = 251
OPERATION_NOT_SUPPORTED_IN_TRANSACTION = 263
DUPLICATE_KEY = 11000

TRANSIENT = "TransientTransactionError"
"""The label that tells a driver to run the whole transaction again (`with_transaction` does)."""


class CommandError(Exception):
    def __init__(self, code: int, code_name: str, message: str, labels: tuple[str, ...] = ()):
        super().__init__(message)
        self.code, self.code_name, self.labels = code, code_name, labels

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": 0.0, "errmsg": str(self), "code": self.code, "codeName": self.code_name}
        if self.labels:
            doc["errorLabels"] = list(self.labels)
        return doc


def not_implemented(what: str) -> CommandError:
    """What the stand-in does not do: said loudly, never answered with a guess."""
    return CommandError(NOT_IMPLEMENTED, "NotImplemented", f"the MongoDB stand-in does not implement {what}")


def write_conflict(message: str) -> CommandError:
    return CommandError(WRITE_CONFLICT, "WriteConflict", message, (TRANSIENT,))
