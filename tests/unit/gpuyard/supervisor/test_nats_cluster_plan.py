"""`gpuyard up --nats-cluster 3`: three nats-servers of one JetStream cluster, each with its own name, store,
pid file and client and route ports, routes authenticated; every service given every server and streams of
three replicas; a cluster of two refused; every port checked before anything starts."""

from __future__ import annotations

import argparse
import re

import pytest

from gpuyard.shared.bus.credentials import read_credentials
from gpuyard.supervisor import busconfig, natsserver
from gpuyard.supervisor.child import Child
from gpuyard.supervisor.options import UpOptions, add_arguments
from gpuyard.supervisor.plan import plan
from gpuyard.supervisor.portplan import check_port_flags, nats_ports
from gpuyard.supervisor.ports import free_ports
from gpuyard.supervisor.supervision import is_nats


def options(*argv: str) -> UpOptions:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return UpOptions.from_args(parser.parse_args(list(argv)))


def test_the_cluster_flag_gives_every_server_its_ports_and_the_services_every_url(monkeypatch):
    monkeypatch.delenv("GPUYARD_STREAM_REPLICAS", raising=False)
    opts = options("--nats-port", "14222", "--nats-cluster", "3")
    assert opts.nats_ports == [14222, 14223, 14224] and opts.route_ports == [16222, 16223, 16224]
    assert opts.nats_url("0.0.0.0") == "nats://127.0.0.1:14222,nats://127.0.0.1:14223,nats://127.0.0.1:14224"
    assert opts.given["stream_replicas"] == "3"
    single = options("--nats-port", "14222")
    assert single.nats_ports == [14222] and single.route_ports == [] and "stream_replicas" not in single.given
    assert single.nats_url("127.0.0.1") == "nats://127.0.0.1:14222"


def test_replicas_the_environment_names_are_kept(monkeypatch):
    monkeypatch.setenv("GPUYARD_STREAM_REPLICAS", "1")
    assert "stream_replicas" not in options("--nats-cluster", "3").given


@pytest.mark.parametrize("servers", [0, 2])
def test_a_cluster_without_a_majority_to_lose_is_refused_in_one_line(servers):
    with pytest.raises(SystemExit, match=r"--nats-cluster \d: 1 \(one server\) or 3 and more"):
        check_port_flags(options("--nats-cluster", str(servers)))


def test_a_first_port_too_high_for_the_route_ports_is_refused():
    with pytest.raises(SystemExit, match="is not a port for 3 servers: 1 to 63533"):
        check_port_flags(options("--nats-port", "63534", "--nats-cluster", "3"))
    check_port_flags(options("--nats-port", "63533", "--nats-cluster", "3"))


def test_every_server_and_route_port_is_checked_before_anything_starts():
    wanted = nats_ports("0.0.0.0", options("--nats-port", "14222", "--nats-cluster", "3"))
    assert [(w.what, w.host, w.port) for w in wanted] == [
        ("NATS server 1", "0.0.0.0", 14222),
        ("NATS server 2", "0.0.0.0", 14223),
        ("NATS server 3", "0.0.0.0", 14224),
        ("the routes of NATS server 1", "127.0.0.1", 16222),
        ("the routes of NATS server 2", "127.0.0.1", 16223),
        ("the routes of NATS server 3", "127.0.0.1", 16224),
    ]
    assert [w.what for w in nats_ports("127.0.0.1", options("--nats-port", "14222"))] == ["NATS"]


def test_each_server_runs_with_its_own_name_store_pid_file_and_authenticated_routes(tmp_path, monkeypatch):
    monkeypatch.setattr(natsserver, "nats_server_binary", lambda: "/usr/bin/nats-server")
    opts = options("--nats-port", "14222", "--nats-cluster", "3")
    children = natsserver.nats_children(tmp_path, "127.0.0.1", opts, {})
    assert [c.name for c in children] == ["nats", "nats-2", "nats-3"]
    assert {c.service for c in children} == {"nats"} and all(is_nats(c) for c in children)
    assert not is_nats(Child("executor-1", [], {}, service="executor"))  # (a service, stopped before them)
    route = read_credentials(tmp_path / "bus" / "route.json")
    for number, child in enumerate(children, start=1):
        argv = child.argv
        assert argv[argv.index("--port") + 1] == str(14221 + number)
        assert argv[argv.index("--store_dir") + 1] == str(natsserver.nats_store(tmp_path, number))
        assert argv[argv.index("--pid") + 1] == str(busconfig.pid_path(tmp_path, number))
        config = busconfig.up_config_path(tmp_path, number).read_text()
        assert argv[argv.index("--config") + 1] == str(busconfig.up_config_path(tmp_path, number))
        assert f'server_name: "gpuyard-{number}"' in config and 'include "nats.conf"' in config
        assert f'listen: "127.0.0.1:{16221 + number}"' in config
        routes = re.search(r"routes: \[(.*)\]", config).group(1)
        others = [16222 + k for k in range(3) if k != number - 1]
        assert routes == ", ".join(f'"nats://route:{route.password}@127.0.0.1:{p}"' for p in others)
        assert f'authorization {{ user: "route", password: "{route.password}" }}' in config
    assert len({natsserver.nats_store(tmp_path, n) for n in (1, 2, 3)}) == 3


def test_a_single_server_runs_as_before(tmp_path, monkeypatch):
    monkeypatch.setattr(natsserver, "nats_server_binary", lambda: "/usr/bin/nats-server")
    (child,) = natsserver.nats_children(tmp_path, "127.0.0.1", options("--nats-port", "14222"), {})
    assert child.name == "nats" and child.argv[child.argv.index("--store_dir") + 1] == str(tmp_path / "nats")
    config = (tmp_path / "bus" / "up.conf").read_text()
    assert 'server_name: "gpuyard"' in config and "cluster" not in config
    assert child.argv[child.argv.index("--pid") + 1] == str(tmp_path / "bus" / "nats.pid")


def test_every_service_is_given_every_server(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYARD_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("GPUYARD_STREAM_REPLICAS", raising=False)
    monkeypatch.delenv("GPUYARD_NATS_URL", raising=False)
    api, serving, monitor = free_ports("127.0.0.1", 3)
    argv = ["--data-dir", str(tmp_path / "data"), "--port", str(api), "--serving-port", str(serving)]
    opts = options(*argv, "--monitor-port", str(monitor), "--nats-port", "14222", "--nats-cluster", "3")
    platform = plan(opts, {})
    for name, settings in platform.settings.items():
        assert settings.nats_servers == [f"nats://127.0.0.1:{14222 + k}" for k in range(3)], name
        assert settings.stream_replicas == 3, name
    assert {w.port for w in platform.ports} >= {14222, 14223, 14224, 16222, 16223, 16224}
