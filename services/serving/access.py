"""Who may call which model on the serving entry point: the API's bearer tokens (the same tokens file) give the
caller's tenant; a tenant calls its own models and public ones (`gpuyard.shared.stores.readmodels.modelregistry.visible_to`, the API's
rule too). A model the caller may not see is answered as unknown (404), never as forbidden: its existence does
not leak.

A name is its owner's: `/v2/models/mnist` is the caller's own `mnist` and nothing else. Deployed, it answers;
published but with no ready replica (not deployed, or between two deployments), it is 503 with the reason;
never published, 404. It never falls through to another tenant's model of that name, however public. Another
tenant's public model is named with its owner, `/v2/models/vision/mnist` (`gpuyard.shared.stores.readmodels.modelregistry.qualified_name`;
the caller's own tenant there names its own model). A model's visibility is read from the event store once and
kept until a model event says it changed.

The dashboard's inference form calls from the browser with its session cookie (`shared/auth/sessions.py`, the submit
service's key and the same tokens): it is read only when a request has no Authorization header (the hot path of
a bearer token is untouched), stands for its token while that token is valid, and a request that changes
something must carry the session's CSRF token and, when it says its origin, come from the dashboard's."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from starlette.requests import Request

from gpuyard.services.serving.errors import Forbidden, NotFound, Unauthorized, Unavailable
from gpuyard.services.serving.held import model_key, split_key
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes
from gpuyard.shared.auth import sessions
from gpuyard.shared.auth.bearer import bearer_token
from gpuyard.shared.auth.jobtokens import is_job_token
from gpuyard.shared.auth.tokens import Principal, TokenRefused, Tokens
from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry as ModelCatalog
from gpuyard.shared.stores.readmodels.modelregistry import ModelView, split_qualified, visible_to

MISSING_TOKEN = "missing bearer token: send 'Authorization: Bearer <token>'"
JOB_TOKEN = "a job's publish token is accepted by POST /v1/models only"
OTHER_ORIGIN = "a request from a page that is not the dashboard's: its session is not accepted there"
BAD_CSRF = "missing or wrong CSRF token: reload the page and try again"
VIEWS_KEPT = 10_000
"""Models whose visibility is kept at most (then all are read again): names typed at random stay bounded."""
_VALID_NAME = re.compile(NAME_PATTERN)


class Access:
    def __init__(
        self,
        tokens: Tokens,
        catalog: ModelCatalog,
        registry: ModelRegistry,
        routes: Routes,
        *,
        session_secret: bytes | None = None,
        dashboard_origins: Iterable[str] = (),
    ):
        """`session_secret`: the dashboard sessions' key (None: no session is accepted);
        `dashboard_origins`: the origins whose pages may send one (`http://127.0.0.1:8080`)."""
        self.tokens = tokens
        self.catalog = catalog
        self.registry = registry
        self.routes = routes
        self.session_secret = session_secret
        self.dashboard_origins = frozenset(dashboard_origins)
        self._views: dict[tuple[str, str], ModelView | None] = {}

    def principal(self, request: Request) -> Principal:
        header = request.headers.get("authorization")
        if header is None and self.session_secret is not None:
            cookie = request.cookies.get(sessions.COOKIE)
            if cookie is not None:
                return self.session_principal(request, self.session_secret, cookie)
        token = bearer_token(header)
        if token is None:
            raise Unauthorized(MISSING_TOKEN)
        if is_job_token(token):
            raise Unauthorized(JOB_TOKEN)
        try:
            return self.tokens.authenticate(token)
        except TokenRefused as exc:
            raise Unauthorized(str(exc)) from None

    def session_principal(self, request: Request, secret: bytes, cookie: str) -> Principal:
        """Who a dashboard session stands for, as the API reads it (`services/submit/auth.py`)."""
        try:
            session = sessions.read(secret, cookie)
            principal = self.tokens.authenticate_id(session.token_id)
        except (sessions.SessionRefused, TokenRefused) as exc:
            raise Unauthorized(str(exc)) from None
        if request.method not in sessions.SAFE_METHODS:
            origin = request.headers.get("origin")
            if origin is not None and origin.rstrip("/") not in self.dashboard_origins:
                raise Forbidden(OTHER_ORIGIN)
            if not sessions.csrf_ok(secret, session, request.headers.get(sessions.CSRF_HEADER)):
                raise Forbidden(BAD_CSRF)
        return principal

    async def view(self, tenant: str, name: str) -> ModelView | None:
        key = (tenant, name)
        if key not in self._views:
            if len(self._views) >= VIEWS_KEPT:
                self._views.clear()
            self._views[key] = await self.catalog.get(tenant, name)
        return self._views[key]

    def forget(self, tenant: str, name: str) -> None:
        """A model event changed the model: read it again next time."""
        self._views.pop((tenant, name), None)

    def known(self, key: str) -> bool:
        """Whether a replica of the model is held here or anywhere (ready, loading, failed)."""
        return key in self.registry.models or self.routes.holds(key)

    async def may_use(self, principal: Principal, key: str) -> bool:
        tenant, name = split_key(key)
        if tenant == principal.tenant:
            return True
        return visible_to(principal, await self.view(tenant, name))

    async def authorize(self, request: Request, name: str | None) -> str | Callable[[str], str | None]:
        """The `authorize` hook of the v2 app: the registry key of the model `name` stands for to this caller
        (NotFound when none it may use, Unavailable for its own model with no replica anywhere), or for the
        repository index the keys it may see, under the names it calls them by."""
        principal = self.principal(request)
        if name is None:
            visible = {key for key in list(self.registry.models) if await self.may_use(principal, key)}
            return lambda key: self.shown(principal, key) if key in visible else None
        owner, model = split_qualified(name)
        if owner is None or owner == principal.tenant:
            return await self.own(principal, model, name)
        key = model_key(owner, model)
        if not (_valid(owner) and _valid(model)) or not await self.may_use(principal, key):
            raise NotFound(f"unknown model '{name}'")
        return key  # (held nowhere now: the v2 app answers 503)

    async def own(self, principal: Principal, name: str, shown: str) -> str:
        """The caller's own model `name` (`shown`: as the caller wrote it)."""
        key = model_key(principal.tenant, name)
        if self.known(key):
            return key
        if _valid(name) and visible_to(principal, await self.view(principal.tenant, name)):
            raise Unavailable(
                f"model '{shown}' has no ready replica: deploy it (gpuyard models deploy {name}), or wait "
                "until its replicas are ready"
            )
        if shown != name:
            raise NotFound(f"unknown model '{shown}'")
        raise NotFound(
            f"unknown model '{name}' (a name alone is one of your own models: another tenant's public model "
            f"is named with its owner, OWNER/{name})"
        )

    @staticmethod
    def shown(principal: Principal, key: str) -> str:
        """The name the caller calls the model of registry key `key` by: its name if it is the caller's, else
        its qualified name (the key itself)."""
        tenant, name = split_key(key)
        return name if tenant == principal.tenant else key


def _valid(name: str) -> bool:
    return _VALID_NAME.match(name) is not None
