"""The stores: the event store that drives the job state machine (`events`), the job ledger on top of it, the log store, the GPU history, and the read models kept beside the jobs (`readmodels`)."""
