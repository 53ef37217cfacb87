"""What vulture reports as unused in gpuyard/, services/ and shared/ and the dead-code check lets stand
(tests/unit/project/test_dead_code.py), each entry `(file, name): why`. An entry matches every finding of that name in
that file; an entry that matches no finding any more fails the check, so the list only holds what is still
there.

Not listed, because the check does not look at them: fields (a variable in a class body: pydantic and
dataclass fields, enum members, read by serialization or by value) and attributes set on an object (read by a
framework or by tests). Routes, validators and upcasters are known by their decorators (`IGNORE_DECORATORS`).
"""

from __future__ import annotations

IGNORE_DECORATORS = [
    "@router.*",  # FastAPI routes (APIRouter)
    "@app.*",  # FastAPI routes and exception handlers on the app
    "@model_validator",  # pydantic
    "@field_validator",
    "@upcaster",  # shared/contracts/events.py: an event's older data versions, found by subject and version
]

CALLED_BY_NAME = {
    ("gpuyard/__init__.py", "__getattr__"): "the module's own attributes, imported when used (PEP 562)",
    (
        "services/serving/entry.py",
        "capture_signals",
    ): "uvicorn.Server calls it (the service owns the signals)",
    ("services/submit/main.py", "capture_signals"): "uvicorn.Server calls it (the service owns the signals)",
    ("shared/runtime/servicemetrics.py", "log_message"): "http.server.BaseHTTPRequestHandler calls it",
    ("shared/runtime/upstream.py", "on_header"): "httptools' parser calls it (its protocol's callbacks)",
    ("shared/runtime/upstream.py", "on_headers_complete"): "httptools' parser calls it",
    ("shared/runtime/upstream.py", "on_body"): "httptools' parser calls it",
    ("shared/runtime/upstream.py", "on_message_complete"): "httptools' parser calls it",
    ("shared/runtime/servicemetrics.py", "do_GET"): "http.server.BaseHTTPRequestHandler calls it",
    (
        "services/serving/runtime.py",
        "output_names",
    ): "a parameter of the Session protocol (InferenceSession.run)",
    (
        "services/serving/runtime.py",
        "input_feed",
    ): "a parameter of the Session protocol (InferenceSession.run)",
}

PUBLIC_API = {
    ("gpuyard/training.py", "apply_gpu_memory_limit"): "a job's own code calls it (docs/executor.md)",
    ("gpuyard/training.py", "init_distributed"): "a job's own code calls it (gpuyard/training.py)",
    ("gpuyard/checkpoint.py", "load_latest"): "a job's own code calls it to resume (docs/storage.md)",
    ("gpuyard/checkpoint.py", "latest_step"): "a job's own code calls it (docs/storage.md)",
}

CHECKED_BY_TESTS = {
    # Definitions whose readers are the tests that hold the rest of the code to them.
    ("shared/contracts/jobstate.py", "fold"): "the pure fold of a job's events: the state machine's tests",
    (
        "shared/contracts/events/envelope.py",
        "missing_upcasters",
    ): "every older event version has its upcaster: a contract test",
    ("shared/bus/permissions.py", "publishers"): "the permission table read by subject: its tests",
    ("shared/bus/permissions.py", "NOT_PUBLISHED_YET"): "the permission table's tests",
    ("services/scheduler/handlers.py", "NOT_FOLLOWED"): "the job events it need not follow, and why: a test",
    ("shared/bus/metrics.py", "OUTCOMES"): "the label values of gpuyard_bus_events_handled: its tests",
    (
        "shared/contracts/jobspec.py",
        "REPLICA_START_BYTES",
    ): "what a replica's start fits in: the spec limits' tests",
}

PENDING = {
    # Dead, or read by tests or benchmarks only: for the owners of these files to remove (or move into the
    # tests that use them). The check fails once one is gone, until its entry is removed here too.
}

WHITELIST: dict[tuple[str, str], str] = CALLED_BY_NAME | PUBLIC_API | CHECKED_BY_TESTS | PENDING
