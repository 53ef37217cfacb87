"""The README's picture of the bus: which events each service publishes, into which stream, which streams each
one reads through its consumers, and which it hears live (core NATS subscriptions, dotted), drawn from the bus users' grants (`gpuyard.shared.bus.permissions.GRANTS`), the same table that
NATS enforces. `python -m gpuyard.docsgen.busdiagram` writes it into README.md between its two markers (`make
docs` does too); a test fails while the README's picture is not the grants'."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuyard.shared.bus.permissions import GRANTS, SERVICE_ROLES, Role
from gpuyard.shared.contracts.events.subjects import DEADLETTER_STREAM, STREAMS, StreamDef, Subject

BEGIN = "<!-- the bus, drawn from the bus users' grants by `python -m gpuyard.docsgen.busdiagram`: do not edit -->"
END = "<!-- end of the bus -->"
SHOWN = [stream for stream in STREAMS if stream is not DEADLETTER_STREAM]
"""The streams drawn (a consumer's dead letters are for an operator to read, not a flow between services)."""
NAMES = {Role.SUPERVISOR: "gpuyard up"}


def carries(stream: StreamDef, subject: Subject) -> bool:
    """Whether `stream` stores `subject`'s events (NATS wildcards: `*` one token, `>` the rest)."""
    tokens = subject.value.split(".")
    for pattern in stream.subjects:
        wanted = str(pattern).split(".")
        if wanted[-1] == ">" and len(tokens) >= len(wanted) and _same(wanted[:-1], tokens):
            return True
        if len(wanted) == len(tokens) and _same(wanted, tokens):
            return True
    return False


def _same(pattern: list[str], tokens: list[str]) -> bool:
    return all(p in ("*", t) for p, t in zip(pattern, tokens, strict=False))


def heard(stream: StreamDef, pattern: str) -> bool:
    """Whether a live subscription to `pattern` (core NATS, not a consumer of the stream) hears some of the
    events `stream` carries: they share a family (`job.>` and `job.placed`, `node.heartbeat` and itself)."""
    family = pattern.split(".")[0]
    return any(
        str(subject).split(".")[0] == family and _overlap(pattern, str(subject))
        for subject in stream.subjects
    )


def _overlap(a: str, b: str) -> bool:
    """Whether two subject patterns can match one subject."""
    x, y = a.split("."), b.split(".")
    for i in range(max(len(x), len(y))):
        if i < len(x) and x[i] == ">" or i < len(y) and y[i] == ">":
            return True
        if i >= len(x) or i >= len(y) or not (x[i] == y[i] or "*" in (x[i], y[i])):
            return False
    return True


def node(stream: StreamDef) -> str:
    return stream.name.removeprefix("GPUYARD_").lower()


def diagram() -> str:
    """The flowchart, in Mermaid."""
    lines = [
        "```mermaid",
        "flowchart LR",
        "  user([CLI / HTTP / dashboard]) -->|the API| submit",
        "  subgraph bus [NATS JetStream]",
        "    direction TB",
    ]
    lines += [f'    {node(s)}[["{s.name}: {", ".join(str(x) for x in s.subjects)}"]]' for s in SHOWN]
    lines.append("  end")
    for role in (*SERVICE_ROLES, Role.SUPERVISOR):
        if role in NAMES:
            lines.append(f'  {role.value}["{NAMES[role]}"]')
        for stream in SHOWN:
            published = sorted(s.value for s in GRANTS[role].publishes if carries(stream, s))
            if published:
                lines.append(f"  {role.value} -->|{', '.join(published)}| {node(stream)}")
    for role in SERVICE_ROLES:
        lines += [f"  {node(stream)} --> {role.value}" for stream in GRANTS[role].follows if stream in SHOWN]
        live = [stream for stream in SHOWN if any(heard(stream, pattern) for pattern in GRANTS[role].listens)]
        lines += [f"  {node(stream)} -. live .-> {role.value}" for stream in live]
    lines.append("  store[(event store: SQLite / MongoDB)]")
    lines += [f"  {role.value} <--> store" for role in SERVICE_ROLES]
    lines.append("```")
    return "\n".join(lines)


def block() -> str:
    return f"{BEGIN}\n{diagram()}\n{END}"


def written(text: str) -> str:
    """`text` (the README) with its picture of the bus made anew; ValueError when its markers are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no {BEGIN!r} … {END!r} block")
    return text[:start] + block() + text[end + len(END) :]


def main(readme: Path = Path(__file__).resolve().parents[2] / "README.md") -> int:
    try:
        readme.write_text(written(readme.read_text()))
    except (OSError, ValueError) as exc:
        print(f"busdiagram: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
