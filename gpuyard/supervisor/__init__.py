"""The supervisor: `gpuyard up`, the one program that starts the platform's services on one machine, with the bus's configuration, the status it reports, the ports it checks, and backups."""
