"""Models in the event store: one stream per model (`model:<tenant>:<name>`), holding its published versions,
with a projection (`ModelView`) for listing; and the registry that publishes, deletes and shares them.

A model's stream is of the kind `StreamKind.MODEL`, which the readers of jobs never read; its projection's state
is `private`, `public` or `removed` (no version left), and its stream id begins with `model:`, so that it is
never a job's id.

Writes go through the event store with the expected version of the stream, then are published on the bus
(`gpuyard.shared.stores.readmodels.recording`).

A version is immutable: its file's key names its sha256 (`gpuyard.shared.modelfiles.store`); the same version with other
bytes is refused, the same bytes again answer the version that holds them. A deleted version's number is never
given again. A version a deployment serves is not deleted (409): its replicas are the serve jobs not yet ended,
which the registry reads from the jobs' projections (`deployed_versions`), whichever tenant deployed it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from gpuyard.shared.auth.tokens import Principal, may_see
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData
from gpuyard.shared.contracts.events.models import (
    ModelDeleted,
    ModelPublished,
    ModelVisibilityChanged,
    TensorSpec,
)
from gpuyard.shared.contracts.jobstate import LIVE_STATES, JobView, state_values
from gpuyard.shared.modelfiles.signature import read_signature
from gpuyard.shared.modelfiles.store import ModelStore, ModelStoreError, StagedFile, sha256_of
from gpuyard.shared.stores.events import EventStore, Projection, Projections, StreamKind
from gpuyard.shared.stores.readmodels.recording import record_in_stream

log = logging.getLogger(__name__)

STREAM_PREFIX = "model:"
"""Model streams' ids begin with it: never a job's (nor any other kind's) stream id."""
KIND = StreamKind.MODEL
PRIVATE = "private"
"""Listed for its own tenant only."""
PUBLIC = "public"
"""Listed for every tenant."""
REMOVED = "removed"
"""No version left: listed for none."""
PAGE = 500


def stream_id(tenant: str, name: str) -> str:
    return f"{STREAM_PREFIX}{tenant}:{name}"


class ModelVersion(BaseModel):
    model_config = ConfigDict(frozen=True)
    version: int
    uri: str
    sha256: str
    size_bytes: int
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    job_id: str | None = None
    user: str = ""
    published_at: datetime


class ModelView(BaseModel):
    """A model as its events made it: the projection of its stream."""

    model_config = ConfigDict(frozen=True)
    name: str
    tenant: str
    public: bool = False
    versions: list[ModelVersion] = Field(default_factory=list)
    """Its listed versions, oldest first."""
    removed: list[int] = Field(default_factory=list)
    """Versions deleted: their numbers are never given again."""
    created_at: datetime
    updated_at: datetime
    version: int = 0
    """The stream's version (events applied)."""

    @property
    def state(self) -> str:
        if not self.versions:
            return REMOVED
        return PUBLIC if self.public else PRIVATE

    def find(self, version: int) -> ModelVersion | None:
        return next((v for v in self.versions if v.version == version), None)

    def with_sha256(self, sha256: str) -> ModelVersion | None:
        return next((v for v in self.versions if v.sha256 == sha256), None)

    @property
    def latest(self) -> ModelVersion | None:
        return self.versions[-1] if self.versions else None

    @property
    def next_version(self) -> int:
        return max([v.version for v in self.versions] + self.removed, default=0) + 1


def apply(view: ModelView | None, event: CloudEvent, version: int) -> ModelView:
    """`view` with `event` (the stream's `version`-th) applied."""
    data, at = event.data, event.time
    if view is None:
        if not isinstance(data, ModelPublished):
            raise ValueError(f"a model's stream begins with model.published, not {event.type}")
        view = ModelView(name=data.name, tenant=data.tenant, created_at=at, updated_at=at)
    update: dict = {"version": version, "updated_at": at}
    if isinstance(data, ModelPublished):
        published = ModelVersion(
            version=data.version, uri=data.uri, sha256=data.sha256, size_bytes=data.size_bytes,
            inputs=data.inputs, outputs=data.outputs, job_id=data.job_id, user=data.user, published_at=at,
        )  # fmt: skip
        versions = sorted([*view.versions, published], key=lambda v: v.version)
        update |= {"versions": versions, "public": view.public or data.public}
        if not view.versions:  # the first version, or the first since the model was deleted
            update["public"] = data.public
    elif isinstance(data, ModelVisibilityChanged):
        update["public"] = data.public
    elif isinstance(data, ModelDeleted):
        gone = set(data.versions)
        update["versions"] = [v for v in view.versions if v.version not in gone]
        update["removed"] = sorted(set(view.removed) | gone)
        if not update["versions"]:
            update["public"] = False  # a model published again under the name starts private
    else:
        raise ValueError(f"{event.type} is not a model event")
    return view.model_copy(update=update)


def projection_of(view: ModelView) -> Projection:
    return Projection(
        stream_id=stream_id(view.tenant, view.name),
        tenant=view.tenant,
        state=view.state,
        created_at=view.created_at.isoformat(),
        version=view.version,
        doc=view,
    )


class ModelError(Exception):
    """A request the registry refuses; `status` is the HTTP answer it stands for (404, 409, 422)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Published:
    view: ModelView
    version: ModelVersion
    duplicate: bool
    """The same bytes were published before: the version that holds them, nothing new."""


Decide = Callable[[ModelView | None], Awaitable[EventData | None]]


def visible_to(principal: Principal, view: ModelView | None) -> bool:
    """Whether `principal` may see and use the model (list it, deploy it, infer with it): a listed model of its
    own tenant, or a public one (an admin: any). A model it may not see is answered as one that does not
    exist (404): the API's model routes and the serving entry point both ask here. Which model a name stands
    for is decided before, by its owner: a name alone is the caller's own model, never another tenant's, however
    public (`qualified_name`)."""
    return view is not None and bool(view.versions) and (view.public or may_see(principal, view.tenant))


def qualified_name(tenant: str, name: str) -> str:
    """How a model is named with its owner: `OWNER/NAME` (`vision/mnist`). On the serving entry point a name
    alone is always the caller's own model, and another tenant's public model is reached by this name only
    (docs/serving.md, "Model names"). Neither a tenant's nor a model's name holds a '/' (`jobspec.Name`), so it
    splits one way only."""
    return f"{tenant}/{name}"


def split_qualified(text: str) -> tuple[str | None, str]:
    """`OWNER/NAME` -> (OWNER, NAME); a name alone -> (None, NAME). Whatever follows the first '/' is the name
    (which a valid name never holds: such a name is no model's)."""
    owner, slash, name = text.partition("/")
    return (owner, name) if slash else (None, text)


def serves(job: JobView, tenant: str, name: str, version: int | None = None) -> bool:
    """Whether `job` is a replica of `tenant`'s model `name` (of `version`, when given): a serve job of the
    model's tenant, or of another tenant deploying it (`ServeSpec.tenant` names the owner then)."""
    serve = job.spec.serve
    return (
        serve is not None
        and serve.model == name
        and (serve.tenant or job.tenant) == tenant
        and (version is None or serve.version == version)
    )


async def live_serve_jobs(
    store: Projections, tenant: str, name: str, version: int | None = None, *, job_tenant: str | None = None
) -> list[JobView]:
    """The serve jobs not yet ended (`LIVE_STATES`) of `tenant`'s model `name` (of `version`, when given),
    newest first: whoever deployed it, or only `job_tenant`'s jobs.

    They are found among the live jobs in the event store's job projections: a store index on the served model
    would spare the scan, once deployments are many."""
    found: list[JobView] = []
    cursor = None
    while True:
        page = await store.list_projections(
            states=state_values(LIVE_STATES), tenant=job_tenant, limit=PAGE, cursor=cursor
        )
        for doc in page.items:
            if (doc.get("spec") or {}).get("serve"):
                job = JobView.model_validate(doc)
                if serves(job, tenant, name, version):
                    found.append(job)
        if not page.next_cursor:
            return found
        cursor = page.next_cursor


async def deployed_versions(store: Projections, view: ModelView) -> dict[int, list[JobView]]:
    """The versions of the model that a deployment serves, which cannot be deleted: each with its live
    replicas (serve jobs not yet ended, of any tenant), newest first; a version none serves is absent."""
    deployed: dict[int, list[JobView]] = {}
    for job in await live_serve_jobs(store, view.tenant, view.name):
        assert job.spec.serve is not None  # (`serves`)
        deployed.setdefault(job.spec.serve.version, []).append(job)
    return dict(sorted(deployed.items()))


def deployed_refusal(
    view: ModelView, version: int | None, deployed: dict[int, list[JobView]], viewer: Principal | None
) -> str:
    """Why the model (or `version` of it) cannot be deleted while `deployed` serves it: the versions, the serve
    jobs `viewer` may see (None: every one; another tenant's are counted, not named) and the call that
    undeploys them."""
    jobs = [job for jobs in deployed.values() for job in jobs]
    numbers = ", ".join(map(str, deployed))
    what = f"version {numbers} is" if len(deployed) == 1 else f"versions {numbers} are"
    seen = [job.job_id for job in jobs if viewer is None or may_see(viewer, job.tenant)]
    others = len(jobs) - len(seen)
    held = []
    if seen:
        held.append(f"serve job{'s' if len(seen) > 1 else ''} {', '.join(seen)}")
    if others:
        held.append("1 replica of another tenant" if others == 1 else f"{others} replicas of other tenants")
    query = {
        "version": version,
        "tenant": view.tenant if viewer is None or view.tenant != viewer.tenant else None,
    }
    asked = "&".join(f"{k}={v}" for k, v in query.items() if v is not None)
    undeploy = f"DELETE /v1/models/{view.name}/deployments" + (f"?{asked}" if asked else "")
    return (
        f"model {view.name!r} {what} deployed ({' and '.join(held)}): "
        f"undeploy {'it' if len(deployed) == 1 else 'them'} first ({undeploy})"
    )


class ModelRegistry:
    """Publishes, lists, shares and deletes models: their events in the event store, their files in the model
    store."""

    def __init__(self, store: EventStore, bus: Bus | None, source: str, files: ModelStore):
        self.store = store
        self.bus = bus
        self.source = source
        self.files = files

    async def get(self, tenant: str, name: str) -> ModelView | None:
        doc = await self.store.get_projection(stream_id(tenant, name), kind=KIND)
        return ModelView.model_validate(doc) if doc is not None else None

    async def listed(self, *, tenant: str | None, public: bool = False) -> list[ModelView]:
        """The listed models of `tenant` (every tenant's: None), or only the public ones (`public`)."""
        states = [PUBLIC] if public else [PRIVATE, PUBLIC]
        found, cursor = [], None
        while True:
            page = await self.store.list_projections(
                states=states, tenant=tenant, limit=PAGE, cursor=cursor, kind=KIND
            )
            found += [ModelView.model_validate(d) for d in page.items]
            if not page.next_cursor:
                return found
            cursor = page.next_cursor

    async def record(
        self, tenant: str, name: str, decide: Decide
    ) -> tuple[ModelView | None, CloudEvent | None]:
        """Store and publish what `decide(current view)` returns (None: nothing); decided again on a newer view
        when another writer got there first (`record_in_stream`). Raises ConcurrencyError when others kept
        winning, ModelError from `decide`."""
        return await record_in_stream(
            self.store,
            self.bus,
            self.source,
            stream_id(tenant, name),
            KIND,
            read=lambda: self.get(tenant, name),
            apply=apply,
            projection_of=projection_of,
            decide=decide,
        )

    # ------------------------------------------------------------------ what the API does

    async def publish(
        self,
        *,
        tenant: str,
        name: str,
        data: bytes | StagedFile,
        version: int | None = None,
        public: bool = False,
        job_id: str | None = None,
        user: str = "",
    ) -> Published:
        """Publish `data` (an ONNX file) as `name`'s next version, or as `version`. ModelError: 422 for a file
        that is not a valid ONNX model, 409 for a version that holds other bytes or was deleted."""
        signature = await asyncio.to_thread(read_signature, data)  # InvalidModel (a ValueError): 422
        sha256 = sha256_of(data)
        written: set[str] = set()
        outcome: dict[str, ModelVersion] = {}

        async def decide(view: ModelView | None) -> EventData | None:
            same = view.with_sha256(sha256) if view else None
            if version is not None:
                held = view.find(version) if view else None
                if held is not None:
                    if held.sha256 != sha256:
                        raise ModelError(
                            409,
                            f"{name} version {version} is published with other bytes (sha256 {held.sha256}): "
                            "a version never changes; publish a new one",
                        )
                    outcome["duplicate"] = held
                    return None
                if view is not None and version in view.removed:
                    raise ModelError(
                        409, f"{name} version {version} was deleted; its number is not given again"
                    )
            elif same is not None:
                outcome["duplicate"] = same
                return None
            target = version if version is not None else view.next_version if view else 1
            try:
                uri, _ = await asyncio.to_thread(self.files.put, tenant, name, target, data)
            except ModelStoreError as exc:
                raise ModelError(503, str(exc)) from None
            written.add(uri)
            return ModelPublished(
                name=name, tenant=tenant, version=target, uri=uri, sha256=sha256, size_bytes=len(data),
                inputs=signature.inputs, outputs=signature.outputs, job_id=job_id, user=user, public=public,
            )  # fmt: skip

        try:
            view, event = await self.record(tenant, name, decide)
        finally:
            await self._remove_unused(tenant, name, written)
        assert view is not None
        if event is None:
            return Published(view, outcome["duplicate"], duplicate=True)
        assert isinstance(event.data, ModelPublished)
        held = view.find(event.data.version)
        assert held is not None
        return Published(view, held, duplicate=False)

    async def _remove_unused(self, tenant: str, name: str, written: set[str]) -> None:
        """Files written for a publish that did not record them (another writer took the version first)."""
        if not written:
            return
        view = await self.get(tenant, name)
        used = {v.uri for v in view.versions} if view else set()
        for uri in written - used:
            await self._delete_file(uri)

    async def _delete_file(self, uri: str) -> None:
        try:
            await asyncio.to_thread(self.files.delete, uri)
        except ModelStoreError as exc:  # the listing no longer names it: a file left over, harmless
            log.warning("model file left in the store: %s", exc)

    async def set_public(self, tenant: str, name: str, public: bool, by: str) -> ModelView:
        async def decide(view: ModelView | None) -> EventData | None:
            if view is None or not view.versions:
                raise ModelError(404, f"no model {name!r}")
            if view.public == public:
                return None
            return ModelVisibilityChanged(name=name, tenant=tenant, public=public, by=by)

        view, _ = await self.record(tenant, name, decide)
        assert view is not None
        return view

    async def delete(
        self, tenant: str, name: str, version: int | None, by: str, *, viewer: Principal | None = None
    ) -> list[int]:
        """Remove one version, or every version (None), from the listing, then their files. 404 for a model or
        version that is not listed, 409 for one a deployment serves (`deployed_versions`), with the reason
        naming its serve jobs that `viewer` may see (None: every one)."""
        removed: list[ModelVersion] = []

        async def decide(view: ModelView | None) -> EventData | None:
            if view is None or not view.versions:
                raise ModelError(404, f"no model {name!r}")
            if version is not None:
                held = view.find(version)
                if held is None:
                    raise ModelError(404, f"model {name!r} has no version {version}")
                gone = [held]
            else:
                gone = list(view.versions)
            numbers = {v.version for v in gone}
            deployed = await deployed_versions(self.store, view)
            serving = {v: jobs for v, jobs in deployed.items() if v in numbers}
            if serving:
                raise ModelError(409, deployed_refusal(view, version, serving, viewer))
            removed[:] = gone
            return ModelDeleted(
                name=name,
                tenant=tenant,
                versions=[v.version for v in gone],
                whole_model=version is None,
                by=by,
            )

        await self.record(tenant, name, decide)
        for v in removed:
            await self._delete_file(v.uri)
        return [v.version for v in removed]
