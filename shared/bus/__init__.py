"""The bus: JetStream streams and consumers (`jetstream`), the bus users' permissions and credentials, and what the consumers do as Prometheus figures."""
