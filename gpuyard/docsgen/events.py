"""Generates docs/events.md from the event models: `python -m gpuyard.docsgen.events > docs/events.md`.

A test regenerates it and fails when the committed file has drifted from the code.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gpuyard.shared.contracts.events.alerts import (
    AlertKind,
    AlertRaised,
    AlertResolved,
    IdleStop,
    IdleWarning,
)
from gpuyard.shared.contracts.events.dev import DevActivity
from gpuyard.shared.contracts.events.envelope import REGISTRY, CloudEvent, type_of
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    GpuShare,
    JobCancelled,
    JobCancelRequested,
    JobCheckpointed,
    JobExecStarted,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    PendingReason,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.events.models import (
    ExecutionProvider,
    ModelDeleted,
    ModelFailed,
    ModelPublished,
    ModelReady,
    ModelVisibilityChanged,
    TensorSpec,
)
from gpuyard.shared.contracts.events.nodes import (
    EnvironmentRemoveRequested,
    GpuHealthChanged,
    GpuHolder,
    GpuInfo,
    GpuProcessUse,
    GpuReading,
    GpuSample,
    NodeAction,
    NodeControlChanged,
    NodeHeartbeat,
    NodeLost,
)
from gpuyard.shared.contracts.events.services import ProcessState, ServiceHeartbeat, ServiceStatus
from gpuyard.shared.contracts.events.subjects import STREAMS, Subject
from gpuyard.shared.contracts.events.volumes import (
    VolumeCreated,
    VolumeDeleted,
    VolumeFilesDeleted,
    VolumeFilesWritten,
)
from gpuyard.shared.contracts.jobspec import JobSpec, Resources
from gpuyard.shared.contracts.jobstate import TRANSITIONS
from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.contracts.stops import PreemptionCause

T = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
J = "5f0c2a9e1b7d4c11"
SPEC = JobSpec(name="resnet", command="python train.py", resources=Resources(gpus=1, cpus=4, memory="16GB"))
EXAMPLES = {
    Subject.JOB_SUBMITTED: JobSubmitted(job_id=J, name="resnet", tenant="vision", user="ana", spec=SPEC),
    Subject.JOB_PENDING: JobPending(
        job_id=J,
        attempt=1,
        reason=PendingReason(
            code=PendingCode.INSUFFICIENT_GPUS,
            message="needs 4 GPUs on one node; the largest free block is 2 (node-3)",
            details={"needed_per_replica": 4, "largest_free": 2, "node": "node-3"},
            position=3,
        ),
    ),
    Subject.JOB_PLACED: JobPlaced(
        job_id=J,
        attempt=1,
        placements=[
            ReplicaPlacement(
                replica=0,
                node="node-1",
                gpus=[GpuShare(index=2, uuid="GPU-8a1e…")],
                cpus=4,
                memory_bytes=16 * 10**9,
            )
        ],
        policy="gpuyard",
    ),
    Subject.JOB_STARTED: JobStarted(job_id=J, attempt=1, node="node-1", replicas=[0]),
    Subject.JOB_REPLICA_EXITED: JobReplicaExited(
        job_id=J,
        attempt=1,
        node="node-1",
        replica=0,
        exit_code=1,
        reason=FailureReason.EXIT_CODE,
        message="exited with code 1",
        log_tail=["Traceback (most recent call last):", "ValueError: bad batch"],
    ),
    Subject.JOB_SUCCEEDED: JobSucceeded(job_id=J, attempt=1),
    Subject.JOB_FAILED: JobFailed(
        job_id=J,
        attempt=1,
        reason=FailureReason.CUDA_OOM,
        message="replica 0: CUDA out of memory (seen in the log)",
        exit_code=1,
        replica=0,
    ),
    Subject.JOB_CANCEL_REQUESTED: JobCancelRequested(job_id=J, by="ana"),
    Subject.JOB_CANCELLED: JobCancelled(job_id=J, attempt=1, by="ana", message="cancelled while running"),
    Subject.JOB_PREEMPTED: JobPreempted(
        job_id=J,
        attempt=1,
        cause=PreemptionCause.RECLAIM,
        by_job="9a8b7c6d5e4f3a2b",
        grace_seconds=30,
        lost_work_seconds=754.0,
    ),
    Subject.JOB_REQUEUED: JobRequeued(
        job_id=J,
        attempt=2,
        reason=RequeueReason.RETRY,
        message="retry 1/3 after: exited with code 1",
        not_before=T,
        exit_code=1,
    ),
    Subject.JOB_CHECKPOINTED: JobCheckpointed(
        job_id=J,
        attempt=2,
        step=12000,
        size_bytes=1_234_567_890,
        saved_at=datetime(2026, 11, 1, 11, 59, 58, tzinfo=UTC),
    ),
    Subject.JOB_EXEC_STARTED: JobExecStarted(
        job_id=J, attempt=2, replica=0, node="node-1", by="ana", command=["nvidia-smi"], tty=False
    ),
    Subject.NODE_HEARTBEAT: NodeHeartbeat(
        node="node-1",
        gpus=[GpuInfo(index=0, uuid="GPU-8a1e…", model="H100", memory_bytes=80 * 2**30)],
        cpus=32,
        memory_bytes=256 * 2**30,
    ),
    Subject.NODE_LOST: NodeLost(node="node-1", last_seen=T, message="heartbeat lost"),
    Subject.NODE_GPU_HEALTH: GpuHealthChanged(
        node="node-1",
        index=1,
        uuid="GPU-8a1e…",
        reason="xid",
        message="fatal XID 79 (fallen off the bus)",
        xid=79,
    ),
    Subject.NODE_CONTROL: NodeControlChanged(
        node="node-1", gpu=1, action=NodeAction.CORDON, by="admin", reason="replacing the fan"
    ),
    Subject.NODE_ENVIRONMENT_REMOVE: EnvironmentRemoveRequested(
        node="node-1", key="3f2a9c0e1b7d4a5c6e8f", by="admin"
    ),
    Subject.GPU_SAMPLE: GpuSample(
        node="node-1",
        interval_seconds=1.0,
        gpus=[
            GpuReading(
                index=0,
                uuid="GPU-8a1e…",
                model="H100",
                pci_bus_id="00000000:1B:00.0",
                utilization_pct=87.0,
                memory_util_pct=41.0,
                memory_used_bytes=61 * 2**30,
                memory_total_bytes=80 * 2**30,
                temperature_c=64,
                power_w=512.5,
                power_limit_w=700,
                sm_clock_mhz=1980,
                memory_clock_mhz=2619,
                ecc_corrected=0,
                ecc_uncorrected=0,
                processes=[GpuProcessUse(pid=48213, used_bytes=61 * 2**30)],
                holders=[GpuHolder(job_id=J, tenant="vision", user="ana")],
            )
        ],
    ),
    Subject.SERVICE_HEARTBEAT: ServiceHeartbeat(
        service="scheduler",
        instance="host-1234",
        pid=1234,
        host="host",
        started_at=T,
        version="0.1.0",
        metrics="http://host:9410/metrics",
    ),
    Subject.SERVICE_STATUS: ServiceStatus(
        service="scheduler",
        process="scheduler",
        host="host",
        pid=1300,
        state=ProcessState.CRASH_LOOPING,
        restarts=3,
        exit_code=1,
        last_error="ERROR gpuyard.service: scheduler cannot start: the event store cannot be reached",
        version="0.1.0",
    ),
    Subject.MODEL_PUBLISHED: ModelPublished(
        name="resnet",
        version=3,
        tenant="vision",
        uri="s3://models/vision/resnet/3/" + "9f86d081884c7d65" * 4 + ".onnx",
        sha256="9f86d081884c7d65" * 4,
        size_bytes=102_400_000,
        inputs=[TensorSpec(name="images", datatype="FP32", shape=[-1, 3, 224, 224])],
        outputs=[TensorSpec(name="logits", datatype="FP32", shape=[-1, 1000])],
        job_id=J,
    ),
    Subject.MODEL_VISIBILITY_CHANGED: ModelVisibilityChanged(
        name="resnet", tenant="vision", public=True, by="ana"
    ),
    Subject.MODEL_DELETED: ModelDeleted(name="resnet", tenant="vision", versions=[1, 2], by="ana"),
    Subject.MODEL_READY: ModelReady(
        name="resnet",
        tenant="vision",
        version=3,
        job_id="7a1e4c0b9d2f6e35",
        node="node-1",
        endpoint="http://10.0.0.7:8000",
        provider=ExecutionProvider.CUDA,
        device=0,
    ),
    Subject.MODEL_FAILED: ModelFailed(
        name="resnet",
        tenant="vision",
        version=4,
        job_id="c3b8e1f07a5d9246",
        node="node-1",
        reason="checksum_mismatch",
        message="the file's sha256 is 2c26b46b…, not the published 9f86d081…: not loaded",
    ),
    Subject.VOLUME_CREATED: VolumeCreated(name="imagenet", tenant="vision", size_bytes=50 * 10**9, by="ana"),
    Subject.VOLUME_FILES_WRITTEN: VolumeFilesWritten(
        name="imagenet", tenant="vision", path="train", files=12_811, bytes=1_281_167_000, by="ana"
    ),
    Subject.VOLUME_FILES_DELETED: VolumeFilesDeleted(
        name="imagenet", tenant="vision", path="train/tmp", files=3, bytes=4_096, by="ana"
    ),
    Subject.VOLUME_DELETED: VolumeDeleted(name="imagenet", tenant="vision", bytes=1_281_167_000, by="ana"),
    Subject.ALERT_RAISED: AlertRaised(
        alert_id=f"{AlertKind.GPU_IDLE}/node-1/2",
        kind=AlertKind.GPU_IDLE,
        message="GPU 2 on node-1 is allocated to job 5f0c… but has been idle for 15 min",
        node="node-1",
        gpu_index=2,
        job_id=J,
        tenant="vision",
        user="ana",
        value=15,
        threshold=10,
    ),
    Subject.ALERT_RESOLVED: AlertResolved(
        alert_id=f"{AlertKind.GPU_IDLE}/node-1/2",
        kind=AlertKind.GPU_IDLE,
        message="busy again",
        tenant="vision",
    ),
    Subject.IDLE_WARNING: IdleWarning(
        job_id="8f14e45fceea167a5a36dedd4bea2543",
        attempt=1,
        tenant="vision",
        user="ana",
        threshold_pct=5,
        window_seconds=1800,
        max_utilization_pct=1.2,
        message="GPUs below 5% for 30m (highest 1.2%); stopping in 10m unless they get busy",
        grace_seconds=600,
        stop_at=datetime(2026, 11, 1, 12, 10, tzinfo=UTC),
    ),
    Subject.IDLE_STOP: IdleStop(
        job_id="8f14e45fceea167a5a36dedd4bea2543",
        attempt=1,
        tenant="vision",
        user="ana",
        threshold_pct=5,
        window_seconds=1800,
        max_utilization_pct=1.2,
        message="stopped for idle GPUs: every sample under 5% utilization for 40m (idle timeout 30m, grace "
        "10m; highest 1.2% over the last 30m)",
        idle_seconds=2400,
    ),
    Subject.DEV_ACTIVITY: DevActivity(
        job_id="8f14e45fceea167a5a36dedd4bea2543",
        attempt=1,
        tenant="vision",
        at=datetime(2026, 11, 1, 12, 5, tzinfo=UTC),
    ),
}

HEADER = """# GPUYARD events

