"""The web dashboard: pages served by the submit service at `/`, rendered in the browser from the same JSON API
the CLI uses (with a session cookie instead of a bearer token), live from the event stream (SSE)."""

from gpuyard.services.submit.dashboard.routes import add_dashboard

__all__ = ["add_dashboard"]
