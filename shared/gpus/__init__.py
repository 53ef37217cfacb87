"""The GPUs of a node: read through NVML (`nvml`), or simulated where there is none (`inventory`)."""
