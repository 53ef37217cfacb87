"""`environment:` of a job spec: pip requirements as pip takes them (never an option), a quoted major.minor
Python, an image alone; the key a content hash that keeps the packages' order and ignores whitespace."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuyard.shared.contracts.jobspec import EnvironmentSpec, JobSpec, environment_key, packages_summary


def refused(env) -> str:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate({"command": "x", "environment": env})
    return str(caught.value)


@pytest.mark.parametrize(
    "requirement",
    [
        "numpy",
        "torch==2.13.0",
        "a[b,c]>=1,<2",
        "x; python_version >= '3.8'",
        "w @ https://h/w-1-py3-none-any.whl",
    ],
)
def test_requirements_pip_takes_are_taken(requirement):
    assert EnvironmentSpec(pip=[requirement]).pip


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"pip": ["--index-url=https://x"]}, "not an option"),
        ({"pip": ["-r other.txt"]}, "not an option"),
        ({"pip": ["x @ file:///etc/passwd"]}, "a pip requirement is"),
        ({"pip": ["numpy\nscipy"]}, "a pip requirement is"),
        ({"python": 3.10}, 'write the Python version in quotes, e.g. python: "3.11"'),
        ({"python": "3"}, "major.minor"),
        ({"requirements": "r.txt"}, "give `pip: [...]`"),
        ({}, "an environment names its packages"),
        ({"image": "python:3.11", "pip": ["x"]}, "not both"),
        ({"image": "not an image"}, "not a container image name"),
        ({"pip": ["x"], "pyton": "3.11"}, "pyton"),
    ],
)
def test_what_is_refused_is_said(env, words):
    assert words in refused(env)


def test_the_key_keeps_the_order_ignores_whitespace_and_follows_the_builder():
    def key(*pip, python="3.11", builder=()):
        return environment_key(EnvironmentSpec(pip=list(pip)), python=python, builder=builder)

    assert key("a", "b") != key("b", "a")
    assert key("a == 1", " b[x , y] ") == key("a==1", "b[x,y]")
    assert key("a") != key("a", python="3.12") and key("a") != key("a", builder=("https://mirror/simple",))
    assert len(key("a")) == 20


def test_the_summary_is_short_and_never_shows_a_url():
    assert packages_summary(["a", "b"]) == "a, b" and packages_summary([]) == "no packages"
    assert packages_summary(["w @ https://user:secret@h/w.whl", "b", "c", "d"]) == "w @ …, b, c and 1 more"


def test_a_serve_job_has_no_environment_of_its_own():
    with pytest.raises(ValidationError, match="serving service's own environment"):
        JobSpec.model_validate({"serve": {"model": "m", "version": 1}, "environment": {"pip": ["numpy"]}})
