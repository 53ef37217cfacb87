"""The reaper (`services/executor/reaper/`) starts a replica's process as Popen would (same session,
descriptors, signals, directory and environment, the command found on the environment's PATH), says which
step of a start failed, writes each end to the replica's exit file even after its executor is gone, and lets
nothing of a replica outlive its first process. Its first process makes the replica's folders (their modes and
owners, one already there kept, given or refused) and, in a mount namespace of its own, binds folders,
read-only where asked. Each test runs twice: with the start helper (`replica_start.c`, spawned) and without it
(the reaper forks)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuyard.services.executor.processes import probe_namespaces, process_start_time
from gpuyard.services.executor.reaper.helper import load_helper, spawn
from gpuyard.services.executor.reaper_client import ReaperClient, StartRefused, read_exit_file
from gpuyard.services.executor.start_helper import start_helper

REPORT = """
import json, os, sys
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
print(json.dumps({
    "cwd": os.getcwd(),
    "new_session": os.getsid(0) == os.getpid(),
    "stdin": os.readlink("/proc/self/fd/0"),
    "stdout_is_stderr": os.path.samestat(os.fstat(1), os.fstat(2)),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "ignored_signals": status["SigIgn"].strip(),
    "blocked_signals": status["SigBlk"].strip(),
    "env": {k: v for k, v in os.environ.items() if k.startswith("GPUYARD_")},
    "argv": sys.argv[1:],
}))
"""


async def eventually(check, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def built_helper(tmp_path_factory) -> str:
    helper = start_helper(tmp_path_factory.mktemp("bin"))
    if helper is None:
        pytest.skip("no C compiler to build the start helper with")
    return helper


@pytest.fixture(params=["helper", "fork"])
def helper(request) -> str | None:
    return request.getfixturevalue("built_helper") if request.param == "helper" else None


class Started:
    def __init__(self, tmp_path: Path, helper: str | None, *, loads: bool = True):
        self.tmp_path = tmp_path
        self.helper = helper
        self.loads = loads
        self.reaper = ReaperClient()
        self.count = 0

    async def __aenter__(self) -> Started:
        self.reaper.open(self.helper)
        if self.helper and self.loads:  # it loaded it (one that could not would fork: no test would tell)
            maps = Path(f"/proc/{self.reaper.pid}/maps")
            await eventually(lambda: self.helper in maps.read_text(), 10)
        return self

    async def __aexit__(self, *_exc) -> None:
        self.reaper.close()

    async def run(self, argv, *, cwd=None, env=None, **more) -> tuple[int | None, bytes, int]:
        """Start `argv` through the reaper (`more`: folders, user, binds, read_only…); its status, its output
        and its pid."""
        self.count += 1
        read_fd, write_fd = os.pipe()
        try:
            proc = await self.reaper.start(
                argv,
                cwd=str(cwd or self.tmp_path),
                env=env if env is not None else {"PATH": os.environ["PATH"]},
                output=(write_fd, read_fd),
                pid_file=str(self.tmp_path / f"r{self.count}.pid"),
                exit_file=str(self.tmp_path / f"r{self.count}.exit"),
                log_file="",
                record={"node": "n"},
                **more,
            )
        finally:
            os.close(write_fd)
        with os.fdopen(read_fd, "rb") as out:
            output = await asyncio.to_thread(out.read)
        return await asyncio.wait_for(proc.wait(), 10), output, proc.pid


async def test_the_child_gets_what_popen_gives_it(tmp_path, helper):
    argv = [sys.executable, "-c", REPORT, "a b", "ü"]
    env = {"PATH": os.environ["PATH"], "GPUYARD_JOB": "j1", "GPUYARD_ODD": "x=y ü"}
    read_fd, write_fd = os.pipe()
    options = dict(cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd)
    await asyncio.to_thread(subprocess.run, argv, start_new_session=True, check=True, **options)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as out:
        by_popen = json.loads(out.read())
    async with Started(tmp_path, helper) as started:
        status, output, _pid = await started.run(argv, env=env)
    assert status == 0, output
    by_reaper = json.loads(output)
    internal = (1 << 31) | (1 << 32)  # glibc's internal signals may start out ignored either way
    # what this test's own process ignores (started by `nohup` or in a shell's background: SIGHUP, SIGINT,
    # SIGQUIT) a popen'd child inherits; the reaper's children start from the reaper's dispositions
    inherited = int(re.search(r"^SigIgn:\s*([0-9a-f]+)$", Path("/proc/self/status").read_text(), re.M)[1], 16)
    for child in (by_popen, by_reaper):
        child["ignored_signals"] = f"{int(child['ignored_signals'], 16) & ~internal & ~inherited:016x}"
    assert by_reaper == by_popen
    assert (
        by_reaper["cwd"] == str(tmp_path) and by_reaper["new_session"] and by_reaper["stdin"] == "/dev/null"
    )
    assert by_reaper["fds"] == [0, 1, 2, 3]  # (3: the listing's own descriptor)


async def test_each_end_is_written_to_the_exit_file_and_reported(tmp_path, helper):
    async with Started(tmp_path, helper) as started:
        assert (await started.run(["sh", "-c", "echo hi; exit 3"]))[:2] == (3, b"hi\n")
        assert (await started.run(["sh", "-c", "kill -TERM $$"]))[0] == -15
    for name in ("r1.exit", "r2.exit"):  # (written once the replica's output has been read to its end)
        await eventually(lambda name=name: (tmp_path / name).exists(), 10)
    assert read_exit_file(str(tmp_path / "r1.exit")) == 3
    assert read_exit_file(str(tmp_path / "r2.exit")) == -15
    record = json.loads((tmp_path / "r1.pid").read_text())
    assert record["node"] == "n" and record["pid"] > 0 and record["start"] > 0
    assert (tmp_path / "r1.exit").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("argv", "cwd", "env", "step", "code"),
    [
        (["no-such-command-here"], None, None, "exec", errno.ENOENT),
        (["./missing.sh"], None, None, "exec", errno.ENOENT),
        (["./data.txt"], None, None, "exec", errno.EACCES),
        (["true"], "gone", None, "cwd", errno.ENOENT),
        (["tr\0ue"], None, None, "exec", 0),
        (["true"], None, {"A": "b\0c"}, "exec", 0),
        (["true"], None, {"A=B": "c"}, "exec", 0),
    ],
)
async def test_a_start_that_fails_says_at_which_step(tmp_path, helper, argv, cwd, env, step, code):
    (tmp_path / "data.txt").write_text("not a program")
    async with Started(tmp_path, helper) as started:
        with pytest.raises(StartRefused) as refused:
            await started.run(argv, cwd=tmp_path / cwd if cwd else None, env=env)
        assert (refused.value.step, refused.value.errno) == (step, code)
        assert not (tmp_path / "r1.pid").exists()
        assert (await started.run(["true"]))[0] == 0  # and the reaper goes on


def descendants_alive(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


async def test_nothing_of_a_replica_outlives_its_first_process_even_out_of_its_session(tmp_path, helper):
    marker = f"{time.time_ns() % 100000 + 1000}.5"  # a unique sleep length names the escaped process
    async with Started(tmp_path, helper) as started:
        status, _, _ = await started.run(
            ["sh", "-c", f"setsid sleep {marker} >/dev/null 2>&1 & sleep 0.2; exit 0"]
        )
        assert status == 0
        await eventually(lambda: not descendants_alive(f"sleep\0{marker}"), 5)


async def test_a_replica_outlives_its_executor_and_its_end_is_still_written(tmp_path, helper):
    """The executor goes (its socket closes): the replica goes on; its end is written; the reaper ends after."""
    started = Started(tmp_path, helper)
    await started.__aenter__()
    read_fd, write_fd = os.pipe()
    proc = await started.reaper.start(
        ["sh", "-c", "sleep 0.5; echo late; exit 4"],
        cwd=str(tmp_path),
        env={"PATH": os.environ["PATH"]},
        output=(write_fd, read_fd),
        pid_file=str(tmp_path / "r.pid"),
        exit_file=str(tmp_path / "r.exit"),
        log_file=str(tmp_path / "r.log"),
        record={},
    )
    os.close(write_fd)
    os.close(read_fd)  # the executor's read end: gone with it (the reaper keeps its own: no SIGPIPE)
    reaper = started.reaper.pid
    started.reaper.close()
    await eventually(lambda: read_exit_file(str(tmp_path / "r.exit")) is not None, 10)
    assert read_exit_file(str(tmp_path / "r.exit")) == 4
    assert (tmp_path / "r.log").read_bytes() == b"late\n"  # what no executor read, the reaper kept
    assert process_start_time(proc.pid) is None
    await eventually(lambda: process_start_time(reaper) is None, 10)  # nothing left to reap, nobody to tell


async def test_an_orphan_of_a_running_replica_is_its_first_processs_until_it_ends(tmp_path, helper):
    """The first process is the subreaper of the replica's descendants: one whose parent ended is re-parented
    to it, not to the reaper, while it runs; what is left when it ends is killed."""
    marker = f"{time.time_ns() % 100000 + 1000}.75"
    async with Started(tmp_path, helper) as started:
        read_fd, write_fd = os.pipe()
        proc = await started.reaper.start(
            ["sh", "-c", f"(setsid sleep {marker} >/dev/null 2>&1 &); exec sleep 30"],
            cwd=str(tmp_path),
            env={"PATH": os.environ["PATH"]},
            output=(write_fd, read_fd),
            pid_file=str(tmp_path / "r.pid"),
            exit_file=str(tmp_path / "r.exit"),
            log_file="",
            record={},
        )
        os.close(write_fd)
        await eventually(lambda: descendants_alive(f"sleep\0{marker}"), 5)
        (orphan,) = descendants_alive(f"sleep\0{marker}")
        stat = Path(f"/proc/{orphan}/stat").read_text()
        assert int(stat[stat.rindex(")") + 2 :].split()[1]) == proc.pid
        os.kill(proc.pid, 15)
        assert await asyncio.wait_for(proc.wait(), 10) == -15
        os.close(read_fd)
        await eventually(lambda: not descendants_alive(f"sleep\0{marker}"), 5)


@pytest.mark.parametrize("helper_is", ["not executable", "gone"])
async def test_a_helper_that_cannot_run_leaves_the_reaper_forking(tmp_path, helper_is):
    """A data directory mounted noexec, or a helper an upgrade removed: the reaper starts the replicas itself."""
    helper = tmp_path / "helper"
    if helper_is == "not executable":
        helper.write_text("")
    async with Started(tmp_path, str(helper), loads=False) as started:
        assert (await started.run(["sh", "-c", "echo one"]))[:2] == (0, b"one\n")
        assert (await started.run(["sh", "-c", "echo two"]))[:2] == (0, b"two\n")


def test_the_helper_starts_a_subreaper_in_a_new_session_from_any_process(tmp_path, built_helper):
    """The library alone, called from this (threaded) test process: the child execs (its error pipe closes
    empty), leads a new session, keeps its orphans, and the command was found on the PATH given."""
    helper = load_helper(built_helper)
    marker = f"{time.time_ns() % 100000 + 1000}.25"
    read_fd, write_fd = os.pipe()
    error_r, error_w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    request = {
        "argv": ["sh", "-c", f"(setsid sleep {marker} >/dev/null 2>&1 &); echo started; exec sleep 30"],
        "env": {"PATH": os.environ["PATH"]},
        "cwd": str(tmp_path),
    }
    pid = spawn(helper, request, null, write_fd, error_w)
    for fd in (write_fd, error_w, null):
        os.close(fd)
    try:
        assert os.read(error_r, 512) == b""
        assert os.read(read_fd, 64) == b"started\n"
        assert os.getsid(pid) == pid and Path(f"/proc/{pid}/cwd").resolve() == tmp_path.resolve()
        deadline = time.monotonic() + 5
        while not descendants_alive(f"sleep\0{marker}") and time.monotonic() < deadline:
            time.sleep(0.05)
        (orphan,) = descendants_alive(f"sleep\0{marker}")
        stat = Path(f"/proc/{orphan}/stat").read_text()
        assert int(stat[stat.rindex(")") + 2 :].split()[1]) == pid
    finally:
        for leftover in [pid, *descendants_alive(f"sleep\0{marker}")]:
            os.kill(leftover, 9)
        for fd in (read_fd, error_r):
            os.close(fd)
        os.waitpid(pid, 0)


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="folders of other users and mounts need root")


def mode_and_owner(path: Path) -> tuple[int, int, int]:
    found = path.lstat()
    return stat.S_IMODE(found.st_mode), found.st_uid, found.st_gid


@root_only
async def test_the_first_process_makes_its_folders_with_their_modes_and_owners(tmp_path, helper):
    """In order, each with its mode whatever the umask and its owner (-1: the platform's): what is there already
    is kept when it is its owner's, given to its owner when the platform's (a start that had not given it yet);
    another user's, a file or a link is refused at the step "folders", and nothing is run."""
    attempt, work, kept, given = (tmp_path / name for name in ("attempt", "work", "kept", "given"))
    work = attempt / "work"
    kept.mkdir()
    os.chown(kept, 4242, 4243)
    given.mkdir(mode=0o755)
    folders = [
        [str(attempt), 0o711, -1, -1],
        [str(work), 0o700, 4242, 4243],
        [str(kept), 0o700, 4242, 4243],
        [str(given), 0o700, 4242, 4243],
    ]
    old = os.umask(0o077)
    try:
        async with Started(tmp_path, helper) as started:
            status, output, _ = await started.run(["true"], cwd=tmp_path, folders=folders)
            assert status == 0, output
            assert mode_and_owner(attempt) == (0o711, 0, 0)
            assert mode_and_owner(work) == mode_and_owner(given) == (0o700, 4242, 4243)
            assert mode_and_owner(kept)[1:] == (4242, 4243)
            assert (await started.run(["true"], cwd=tmp_path, folders=folders))[0] == 0  # (its next attempt)

            (tmp_path / "file").write_text("")
            (tmp_path / "link").symlink_to(work)
            os.chown(given, 4444, 4444)
            for place in ("given", "file", "link"):
                with pytest.raises(StartRefused) as refused:
                    await started.run(
                        ["touch", "ran"], cwd=tmp_path, folders=[[str(tmp_path / place), 0o700, 4242, 4243]]
                    )
                assert (refused.value.step, refused.value.errno) == ("folders", errno.EEXIST)
            assert mode_and_owner(given)[1] == 4444 and (tmp_path / "link").is_symlink()
            assert mode_and_owner(work)[1] == 4242 and not (tmp_path / "ran").exists()
            with pytest.raises(StartRefused) as refused:
                await started.run(
                    ["true"], cwd=tmp_path, folders=[[str(tmp_path / "gone" / "work"), 0o700, -1, -1]]
                )
            assert (refused.value.step, refused.value.errno) == ("folders", errno.ENOENT)
    finally:
        os.umask(old)


@root_only
async def test_a_folder_bound_read_only_in_its_namespace_refuses_writes(tmp_path, helper):
    """Bound over their targets in the replica's own mount namespace, one read-write, one read-only: the job
    reads both, writes the first, and its write in the second fails with EROFS; the node sees neither mount."""
    if not (found := probe_namespaces()).mounts:
        pytest.skip(f"no mount namespaces on this node: {found.reason}")
    sources, targets = tmp_path / "sources", tmp_path / "work"
    for name in ("rw", "ro"):
        (sources / name).mkdir(parents=True)
        (sources / name / "data").write_text(f"{name} data")
        (targets / name).mkdir(parents=True)
    script = (
        "cat rw/data ro/data; echo; echo x > rw/new && echo wrote-rw; "
        "echo x > ro/new || echo refused-ro; grep -c ' ro,' /proc/self/mountinfo"
    )
    async with Started(tmp_path, helper) as started:
        status, output, _ = await started.run(
            ["sh", "-c", script],
            cwd=targets,
            binds=[(str(sources / "rw"), str(targets / "rw")), (str(sources / "ro"), str(targets / "ro"))],
            read_only=[str(targets / "ro")],
        )
    text = output.decode()
    assert status == 0, text
    assert "rw dataro data" in text and "wrote-rw" in text and "refused-ro" in text, text
    assert "Read-only file system" in text, text
    assert (sources / "rw" / "new").exists() and not (sources / "ro" / "new").exists()
    assert not os.path.ismount(targets / "ro") and not os.path.ismount(
        targets / "rw"
    )  # (the node's: untouched)


@pytest.fixture
def nosuid_folder(tmp_path):
    """A folder of a mount of its own (a bind over itself) that is nosuid, nodev and noexec."""
    source = tmp_path / "source"
    source.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(source)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,nosuid,nodev,noexec", str(source)], check=True)
        yield source
    finally:
        subprocess.run(["umount", "-l", str(source)], check=True)


@root_only
async def test_a_read_only_remount_keeps_the_nosuid_of_the_folders_mount(tmp_path, helper, nosuid_folder):
    """A folder of a mount that is nosuid, nodev and noexec stays so, read-only, in the replica's namespace."""
    if not (found := probe_namespaces()).mounts:
        pytest.skip(f"no mount namespaces on this node: {found.reason}")
    target = tmp_path / "target"
    target.mkdir()
    async with Started(tmp_path, helper) as started:
        status, output, _ = await started.run(
            ["sh", "-c", f"grep ' {target} ' /proc/self/mountinfo"],
            binds=[(str(nosuid_folder), str(target))],
            read_only=[str(target)],
        )
    assert status == 0, output
    options = output.decode().split()[5].split(",")
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(options), output
