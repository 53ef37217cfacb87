"""A small client of the submit API, used by the CLI (and usable from Python)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import httpx
from pydantic import TypeAdapter, ValidationError

from gpuyard import contexts
from gpuyard.contexts import Context, ContextError
from gpuyard.shared.contracts.api.alerts import AlertListOut
from gpuyard.shared.contracts.api.jobs import CancelOut, JobAccepted, JobEventOut, JobListOut, JobOut
from gpuyard.shared.contracts.api.models import (
    DeploymentAccepted,
    DeploymentListOut,
    ModelDeletedOut,
    ModelListOut,
    ModelOut,
    ModelPublishedOut,
    ModelVersionOut,
    UndeployedOut,
)
from gpuyard.shared.contracts.api.nodes import NodeControlOut, NodeOut
from gpuyard.shared.contracts.api.platform import DeadLetterOut, ServiceOut
from gpuyard.shared.contracts.api.tenants import TokenCreated, TokenOut
from gpuyard.shared.contracts.api.usage import GpuHistoryOut, JobGpuOut, UsageOut
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.settings.client import ClientSettings

DEFAULT_SERVER = "http://127.0.0.1:8080"
CHOSEN_CONTEXT: ContextVar[str | None] = ContextVar("chosen_context", default=None)
"""The context the CLI's `--context` names, for the clients of the command it runs (made with a server and a
token only); None: GPUYARD_CONTEXT's, else the current one."""


class ClientError(Exception):
    """An error to show as one line."""


def config_dir() -> Path:
    return contexts.config_dir()


def new_idempotency_key() -> str:
    return uuid.uuid4().hex


