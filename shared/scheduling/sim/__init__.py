"""Trace simulator: replays GPU-cluster traces through the same scheduling core as the live service."""
