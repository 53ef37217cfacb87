"""The bus: the Bus, its connection, streams and publishing (`jetstream`), durable pull consumers (`consumers`),
ordered watches (`watches`), what a message's headers say (`headers`), dead letters (`deadletters`), publishing
what the event store holds (`outbox`), the bus users' permissions and credentials, and what the consumers do as
Prometheus figures (`metrics`)."""
