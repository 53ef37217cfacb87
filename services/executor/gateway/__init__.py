"""The executor gateway: the submit service's way into this node's running replicas (docs/access.md).

A small ASGI app (`app.py`) that the executor announcing its node serves (`server.py`) at the URL of its
heartbeat (`NodeHeartbeat.gateway`). Every request carries the platform's gateway token (`auth.py`); the submit
service checks the caller's tenant before it sends one. It runs a command in a replica (`session.py` over the
WebSocket protocol of `gpuyard.shared.contracts.api.access`, the process started by `localexec.py` on the local backend, through the pod
exec API on Kubernetes: `kubeaccess.py`) and forwards HTTP and WebSocket requests to a port a replica listens on
(`ports.py`). Which replica is which: `replicas.py` (the local backend's pid files) or the pods.
"""
