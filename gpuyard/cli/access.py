"""`gpuyard exec JOB [--replica N] -- CMD…`, `gpuyard shell JOB [--replica N]` and `gpuyard port-forward JOB PORT
[--local LPORT]`: into a running job through the platform (docs/access.md), on `gpuyard.access`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import termios
import tty

from gpuyard.access import AccessError, ExecSession, PortForward, exec_command
from gpuyard.cli.common import CliError, api_client, err, out
from gpuyard.cli.jobs import JOB_ARGUMENT
from gpuyard.shared.contracts.api.access import STDOUT, ExecStart
from gpuyard.shared.contracts.jobstate import JobState

REPLICA_HELP = "which replica (default 0)"


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    run = sub.add_parser(
        "exec",
        help="run a command in a running job (its directory, environment, user, GPUs); exits with its code",
        parents=[common],
    )
    run.add_argument("job", help=JOB_ARGUMENT)
    run.add_argument("--replica", type=int, default=0, metavar="N", help=REPLICA_HELP)
    run.add_argument("-i", "--stdin", action="store_true", help="pass this command's input on to it")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its arguments")
    run.set_defaults(func=cmd_exec, options=exec_options(common))
    shell = sub.add_parser("shell", help="an interactive terminal in a running job", parents=[common])
    shell.add_argument("job", help=JOB_ARGUMENT)
    shell.add_argument("--replica", type=int, default=0, metavar="N", help=REPLICA_HELP)
    shell.set_defaults(func=cmd_shell)
    forward = sub.add_parser(
        "port-forward",
        help="reach a port of a running job (one its spec lists in `ports`) at a local port",
        parents=[common],
    )
    forward.add_argument("job", help=JOB_ARGUMENT)
    forward.add_argument("port", type=int, help="the job's port")
    forward.add_argument(
        "--local", type=int, default=None, metavar="LPORT", help="the local port (default: PORT)"
    )
    forward.add_argument("--address", default="127.0.0.1", help="the local address (default 127.0.0.1)")
    forward.add_argument("--replica", type=int, default=0, metavar="N", help=REPLICA_HELP)
    forward.set_defaults(func=cmd_port_forward)


def exec_options(common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of `exec` given after its JOB (before the `--` that starts its command)."""
    options = argparse.ArgumentParser(prog="gpuyard exec JOB", parents=[common], add_help=False)
    options.add_argument("--replica", type=int, metavar="N")
    options.add_argument("-i", "--stdin", action="store_true", default=None)
    return options


def command_of(args: argparse.Namespace) -> list[str]:
    """The command after `--` (options of `exec` before it, after JOB, are read into `args`), or all of what
    follows JOB when there is no `--`."""
    argv = list(args.cmd)
    if "--" in argv:
        cut = argv.index("--")
        head, argv = argv[:cut], argv[cut + 1 :]
        given, unknown = args.options.parse_known_args(head)
        if unknown:
            raise CliError(f"unknown options before --: {' '.join(unknown)}")
        for name, value in vars(given).items():
            if value is not None and value is not False:
                setattr(args, name, value)
    if not argv:
        raise CliError("give the command after --: gpuyard exec JOB -- CMD [ARG…]")
    return argv


def write_output(stream: int, data: bytes) -> None:
    target = sys.stdout.buffer if stream == STDOUT else sys.stderr.buffer
    target.write(data)
    target.flush()


def cmd_exec(args: argparse.Namespace) -> int:
    argv = command_of(args)
    client = api_client(args)
    try:
        if args.stdin:
            return asyncio.run(exec_with_input(client.server, client.token, args.job, argv, args.replica))
        return asyncio.run(
            exec_command(
                client.server, client.token, args.job, argv, replica=args.replica, on_output=write_output
            )
        )
    except AccessError as exc:
        raise CliError(str(exc)) from None


async def exec_with_input(server: str, token: str | None, job: str, argv: list[str], replica: int) -> int:
    """`exec -i`: this command's input passed on, then its end."""
    session = await ExecSession.open(server, token, job, ExecStart(argv=argv, stdin=True), replica=replica)

    async def feed() -> None:
        while data := await asyncio.to_thread(os.read, sys.stdin.fileno(), 65536):
            await session.send_input(data)
        await session.eof()

    feeding = asyncio.create_task(feed())
    try:
        async for stream, data in session.output():
            write_output(stream, data)
    finally:
        feeding.cancel()
        await session.close()
    assert session.exit_code is not None
    return session.exit_code


def cmd_shell(args: argparse.Namespace) -> int:
    client = api_client(args)
    try:
        return asyncio.run(shell(client.server, client.token, args.job, args.replica))
    except AccessError as exc:
        raise CliError(str(exc)) from None


@contextlib.contextmanager
def raw_terminal(fd: int):
    """The terminal in raw mode (every key goes to the job's terminal, Ctrl-C included), restored after."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)  # (what was typed before the shell came is kept for it)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def shell(server: str, token: str | None, job: str, replica: int) -> int:
    cols, rows = shutil.get_terminal_size()
    start = ExecStart(argv=[], size=(cols, rows), stdin=True, term=os.environ.get("TERM") or "xterm-256color")
    session = await ExecSession.open(server, token, job, start, replica=replica, tty=True)
    loop = asyncio.get_running_loop()
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    pending: set[asyncio.Task] = set()

    def later(coro) -> None:
        task = loop.create_task(coro)
        pending.add(task)
        task.add_done_callback(pending.discard)

    def typed() -> None:
        data = os.read(fd_in, 65536)
        if not data:
            loop.remove_reader(fd_in)
            later(session.eof())
            return
        later(session.send_input(data))

    def resized() -> None:
        later(session.resize(*shutil.get_terminal_size()))

    with raw_terminal(fd_in):
        loop.add_reader(fd_in, typed)
        loop.add_signal_handler(signal.SIGWINCH, resized)
        try:
            async for _, data in session.output():
                os.write(fd_out, data)
        finally:
            loop.remove_reader(fd_in)
            loop.remove_signal_handler(signal.SIGWINCH)
            await session.close()
    assert session.exit_code is not None
    return session.exit_code


def cmd_port_forward(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536 or (args.local is not None and not 0 <= args.local < 65536):
        raise CliError("a port is a number from 1 to 65535")
    client = api_client(args)
    job = client.job(args.job)
    if job.state is not JobState.RUNNING:
        raise CliError(f"job {job.job_id} is {job.state.value}: only a running job's ports can be reached")
    if args.port not in job.spec.ports:
        listed = ", ".join(map(str, job.spec.ports)) or "none"
        raise CliError(f"job {job.job_id} does not list port {args.port} in its ports (it lists: {listed})")
    local = args.port if args.local is None else args.local
    return asyncio.run(forward(client.server, client.token, job.job_id, args, local))


async def forward(server: str, token: str | None, job_id: str, args: argparse.Namespace, local: int) -> int:
    forwarder = PortForward(server, token, job_id, args.port, replica=args.replica)
    try:
        bound = await forwarder.start(args.address, local)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.address}:{local}: {exc.strerror or exc}") from None
    host = f"[{args.address}]" if ":" in args.address else args.address
    out.print(f"Forwarding http://{host}:{bound}/ to job {job_id} port {args.port} (Ctrl-C to stop)")
    err.print("", end="")
    try:
        await asyncio.Event().wait()
    finally:
        await forwarder.close()
    return 0
