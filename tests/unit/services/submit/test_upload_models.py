"""Publishing a model (`POST /v1/models`) without holding the API: the file is written to disk as it comes,
in the model store's own folder, and moved into place (never held in memory whole); checked in a process of
its own, bounded in time and memory (422 with the reason past a bound); a tenant has as many uploads at once
as it may (429 beyond, with Retry-After and the reason), and no other tenant waits for them. The answer says
what the publisher needs (name, version, digest, size), not where the server keeps the file. A version a
deployment serves cannot be deleted (409, naming the deployment)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper, numpy_helper

from gpuyard.services.submit.context import Uploads
from gpuyard.shared.contracts.events.models import ModelDeleted
from gpuyard.shared.modelfiles.signature import CheckBounds
from gpuyard.shared.modelfiles.store import UPLOADS_DIR, sha256_of
from tests.unit.services.submit.onnxmodels import tiny_model
from tests.unit.services.submit.submitctx import TOKENS, submit_app, submit_context

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}
ADMIN = {"Authorization": "Bearer tok-admin"}
LIMIT = 8 << 20
MiB = 1 << 20


def sized_model(megabytes: int) -> bytes:
    """A valid ONNX model of about `megabytes` MiB (one initializer): y = x + w."""
    n = megabytes * MiB // 4
    w = numpy_helper.from_array(np.ones(n, dtype=np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "sized", [x], [y], initializer=[w]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.fixture
def ctx(tmp_path):
    with submit_context(
        tmp_path,
        TOKENS,
        models=True,
        max_model_bytes=LIMIT,
        uploads=Uploads(limit=1),
        accept_unplaceable=True,
    ) as context:
        yield context


@pytest.fixture
def app(ctx):
    return submit_app(ctx)


def uploads(tmp_path: Path) -> list[Path]:
    """The uploads being written in the model store's folder."""
    folder = tmp_path / "models" / UPLOADS_DIR
    return sorted(folder.iterdir()) if folder.exists() else []


async def until(check, what: str):
    """`check()`'s first true value, polled (a positive witness; the bound only ends a test that failed)."""
    try:
        async with asyncio.timeout(60):
            while not (value := check()):  # noqa: ASYNC110 (a file on disk: nothing to wait on)
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None
    return value


class Upload:
    """A publish whose body the test hands over in two parts: `head` at once, the rest on `release()`."""

    def __init__(self, app, data: bytes, head: int, headers: dict, name: str = "big", chunked: bool = False):
        self.release_event = asyncio.Event()
        self.sent = 0

        async def body() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 64 * 1024):
                if start >= head:
                    await self.release_event.wait()
                chunk = data[start : start + 64 * 1024]
                self.sent += len(chunk)
                yield chunk

        length = {} if chunked else {"Content-Length": str(len(data))}
        transport = httpx.ASGITransport(app=app)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60)
        self.task = asyncio.create_task(
            self.client.post(
                "/v1/models", params={"name": name}, content=body(), headers={**headers, **length}
            )
        )

    def release(self) -> None:
        self.release_event.set()

    async def answer(self) -> httpx.Response:
        try:
            return await self.task
        finally:
            await self.client.aclose()


async def publish(app, data: bytes, headers: dict = VISION, name: str = "small") -> httpx.Response:
    upload = Upload(app, data, len(data), headers, name)
    return await upload.answer()


async def test_an_upload_is_written_to_disk_as_it_comes_then_moved_into_place(app, tmp_path):
    data = sized_model(6)
    upload = Upload(app, data, head=3 * MiB, headers=VISION)
    # before the body has all come, its first megabytes are on disk already, in the store's own folder
    [part] = await until(
        lambda: [p for p in uploads(tmp_path) if p.stat().st_size >= 2 * MiB], "bytes on disk"
    )
    assert upload.sent < len(data)
    inode = part.stat().st_ino
    upload.release()
    answer = await upload.answer()
    assert answer.status_code == 201, answer.text
    done = answer.json()
    assert (done["name"], done["version"], done["tenant"]) == ("big", 1, "vision")
    assert done["sha256"] == sha256_of(data) and done["size_bytes"] == len(data)
    assert "uri" not in done and str(tmp_path) not in answer.text  # where the server keeps it is its own
    [stored] = (tmp_path / "models" / "vision" / "big" / "1").iterdir()
    assert stored.read_bytes() == data and stored.stat().st_ino == inode  # moved, not copied
    assert uploads(tmp_path) == []


async def test_a_tenant_has_as_many_uploads_at_once_as_it_may_and_no_other_tenant_waits(app, tmp_path):
    data = sized_model(2)
    first = Upload(app, data, head=MiB, headers=VISION)
    await until(lambda: uploads(tmp_path), "the first upload under way")
    refused = await publish(app, tiny_model(), VISION)
    assert refused.status_code == 429, refused.text
    assert "1 model uploads in progress" in refused.json()["detail"]
    assert "max_uploads_per_tenant" in refused.json()["detail"]
    assert int(refused.headers["retry-after"]) > 0
    other = await publish(app, tiny_model(), NLP)  # another tenant, while vision's upload is still under way
    assert other.status_code == 201, other.text
    assert not first.task.done()
    first.release()
    assert (await first.answer()).status_code == 201
    again = await publish(app, tiny_model(), VISION)  # its upload ended: the slot is free again
    assert again.status_code == 201, again.text


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_model_over_the_limit_is_refused_and_nothing_of_it_is_left(app, tmp_path, chunked):
    data = b"\x08" * (LIMIT + 1)
    upload = Upload(app, data, head=len(data), headers=VISION, chunked=chunked)
    answer = await upload.answer()
    assert answer.status_code == 413 and "over 8 MiB (max_model_bytes)" in answer.json()["detail"], (
        answer.text
    )
    assert uploads(tmp_path) == []
    assert not (tmp_path / "models" / "vision").exists()


