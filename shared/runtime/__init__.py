"""What every service process runs on: its start-up and shutdown (`service`), health and metrics endpoints, leadership, paths in the data directory, install hints."""
