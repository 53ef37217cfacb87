"""A refused request (422) says why and nothing else: no deprecation warning of the web framework reaches the
service's console (warnings are errors here, as under `python -W error`)."""

from __future__ import annotations

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.modelaccess import model_name
from gpuyard.services.submit.routes_platform import _subjects
from tests.unit.services.submit.onnxmodels import tiny_model
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture
def api(tmp_path):
    with (
        submit_context(tmp_path, models=True, max_model_bytes=1 << 20) as ctx,
        TestClient(create_app(ctx)) as c,
    ):
        yield c


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "words"),
    [
        ("post", "/v1/jobs", {"json": {"command": "x", "resources": {"gpus": 100}}}, "at most 64"),
        ("post", "/v1/jobs", {"json": {"command": "x", "resourcez": {}}}, "did you mean `resources`?"),
        (
            "post",
            "/v1/models",
            {"params": {"name": "mnist", "serve": "true", "serve_gpus": 1.5}, "content": tiny_model()},
            "whole number",
        ),
    ],
)
def test_a_422_warns_of_nothing(api, method, path, kwargs, words):
    answer = getattr(api, method)(path, headers=VISION, **kwargs)
    assert answer.status_code == 422 and words in answer.text


@pytest.mark.parametrize("refuse", [lambda: _subjects("NOT A SUBJECT"), lambda: model_name("Bad_Name")])
def test_a_bad_subject_filter_or_model_name_is_a_422_that_warns_of_nothing(refuse):
    with pytest.raises(HTTPException) as refused:
        refuse()
    assert refused.value.status_code == 422
