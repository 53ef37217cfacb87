"""Read models, each written by one service and read by others: alerts, the model registry, node controls (cordon, drain), idle jobs, the waiting line."""
