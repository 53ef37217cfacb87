"""Errors of the serving path, each with the HTTP status the Open Inference Protocol answers it with. The
body is always `{"error": message}`; tritonclient raises `InferenceServerException` with that message."""

from __future__ import annotations


class ServingError(Exception):
    status = 500

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadRequest(ServingError):
    """A wrong input name, shape, datatype or size, an unknown output, a malformed or truncated body."""

    status = 400


class Unauthorized(ServingError):
    """For the `authorize` hook: no or a wrong bearer token."""

    status = 401


class Forbidden(ServingError):
    """For the `authorize` hook: a caller who may not use this model."""

    status = 403


class NotFound(ServingError):
    """An unknown model or version."""

    status = 404


class PayloadTooLarge(ServingError):
    """A request body over its limit (`max_request_bytes`, or the most the model's inputs can need), or more rows
    than one request may carry (`max_request_rows`). Answered as soon as it is known: from `Content-Length`
    before the body is read, else as soon as more than the limit has arrived; the rest is never read, and the
    connection is closed after the answer."""

    status = 413


class Unavailable(ServingError):
    """A model or version that exists but is not ready (loading, failed, unloaded)."""

    status = 503


class ModelLoadError(Exception):
    """An artifact that cannot be served: a checksum mismatch, a file ONNX Runtime refuses, a datatype the
    protocol has no name for. Its message is the reason a failed version shows."""
