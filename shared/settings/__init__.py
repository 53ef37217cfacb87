"""Settings of every service and of the CLI client: one pydantic-settings model each, read from GPUYARD_*
environment variables and, for the services, the same names as flags (`--cycle-interval 0.5`), flags first.

Each default and each description is written once, here: `gpuyard up`'s flags, the services and the settings
tables of docs/operations.md (`python -m gpuyard.docsgen.settings`) all take them from these models (one module per service, `common` for what they share). Nothing else in
the project reads os.environ for configuration."""
