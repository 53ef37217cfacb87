import pytest
from pydantic import ValidationError

from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.specfiles import SpecError, load_spec_text
from gpuyard.shared.contracts.units import parse_duration, parse_size


def spec(**fields):
    return JobSpec.model_validate({"command": "true", **fields})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GB", 16 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5Gi", int(1.5 * 2**30)),
        (1024, 1024),
        ("10 kb", 10_000),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("90s", 90), ("45m", 2700), ("1h30m", 5400), ("2d", 172800), (12, 12)]
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["ten GB", "5XB", -1])
def test_bad_sizes_are_refused_with_a_reason(bad):
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@pytest.mark.parametrize("field", ["memory", "gpu_memory"])
@pytest.mark.parametrize("bad", [{}, [], [1]])
def test_a_size_of_another_json_type_is_a_validation_error_not_a_crash(field, bad):
    with pytest.raises(ValidationError, match="a size must be a number of bytes"):
        spec(resources={"gpus": 0.5, field: bad} if field == "gpu_memory" else {field: bad})


@pytest.mark.parametrize("bad", [{}, [1], {"s": 1}])
def test_a_duration_of_another_json_type_is_a_validation_error_not_a_crash(bad):
    with pytest.raises(ValidationError, match="a duration must be a number of seconds"):
        spec(timeout=bad)


def test_whole_and_fractional_gpus():
    assert spec(resources={"gpus": 2}).resources.whole_gpus == 2
    frac = spec(resources={"gpus": 0.46, "gpu_memory": "10GB"}).resources
    assert frac.is_fractional and frac.gpu_memory == 10 * 10**9


def test_fractions_above_one_gpu_are_refused():
    with pytest.raises(ValidationError, match="whole number"):
        spec(resources={"gpus": 1.5})


def test_unknown_fields_are_errors_not_ignored():
    with pytest.raises(ValidationError) as exc:
        spec(gpu=2)
    assert exc.value.errors()[0]["loc"] == ("gpu",)
    with pytest.raises(ValidationError):
        spec(resources={"gpu": 2})


def test_gpu_model_accepts_a_list_or_a_pipe_separated_string():
    assert spec(resources={"gpus": 1, "gpu_model": "A100|H100"}).resources.gpu_model == ["A100", "H100"]


def test_command_string_runs_through_a_shell_and_list_does_not():
    assert spec(command="echo hi").argv == ["/bin/sh", "-c", "echo hi"]
    assert spec(command=["python", "-c", "1"]).argv == ["python", "-c", "1"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"priority": "urgent"}, "priority"),
        ({"name": "Bad_Name"}, "name"),
        ({"env": {"1X": "y"}}, "env"),
        ({"replicas": 0}, "replicas"),
        ({"timeout": "soon"}, "timeout"),
        ({"command": ""}, "command"),
    ],
)
def test_bad_fields_name_the_field(fields, field):
    with pytest.raises(ValidationError) as exc:
        spec(**fields)
    assert exc.value.errors()[0]["loc"][0] == field


def test_yaml_and_json_specs_load():
    assert load_spec_text("command: [echo, hi]\nreplicas: 2\n")["replicas"] == 2
    assert load_spec_text('{"command": "x"}', filename="a.json") == {"command": "x"}
    with pytest.raises(SpecError, match="mapping"):
        load_spec_text("- a\n- b\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec_text("command: [unclosed\n")


# ---------------------------------------------------------------- serve jobs (one replica of a deployment)

SERVE = {"model": "mnist", "version": 2}


def test_a_serve_job_serves_a_model_and_has_no_command():
    job = JobSpec.model_validate({"serve": SERVE, "resources": {"gpus": 0.25}})
    assert job.command is None and job.serve.job_name == "mnist:2" and job.resources.gpus == 0.25
    with pytest.raises(ValueError, match="no command"):
        _ = job.argv


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({}, "a job needs a command"),
        ({"command": "python serve.py", "serve": SERVE}, "it has no command"),
        ({"serve": SERVE, "replicas": 2}, "replicas must be 1"),
        ({"serve": {"model": "mnist"}}, "version"),
        ({"serve": {"model": "Bad_Name", "version": 1}}, "lowercase"),
        ({"serve": {"model": "mnist", "version": 0}}, "greater than or equal to 1"),
        ({"serve": {**SERVE, "extra": 1}}, "Extra inputs"),
    ],
)
def test_a_job_has_a_command_or_a_model_to_serve_not_both_nor_neither(fields, why):
    with pytest.raises(ValidationError, match=why):
        JobSpec.model_validate(fields)


def test_a_serve_job_restarts_a_replica_that_dies_unless_it_says_otherwise():
    from gpuyard.shared.contracts.jobspec import SERVE_MAX_RETRIES

    assert JobSpec.model_validate({"serve": SERVE}).max_retries == SERVE_MAX_RETRIES > 0
    assert JobSpec.model_validate({"serve": SERVE, "max_retries": 0}).max_retries == 0
    assert spec().max_retries == 0  # a command: as before
    stored = JobSpec.model_validate({"serve": SERVE}).model_dump()
    assert JobSpec.model_validate(stored) == JobSpec.model_validate({"serve": SERVE})  # (read back as stored)