<!-- Generated by `python -m gpuyard.docsgen.events > docs/events.md` from shared/contracts/events/. Do not edit by hand:
     tests/unit/gpuyard/docsgen/test_eventdocs.py fails when this file drifts from the code. -->

Every state change in GPUYARD is an event on NATS JetStream. Outside tools can subscribe to them directly
(NATS) or through the submit API's Server-Sent Events endpoint, `GET /v1/events/stream?subject=job.>`.

**NATS subjects.** A job event is published on its subject below followed by its job's tenant:
`job.placed.vision` (every tenant's: `job.placed.*`; all of one tenant's: `job.*.vision`, what the read-only
user of one tenant, `gpuyard admin bus-user --tenant vision`, may subscribe to). Other events are published
on their subject as it is (`node.lost`, `gpu.sample`). The `type` never carries the tenant.

## Envelope: CloudEvents 1.0, structured mode

Each message's payload is the whole event as JSON (`Content-Type: application/cloudevents+json`), as the
CloudEvents NATS protocol binding describes for *structured* content mode. We chose structured mode so that an
event read from a stream, a dead-letter queue, the event store or an SSE stream is the same self-contained
document. Attributes:

| attribute | meaning |
|---|---|
| `specversion` | always `1.0` |
| `id` | unique event id; also the `Nats-Msg-Id` header (JetStream de-duplicates a re-published event) |
| `source` | `/gpuyard/<service>/<instance>` that recorded the event |
| `type` | `io.gpuyard.` + the event's subject (without a tenant), e.g. `io.gpuyard.job.placed` |
| `subject` | the entity: the job id for job events, the node for node events, the model name… |
| `time` | when the event was recorded (RFC 3339, UTC) |
| `datacontenttype` | `application/json` |
| `dataversion` | the version of `data`'s schema (an extension attribute; absent means 1), see below |
| `data` | the payload; its schema per type is below |

