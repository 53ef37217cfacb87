"""A job's own environment at submit: refused when no node heard from offers its Python version (as a job too
large is), when it names an image and every node is of the local backend, or packages to build and every node
is of the Kubernetes backend; the API takes `pip`, not a requirements file."""

from __future__ import annotations

from gpuyard.services.submit.placeability import Placeability
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.jobspec import JobSpec
from tests.unit.services.submit.test_submit_api import VISION, api, ctx  # noqa: F401 (fixtures)
from tests.unit.services.submit.test_unplaceable import heard, node


def offering(name: str, *pythons: str, backend: str = "local"):
    hb = node(name, 2)
    return hb.model_copy(update={"pythons": list(pythons), "labels": {"backend": backend}})


def env_spec(**env) -> JobSpec:
    return JobSpec(command="true", environment=env)


def test_no_node_offering_the_python_is_why_no_node_could_hold_it():
    placeability = Placeability(heard(offering("a", "3.11"), offering("b")))
    assert placeability.why_not(env_spec(pip=["numpy"], python="3.12")) == (
        "needs python 3.12 for its environment; the nodes offer python 3.11"
    )
    assert placeability.why_not(env_spec(pip=["numpy"], python="3.11")) is None
    assert placeability.why_not(env_spec(pip=["numpy"])) is None


def test_the_answer_follows_a_node_that_starts_offering_a_python():
    telemetry = heard(offering("a", "3.11"))
    placeability = Placeability(telemetry)
    assert placeability.why_not(env_spec(python="3.12")) is not None
    telemetry.observe(make_event(offering("a", "3.11", "3.12"), source="/test"))
    assert placeability.why_not(env_spec(python="3.12")) is None


def test_an_image_needs_a_kubernetes_node_and_packages_a_local_one():
    local = Placeability(heard(offering("a", "3.11")))
    assert "the local backend runs no images" in local.backend_error(env_spec(image="python:3.11"))
    assert local.backend_error(env_spec(pip=["numpy"])) is None
    kube = Placeability(heard(offering("k", backend="kubernetes")))
    assert "give one (`image: ...`)" in kube.backend_error(env_spec(pip=["numpy"]))
    assert kube.backend_error(env_spec(image="python:3.11")) is None
    assert Placeability(heard()).backend_error(env_spec(image="python:3.11")) is None  # (no node heard yet)


def test_the_api_refuses_what_no_node_could_build_or_run(api, ctx):  # noqa: F811
    ctx.telemetry.observe(make_event(offering("a", "3.11"), source="/test"))

    def submit(environment):
        return api.post("/v1/jobs", json={"command": "true", "environment": environment}, headers=VISION)

    refused = submit({"pip": ["numpy"], "python": "3.12"})
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith(
        "no node could ever hold this job: needs python 3.12 for its environment; the nodes offer python 3.11"
    )
    image = submit({"image": "python:3.11"})
    assert image.status_code == 422 and "runs no images" in image.json()["detail"]
    file = submit({"requirements": "requirements.txt"})
    assert file.status_code == 422 and "give `pip: [...]`" in str(file.json()["detail"])
    option = submit({"pip": ["--index-url=https://elsewhere"]})
    assert option.status_code == 422 and "not an option" in str(option.json()["detail"])
    assert submit({"pip": ["numpy==2.0"], "python": "3.11"}).status_code == 202
