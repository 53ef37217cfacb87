"""The API's models of job environments (`/v1/environments`, docs/environments.md): what each node holds."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpuyard.shared.contracts.events.nodes import NodeEnvironment


class EnvironmentOut(NodeEnvironment):
    """One environment on one node (the same key on two nodes: two entries)."""

    node: str


class NodePythonsOut(BaseModel):
    node: str
    pythons: list[str] = Field(default_factory=list, description="The Python versions it builds for.")


class EnvironmentListOut(BaseModel):
    items: list[EnvironmentOut]
    nodes: list[NodePythonsOut] = Field(
        default_factory=list, description="Each node heard from lately, with the Python versions it offers."
    )


class EnvironmentRemovedOut(BaseModel):
    key: str
    nodes: list[str] = Field(..., description="The nodes told to remove it.")
    size_bytes: int = Field(0, description="What it held on them together.")
