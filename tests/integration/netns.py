"""Network namespaces for tests that play several machines on one host: each "machine" gets a namespace of its
own, joined to the host by a veth pair (the host's end 10.X.k.1, the machine's 10.X.k.2/24), so that it reaches
the platform only through that link, as a machine on the network would, and never the host's loopback.

Made with `ip netns` and `ip link`, as root only; `available()` says why not otherwise (the tests then run the
machines on loopback). Every namespace and link made is removed by `remove` (its veth pair goes with it)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def available() -> str | None:
    """None where this test process can make network namespaces; else why not."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"gyprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


@dataclass
class Netns:
    """One machine's namespace: `name`, the host's address on its link (`host_ip`), its own (`ip`)."""

    name: str
    host_link: str
    host_ip: str
    ip: str

    @classmethod
    def make(cls, number: int, subnet: int | None = None) -> Netns:
        """Namespace `number` of this test process (names unique to it; `subnet`: the second octet)."""
        subnet = subnet if subnet is not None else random.randrange(200, 250)
        tag = f"gy{os.getpid() % 100000}"
        ns = cls(f"{tag}n{number}", f"{tag}h{number}", f"10.{subnet}.{number}.1", f"10.{subnet}.{number}.2")
        inside = f"{tag}c{number}"
        steps = [
            ("netns", "add", ns.name),
            ("link", "add", ns.host_link, "type", "veth", "peer", "name", inside),
            ("link", "set", inside, "netns", ns.name),
            ("addr", "add", f"{ns.host_ip}/24", "dev", ns.host_link),
            ("link", "set", ns.host_link, "up"),
            ("-n", ns.name, "addr", "add", f"{ns.ip}/24", "dev", inside),
            ("-n", ns.name, "link", "set", inside, "up"),
            ("-n", ns.name, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                ns.remove()
                raise RuntimeError(f"ip {' '.join(step)}: {done.stderr.strip()}")
        return ns

    def argv(self, command: list[str]) -> list[str]:
        """`command` run inside the namespace (`ip netns exec` becomes the command: the same pid)."""
        return ["ip", "netns", "exec", self.name, *command]

    def remove(self) -> None:
        _ip("link", "del", self.host_link)  # (its peer, inside, goes with it)
        _ip("netns", "del", self.name)