## Versions of the data

Each event type's `data` has a version, starting at 1 and shown with each event below. A change of a model
bumps its version by one and comes with an *upcaster* for the step: a function that turns the `data` of the
old version into the new one (a renamed field renamed, an added one given its value for old events),
registered next to the model in `shared/contracts/events/` (`@event(Subject.X, version=2)` and
`@upcaster(Subject.X, from_version=1)`). Every event GPUYARD reads (from the event store, the bus, the API) is
upgraded step by step to the version its code knows, so a store written by an older release reads as if
written today, and an event without `dataversion` (as every release before versions wrote them) is version 1.
An event of a version newer than the reader's model is refused with an error naming both versions, never
misread: a consumer dead-letters it (see below), a read from the store fails. Outside consumers should do the
same: check `dataversion` against the version they were written for.

## Delivery and ordering guarantees

- **At least once.** Consumers are durable JetStream pull consumers with explicit acks; an event is acked only
  after its effect is stored, so a crash means redelivery, never loss. Every GPUYARD consumer is idempotent:
  lifecycle events have deterministic ids (job, attempt, kind), the event store refuses a second event with the
  same id, and the state machine refuses transitions that already happened. Do the same in your consumers:
  de-duplicate on `id`.
- **Publish de-duplication.** A publisher that retries sends the same `Nats-Msg-Id`; JetStream drops the
  duplicate within the stream's duplicate window (10 minutes for events).
