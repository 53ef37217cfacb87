"""The contracts: the events on the bus, the job spec, the job state machine, the reasons a job waits or stops, the public API's models, and the units they use. No I/O."""
