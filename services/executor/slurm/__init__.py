"""The executor's Slurm backend: one executor serves a Slurm cluster (docs/executor.md, "Slurm").

`queue.py` reads Slurm's job queue, `cluster.py` its nodes (pure: command output in, records out);
`logs.py` copies the batch jobs' output into the replicas' logs;
`commands.py` runs Slurm's commands; `batch.py` makes a replica's batch job; `storage.py` gives it its job's
checkpoint and output folders and volumes; `outcomes.py` says what a batch job's state means for its replica;
`backend.py` drives them through the executor's `Backend` interface.
"""