- **Order.** Events of one job are recorded with consecutive versions in the event store (optimistic
  concurrency: a writer must name the version it read); they are published in that order, and the message's
  `Gpuyard-Version` header carries the version. Across jobs there is no order. An event whose first publish
  failed arrives later, from the outbox relay (without the header): a consumer that needs strict order per job
  compares versions, and reads `GET /v1/jobs/{id}/events` (each event with its version, the authoritative
  history) when it sees a gap.
- **Headers to filter on without decoding.** `Gpuyard-Entity` names a job event's job, and a `job.placed`
  carries `Gpuyard-Holder`: `executor` for processes, `serving` for a serve job's model sessions (its
  `serving` field). A consumer that needs only some events may pass over the others by these headers.
- **Outbox.** An event is stored first, then published. Publishers do not wait for each acknowledgement
  before going on; an event that JetStream has not acknowledged a few seconds after it was stored, or whose
  publisher died before publishing it, is published again by an outbox relay (same id, so no duplicate
  reaches consumers).
- **Poison events.** After 5 failed deliveries (or at once, if it cannot be parsed) an event goes to
  `deadletter.<consumer>` with the error in headers (`Gpuyard-Error`, `Gpuyard-Original-Subject`, …) and the
  consumer moves on. Admins list them with `GET /v1/deadletters`.

## Streams
"""


def render() -> str:
    parts = [HEADER]
    parts.append("| stream | subjects | kept | duplicate window |\n|---|---|---|---|")
    for s in STREAMS:
        parts.append(
            f"| `{s.name}` | {', '.join(f'`{x}`' for x in s.subjects)} | {s.max_age_seconds / 3600:g} h |"
            f" {s.duplicate_window_seconds:g} s |"
        )
    parts.append("\n## Job state machine\n")
    parts.append("| event | allowed in states | leads to |\n|---|---|---|")
    parts.append("| `job.submitted` | (new job) | queued |")
    for subject, (allowed, target) in TRANSITIONS.items():
        parts.append(
            f"| `{subject.value}` | {', '.join(sorted(s.value for s in allowed))} | {target.value if target else '(same)'} |"
        )
    parts.append(
        "\nEvents carrying an `attempt` must name the job's current attempt (`job.requeued` names the next one);"
        " others are refused as stale.\n"
    )
    parts.append(pending_codes())
    parts.append("## Events\n")
    for subject, model in sorted(REGISTRY.items(), key=lambda item: list(Subject).index(item[0])):
        doc = (model.__doc__ or "").strip()
        example = CloudEvent(
            id="0d9f8e7a6b5c4d3e2f1a0b9c8d7e6f5a",
            source="/gpuyard/scheduler/host-1234",
            type=type_of(subject),
            subject=EXAMPLES[subject].entity(),
            time=T,
            data=EXAMPLES[subject],
        )
        schema = model.model_json_schema()
        parts.append(f"### `{subject.value}`\n")
        if doc and not doc.startswith("Base of every"):
            parts.append(doc + "\n")
        parts.append(f"Data version {model.schema_version}.\n")
        parts.append("Example:\n\n```json\n" + json.dumps(example.to_dict(), indent=2) + "\n```\n")
        parts.append(
            "<details><summary>JSON Schema of <code>data</code></summary>\n\n```json\n"
            + json.dumps(schema, indent=2)
            + "\n```\n</details>\n"
        )
    return "\n".join(parts)


def pending_codes() -> str:
    """The closed set of `job.pending` reason codes, worst first (`gpuyard.shared.contracts.reasons.PendingCode`)."""
    rows = [
        f"| `{code.value}` | {code.rank.name} | {code.meaning} |"
        for code in sorted(PendingCode, key=lambda c: (c.rank, c.value))
    ]
    return (
        "## Pending reason codes\n\n"
        "`job.pending` says why a job waits with one of these codes (`data.reason.code`). The rank says how close"
        " the job is to running: NO_FIT (nothing the scheduler does now places it) < PREEMPT (room is being made)"
        " < FIT (it would fit but waits its turn); of several reasons, the one of lowest (rank, code) is shown.\n\n"
        "| code | rank | meaning |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    print(render(), end="")