@pytest.mark.parametrize(
    ("bounds", "reason"),
    [
        (CheckBounds(seconds=0.001), "checking it took over 0.001 s (the limit)"),
        (CheckBounds(memory_bytes=32 * MiB), "checking it needs more than 32 MiB of memory (the limit)"),
    ],
    ids=["time", "memory"],
)
async def test_a_check_past_its_bound_is_refused_with_the_reason(ctx, app, tmp_path, bounds, reason):
    ctx.model_check = bounds
    answer = await publish(app, tiny_model())
    assert answer.status_code == 422, answer.text
    assert answer.json()[
        "detail"
    ] == f"not a publishable ONNX model: {reason}: a graph this large or this " + (
        "deeply nested is not published"
    )
    assert uploads(tmp_path) == [] and not (tmp_path / "models" / "vision").exists()


@pytest.mark.parametrize(
    ("data", "reason"),
    [(b"", "the file is empty"), (b"not a model", "not an ONNX model: Error parsing message")],
)
async def test_a_file_that_is_not_a_model_is_refused_by_its_check_with_the_reason(
    app, tmp_path, data, reason
):
    answer = await publish(app, data)
    assert answer.status_code == 422 and reason in answer.json()["detail"], answer.text
    assert uploads(tmp_path) == []


async def test_a_job_token_may_stream_a_model_too_and_the_upload_counts_for_its_tenant(ctx, app, tmp_path):
    from gpuyard.shared.auth.jobtokens import ensure_secret
    from tests.unit.services.submit.test_models import job_token, running_job

    ctx.publish_secret_file = tmp_path / "publish.key"
    ensure_secret(ctx.publish_secret_file)
    job_id = await asyncio.to_thread(running_job, ctx)
    answer = await publish(app, sized_model(2), job_token(ctx, job_id))
    assert answer.status_code == 201 and answer.json()["job_id"] == job_id, answer.text
    assert ctx.uploads.held == {}


# ---------------------------------------------------------------- a deployed version is not deleted


def deploy(api: TestClient, headers=VISION, **body) -> list[str]:
    """vision's model `mnist` deployed by the caller."""
    answer = api.post("/v1/models/mnist/deployments", json=body, headers=headers, params={"tenant": "vision"})
    assert answer.status_code == 202, answer.text
    return [job["job_id"] for job in answer.json()["jobs"]]


def test_a_deployed_version_is_not_deleted_and_the_refusal_names_its_deployment(app):
    with TestClient(app) as api:
        for scale in (2.0, 3.0):
            assert (
                api.post("/v1/models?name=mnist", content=tiny_model(scale), headers=VISION).status_code
                == 201
            )
        [job] = deploy(api, version=1)
        for path in ("/v1/models/mnist/versions/1", "/v1/models/mnist"):
            refused = api.delete(path, headers=VISION)
            assert refused.status_code == 409, refused.text
            why = refused.json()["detail"]
            assert "'mnist' version 1 is deployed" in why and job in why and "undeploy it first" in why
        assert api.get("/v1/models/mnist/versions/1", headers=VISION).status_code == 200  # nothing deleted
        assert api.delete("/v1/models/mnist/versions/2", headers=VISION).status_code == 200  # not deployed
        # a public model another tenant deploys: counted, its jobs not named to the owner
        assert api.patch("/v1/models/mnist", json={"public": True}, headers=VISION).status_code == 200
        [theirs] = deploy(api, headers=NLP, version=1)
        assert api.delete("/v1/models/mnist/deployments", headers=VISION).status_code == 200
        refused = api.delete("/v1/models/mnist", headers=VISION)
        assert refused.status_code == 409 and "1 replica of another tenant" in refused.json()["detail"]
        assert theirs not in refused.json()["detail"]
        undeployed = api.delete("/v1/models/mnist/deployments", params={"tenant": "vision"}, headers=NLP)
        assert undeployed.status_code == 200, undeployed.text
        gone = api.delete("/v1/models/mnist", headers=VISION)
        assert gone.status_code == 200 and gone.json()["versions"] == [1]


async def deleted_as_before_the_409(ctx, tenant: str, name: str) -> None:
    """Every version of the model deleted though deployed, as a store written before such a deletion was
    refused may hold it: `model.deleted` recorded as the registry records it, without its check."""

    async def decide(view):
        return ModelDeleted(
            name=name, tenant=tenant, versions=[v.version for v in view.versions], whole_model=True, by="ana"
        )

    await ctx.models.record(tenant, name, decide)


def test_the_replicas_of_a_model_deleted_while_deployed_can_still_be_listed_and_undeployed(ctx, app):
    with TestClient(app) as api:
        assert api.post("/v1/models?name=mnist", content=tiny_model(), headers=VISION).status_code == 201
        [job] = deploy(api)
        asyncio.run(deleted_as_before_the_409(ctx, "vision", "mnist"))
        assert api.get("/v1/models/mnist", headers=VISION).status_code == 404
        listed = api.get("/v1/models/mnist/deployments", headers=VISION)
        assert listed.status_code == 200 and [r["job_id"] for r in listed.json()["replicas"]] == [job]
        assert api.delete("/v1/models/mnist/deployments", headers=NLP).status_code == 404  # not nlp's
        undeployed = api.delete("/v1/models/mnist/deployments", headers=VISION)
        assert undeployed.status_code == 200 and [c["job_id"] for c in undeployed.json()["cancelled"]] == [
            job
        ]
        assert api.delete("/v1/models/mnist/deployments", headers=VISION).status_code == 404  # none left
