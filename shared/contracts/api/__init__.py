"""The public API model: what the submit API answers, one model per answer, for the service, the CLI and the
dashboard alike.

The internal views (`gpuyard.shared.contracts.jobstate.JobView`) carry what the platform needs to run jobs (the store's version
counter, each replica's raw exit, a pending preemption as the event that asked for it, the log tail); users
rely only on what is here. `job_out` maps a view to its public form; `pending_text` is the one rendering of
a pending reason.

One module per resource, and `common` for what they share.
"""