def detail_of(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(detail, list):  # FastAPI validation errors: one reason per field
        parts = []
        for d in detail:
            loc = ".".join(str(x) for x in d.get("loc", []) if x not in ("body",))
            msg = str(d.get("msg", "")).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        return "; ".join(parts)
    return str(detail)


RETRIED_STATUSES = frozenset({429, 502, 503, 504})
"""Answers worth another try: 429 refuses before doing anything; 503 (a store whose disk is full or whose lock
another writer holds, a bus away) says nothing was done, but a store that could not confirm a write may have
made it; 502 and 504 (a proxy) may not have reached the server at all."""
UNDONE_STATUSES = frozenset({429})
"""Retried whatever the request: what it answers is refused before anything is done. The others are retried
only when repeating the request changes nothing (an idempotent method, or an Idempotency-Key)."""
RETRIES = 4  # tries after the first
BACKOFF = 0.5  # seconds before the first retry without a Retry-After; doubles each time
LONGEST_WAIT = 60.0  # seconds: a Retry-After longer than this is reported, not waited for
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a Retry-After header asks for (delta-seconds; an HTTP date is not used here)."""
    value = response.headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


class Client:
    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        timeout: float = 30,
        *,
        context: str | None = None,
        retries: int = RETRIES,
        on_retry: Callable[[str, float], None] | None = None,
    ):
        """`retries`: how many more times a request that got no answer, or a 429/5xx answer worth repeating,
        is sent (see `request`); `on_retry(why, seconds)` is told before each wait. The server and the token:
        those given, else GPUYARD_SERVER and GPUYARD_TOKEN, else those of the context (`context`, else the
        CLI's --context, else GPUYARD_CONTEXT, else the current one), else the default server."""
        env = ClientSettings()
        saved, chosen = contexts.Contexts(), None
        if not (server and token):  # (given both, no context matters: `gpuyard up`'s own clients)
            try:
                saved = contexts.load(env.config_dir)
                chosen = saved.pick(context or CHOSEN_CONTEXT.get() or env.context or None)
            except ContextError as exc:
                raise ClientError(str(exc)) from None
        self.server = (server or env.server or (chosen and chosen.server) or DEFAULT_SERVER).rstrip("/")
        self.token = token or env.token or (chosen and chosen.token) or None
        self.origin = "GPUYARD_SERVER" if env.server and not server else ""
        self.context: Context | None = None if server or env.server else chosen
        """The context whose server this client talks to (for errors: which platform it tried)."""
        self.known_contexts = len(saved.entries)
        self.token_of = chosen.name if chosen and not (token or env.token) and chosen.token else None
        """The context whose token this client sends, if any (for a refusal: whose token it was)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)
        self.retries = retries
        self.on_retry = on_retry
        self.sleep = time.sleep

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request and return its answer (JSON, or text). Retried with backoff, up to `retries` times:
        a request that never reached the server (connection refused), one refused with 429, and, when repeating
        it changes nothing (a GET, or a request with an Idempotency-Key, or `idempotent=True`), one answered
        503 (the store full or locked, the bus away), one whose answer was lost (connection dropped, timeout)
        or a 502/504. Retry-After is honoured, up to LONGEST_WAIT: one asking longer is reported, not waited
        for."""
        repeatable = (
            kwargs.pop("idempotent", False)
            or method.upper() in IDEMPOTENT_METHODS
            or "Idempotency-Key" in (kwargs.get("headers") or {})
        )
        for attempt in range(self.retries + 1):
            wait = BACKOFF * 2**attempt
            last = attempt == self.retries
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.ConnectError:
                if last:
                    raise ClientError(self.unreachable()) from None
                self._wait(f"cannot reach {self.server}", wait)
                continue
            except httpx.HTTPError as exc:
                if last or not repeatable:
                    raise ClientError(f"request to {self.server} failed: {exc}") from None
                self._wait(f"no answer from {self.server} ({exc or type(exc).__name__})", wait)
                continue
            status = response.status_code
            if status in RETRIED_STATUSES and not last and (status in UNDONE_STATUSES or repeatable):
                asked = retry_after(response)
                if asked is None or asked <= LONGEST_WAIT:
                    self._wait(f"{detail_of(response)} (HTTP {status})", wait if asked is None else asked)
                    continue
            return self.answer_of(response)
        raise AssertionError("unreachable")

    def unreachable(self) -> str:
        """The one line said when the server cannot be reached: which one, whence, and how to pick another."""
        where = f"cannot reach GPUYARD at {self.server}"
        if self.context is not None:
            return (
                f"{where}, the server of context {self.context.name!r}: is its `gpuyard up` running? "
                "`gpuyard context ls` lists the platforms this CLI knows, `gpuyard context use NAME` switches"
            )
        if self.origin:
            return f"{where} ({self.origin}): is `gpuyard up` running?"
        if self.known_contexts:
            return (
                f"{where}: is `gpuyard up` running? `gpuyard context ls` lists the platforms this CLI knows"
            )
        return f"{where}: is `gpuyard up` running?"

    def _wait(self, why: str, seconds: float) -> None:
        if self.on_retry is not None:
            self.on_retry(why, seconds)
        self.sleep(seconds)

    def answer_of(self, response: httpx.Response) -> Any:
        """A response's JSON (or text), or the ClientError that says why it was refused."""
        if response.status_code == 401:
            whose = f" (the token of context {self.token_of!r})" if self.token_of else ""
            raise ClientError(
                f"not authorised ({detail_of(response)}){whose}; pass --token or set GPUYARD_TOKEN"
            )
        if response.status_code >= 400:
            asked = retry_after(response)
            later = f"; retry after {asked:g} s" if asked is not None else ""
            raise ClientError(f"{detail_of(response)} (HTTP {response.status_code}{later})")
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def answer(self, model: Any, method: str, path: str, **kwargs: Any) -> Any:
        """The answer parsed into its public model (`model`: a model, or a type such as list[NodeOut])."""
        data = self.request(method, path, **kwargs)
        try:
            return TypeAdapter(model).validate_python(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "answer"
            raise ClientError(
                f"unexpected answer from {self.server}{path} ({where}: {first['msg']}); "
                "is the server the same GPUYARD version as this CLI?"
            ) from None

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> JobAccepted:
        """Queue a job. Every submission carries an Idempotency-Key (a new one unless given), kept for its
        retries: a retry whose first answer was lost never queues a second job."""
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        return self.answer(JobAccepted, "POST", "/v1/jobs", json=spec, headers=headers)

    def jobs(
        self,
        state: list[JobState] | None = None,
        tenant: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        user: str | None = None,
        name: str | None = None,
        search: str | None = None,
    ) -> JobListOut:
        """A page of jobs, newest first: of these states, tenant, user and name (exact), whose id, name, user
        or tenant holds `search` (ASCII letters in either case)."""
        states = [s.value for s in state] if state else None
        params = {"state": states, "tenant": tenant, "limit": limit, "cursor": cursor}
        params |= {"user": user, "name": name, "q": search}
        return self.answer(
            JobListOut, "GET", "/v1/jobs", params={k: v for k, v in params.items() if v is not None}
        )

    def job(self, job_id: str) -> JobOut:
        return self.answer(JobOut, "GET", f"/v1/jobs/{job_id}")

    def events(self, job_id: str, after: int = 0) -> list[JobEventOut]:
        return self.answer(list[JobEventOut], "GET", f"/v1/jobs/{job_id}/events", params={"after": after})

    def cancel(self, job_id: str) -> CancelOut:
        return self.answer(CancelOut, "POST", f"/v1/jobs/{job_id}/cancel")

    def nodes(self) -> list[NodeOut]:
        return self.answer(list[NodeOut], "GET", "/v1/nodes")

    def node_control(
        self, node: str, action: str, gpu: int | None = None, reason: str = ""
    ) -> NodeControlOut:
        """Cordon, drain or uncordon a node, or one GPU of it (admin token)."""
        body = {"gpu": gpu, "reason": reason}
        return self.answer(NodeControlOut, "POST", f"/v1/nodes/{node}/{action}", json=body)

    def usage(self, since: str = "7d", by: str = "tenant", tenant: str | None = None) -> UsageOut:
        """GPU-hours allocated and used over the window, per tenant, user or job."""
        params = {"since": since, "by": by, "tenant": tenant}
        return self.answer(
            UsageOut, "GET", "/v1/usage", params={k: v for k, v in params.items() if v is not None}
        )

    def gpu_history(self, node: str, since: str = "1h", step: int | None = None) -> GpuHistoryOut:
        params = {"node": node, "since": since, "step": step}
        return self.answer(
            GpuHistoryOut,
            "GET",
            "/v1/gpus/history",
            params={k: v for k, v in params.items() if v is not None},
        )

    def job_gpu(self, job_id: str) -> JobGpuOut:
        """A job's GPUs over its run: its mean utilization, GPU-hours allocated and used."""
        return self.answer(JobGpuOut, "GET", f"/v1/jobs/{job_id}/gpu")

    def services(self) -> list[ServiceOut]:
        return self.answer(list[ServiceOut], "GET", "/v1/services")

    def dead_letters(self, limit: int = 50) -> list[DeadLetterOut]:
        return self.answer(list[DeadLetterOut], "GET", "/v1/deadletters", params={"limit": limit})

    def create_token(self, **fields: Any) -> TokenCreated:
        body = {k: v for k, v in fields.items() if v is not None}
        return self.answer(TokenCreated, "POST", "/v1/admin/tokens", json=body)

    def tokens(self) -> list[TokenOut]:
        return self.answer(list[TokenOut], "GET", "/v1/admin/tokens")

    def revoke_token(self, token_id: str) -> None:
        self.request("DELETE", f"/v1/admin/tokens/{token_id}")

    def logs(self, job_id: str, **params: Any) -> str:
        return self.request(
            "GET", f"/v1/jobs/{job_id}/logs", params={k: v for k, v in params.items() if v is not None}
        )

    def follow_logs(self, job_id: str, **params: Any) -> Iterator[bytes]:
        params = {k: v for k, v in params.items() if v is not None} | {"follow": "true"}
        try:
            with self.http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ClientError(f"{detail_of(response)} (HTTP {response.status_code})")
                yield from response.iter_bytes()
        except httpx.ConnectError:
            raise ClientError(self.unreachable()) from None

    # ------------------------------------------------------------------ models (docs/models.md)

    def publish_model(
        self,
        data: bytes,
        name: str,
        version: int | None = None,
        public: bool = False,
        tenant: str | None = None,
        serve: dict[str, Any] | None = None,
    ) -> ModelPublishedOut:
        """Publish an ONNX file's bytes. Repeating it changes nothing (the same bytes answer the version that
        holds them, and its deployment asked for with `serve` the same serve jobs), so a publish whose answer
        was lost is retried. `serve`: deploy the version published, e.g. {"gpus": 0.25, "replicas": 2} ({}:
        the defaults)."""
        params = {"name": name, "version": version, "public": "true" if public else None, "tenant": tenant}
        if serve is not None:
            params |= {"serve": "true", **{f"serve_{k}": v for k, v in serve.items()}}
        return self.answer(
            ModelPublishedOut,
            "POST",
            "/v1/models",
            content=data,
            params={k: v for k, v in params.items() if v is not None},
            headers={"Content-Type": "application/octet-stream"},
            idempotent=True,
        )

    def alerts(
        self,
        state: str = "active",
        kind: str | None = None,
        tenant: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> AlertListOut:
        """Alerts newest first: `state` active, resolved or all."""
        params = {"state": state, "kind": kind, "tenant": tenant, "limit": limit, "cursor": cursor}
        return self.answer(
            AlertListOut, "GET", "/v1/alerts", params={k: v for k, v in params.items() if v is not None}
        )

    def models(self, tenant: str | None = None) -> ModelListOut:
        return self.answer(ModelListOut, "GET", "/v1/models", params={"tenant": tenant} if tenant else None)

    def model(self, name: str, tenant: str | None = None) -> ModelOut:
        return self.answer(
            ModelOut, "GET", f"/v1/models/{name}", params={"tenant": tenant} if tenant else None
        )

    def model_version(self, name: str, version: int, tenant: str | None = None) -> ModelVersionOut:
        return self.answer(
            ModelVersionOut,
            "GET",
            f"/v1/models/{name}/versions/{version}",
            params={"tenant": tenant} if tenant else None,
        )

    def delete_model(
        self, name: str, version: int | None = None, tenant: str | None = None
    ) -> ModelDeletedOut:
        path = f"/v1/models/{name}" + (f"/versions/{version}" if version is not None else "")
        return self.answer(ModelDeletedOut, "DELETE", path, params={"tenant": tenant} if tenant else None)

    def deploy_model(self, name: str, tenant: str | None = None, **asked: Any) -> DeploymentAccepted:
        """Deploy a model: `asked` is `DeploymentIn`'s fields (version, gpus, replicas, priority, cpus,
        memory). One Idempotency-Key for the call and its retries: a lost answer never deploys twice."""
        return self.answer(
            DeploymentAccepted,
            "POST",
            f"/v1/models/{name}/deployments",
            json={k: v for k, v in asked.items() if v is not None},
            params={"tenant": tenant} if tenant else None,
            headers={"Idempotency-Key": new_idempotency_key()},
        )

    def deployments(self, name: str, tenant: str | None = None) -> DeploymentListOut:
        return self.answer(
            DeploymentListOut,
            "GET",
            f"/v1/models/{name}/deployments",
            params={"tenant": tenant} if tenant else None,
        )

    def undeploy_model(
        self, name: str, version: int | None = None, tenant: str | None = None
    ) -> UndeployedOut:
        params = {"tenant": tenant, "version": version}
        return self.answer(
            UndeployedOut,
            "DELETE",
            f"/v1/models/{name}/deployments",
            params={k: v for k, v in params.items() if v is not None},
        )

    def healthy(self) -> bool:
        try:
            return self.http.get("/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
