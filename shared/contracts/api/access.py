"""The exec protocol over one WebSocket, the same between the caller and the submit service and between the
submit service and the gateway (docs/access.md, "The exec protocol"):

- the caller's first frame is a text frame of JSON, `ExecStart`: the command (`argv`; none with a terminal:
  the replica's login shell), the terminal's size, whether its input follows;
- then binary frames carry data, their first byte naming the stream: 0 the command's input (caller to
  command), 1 its output, 2 its errors (a terminal's output is all 1);
- text frames of JSON carry control: `{"resize": [cols, rows]}` and `{"eof": true}` from the caller;
  `{"exit": code}` (128 + N for a command ended by signal N) or `{"error": "..."}` from the other side, which
  then closes the WebSocket."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

STDIN, STDOUT, STDERR = 0, 1, 2
MAX_ARGV = 256
MAX_ARG_BYTES = 64 * 1024
DEFAULT_SIZE = (80, 24)
MAX_SIZE = 10_000


class ProtocolError(ValueError):
    """A frame that does not follow the protocol; the message says why."""


@dataclass(frozen=True)
class ExecStart:
    argv: list[str] = field(default_factory=list)
    size: tuple[int, int] = DEFAULT_SIZE
    stdin: bool = False
    term: str = "xterm-256color"

    def to_json(self) -> str:
        return json.dumps(
            {"argv": self.argv, "size": list(self.size), "stdin": self.stdin, "term": self.term}
        )

    @property
    def words(self) -> str:
        """What runs, as an audit names it: the argv, or "shell"."""
        return " ".join(self.argv) if self.argv else "shell"


def _size(value: object) -> tuple[int, int]:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_SIZE for v in value)
    ):
        raise ProtocolError(f"a terminal size is [cols, rows], two whole numbers from 1 to {MAX_SIZE}")
    return int(value[0]), int(value[1])


def _object(text: str) -> dict:
    try:
        doc = json.loads(text)
    except ValueError:
        raise ProtocolError("a text frame is a JSON object") from None
    if not isinstance(doc, dict):
        raise ProtocolError("a text frame is a JSON object")
    return doc


def parse_start(text: str, *, tty: bool) -> ExecStart:
    """The caller's first frame; ProtocolError when it is not one."""
    doc = _object(text)
    argv = doc.get("argv", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ProtocolError("argv is a list of strings")
    if len(argv) > MAX_ARGV or sum(len(a.encode()) for a in argv) > MAX_ARG_BYTES:
        raise ProtocolError(f"argv is at most {MAX_ARGV} arguments of {MAX_ARG_BYTES} bytes together")
    if any("\x00" in a for a in argv):
        raise ProtocolError("an argument holds a NUL byte")
    if not argv and not tty:
        raise ProtocolError("a command to run (argv): only a terminal (tty=1) starts a shell by itself")
    term = doc.get("term", "xterm-256color")
    if not isinstance(term, str) or not term.isascii() or not 0 < len(term) <= 64 or not term.isprintable():
        raise ProtocolError("term is a terminal type, such as xterm-256color")
    return ExecStart(
        argv=argv,
        size=_size(doc["size"]) if "size" in doc else DEFAULT_SIZE,
        stdin=bool(doc.get("stdin", tty)),
        term=term,
    )


@dataclass(frozen=True)
class Control:
    resize: tuple[int, int] | None = None
    eof: bool = False


def parse_control(text: str) -> Control:
    """A control frame from the caller: a resize or the end of its input."""
    doc = _object(text)
    if "resize" in doc:
        return Control(resize=_size(doc["resize"]))
    if doc.get("eof") is True:
        return Control(eof=True)
    raise ProtocolError('a control frame is {"resize": [cols, rows]} or {"eof": true}')


def data_frame(stream: int, data: bytes) -> bytes:
    return bytes((stream,)) + data


def exit_frame(code: int) -> str:
    return json.dumps({"exit": code})


def error_frame(message: str) -> str:
    return json.dumps({"error": message})


def exit_code(returncode: int) -> int:
    """A process's exit as a shell says it: its code, or 128 + N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode
