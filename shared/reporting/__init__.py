"""What the platform reports to people, computed from the public views: why a job waits, GPU-hours used, what each tenant's jobs hold of its quota."""
