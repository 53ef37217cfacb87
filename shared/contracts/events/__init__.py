"""Every event GPUYard publishes: one pydantic model per subject, one registry, one envelope.

Events travel over NATS as CloudEvents 1.0 in *structured* content mode (the NATS protocol binding):
the message payload is the whole event as JSON (`application/cloudevents+json`), and the `Nats-Msg-Id`
header carries the event id so that JetStream de-duplicates a retried publish.

The NATS subject and the CloudEvents `type` come from one definition: type = "io.gpuyard." + subject.
The CloudEvents `subject` attribute names the entity: the job id for job events, the node for node events.
A job event travels on its subject followed by its job's tenant, `job.placed.vision` (`subject_of`), so that
NATS permissions can give a reader one tenant's events (`job.*.vision`); its `type` does not carry the tenant.

Versions: every event model has a version (`@event(subject, version=N)`, 1 by default), carried in the
envelope's `dataversion` extension attribute (an event without it is version 1). When a model changes, its
version goes up by one and an upcaster for the step (`@upcaster(subject, from_version=N-1)`, a function on
the raw `data` dict, written next to the model) upgrades what was stored or sent before; every event parsed
into a `CloudEvent` (from the store, the bus, an API) is upgraded on the way in, and one newer than the
reader's model is refused (`EventVersionError`) rather than misread.

One module per family; importing any of them registers every event model (this package imports them all).
"""

from gpuyard.shared.contracts.events import alerts, dev, jobs, models, nodes, services, volumes  # noqa: F401  (registers them)
