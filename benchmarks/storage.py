"""Volumes' uploads and downloads through the API, against `cp` of the same data on the same disk, in the same run.

    python benchmarks/storage.py                      # one 2 GB file, 10,000 small files; 3 runs of each
    python benchmarks/storage.py --large-mb 256 --small 1000 --runs 1   # a quick look
    python benchmarks/storage.py --store s3          # volumes in an S3 bucket (moto's server on loopback)

Starts `gpuyard up --simulate-gpus 1` on free ports (removed afterwards), makes a volume, then for each run:
the large file uploaded (`gpuyard.transfers`, as `gpuyard volumes upload` sends it: streamed) and
downloaded, and a folder of small files (4 KiB each) uploaded as a tree and downloaded as a tar unpacked;
each next to `cp` (a file) and `cp -r` (the folder) of the same data on the same disk, with the page cache
dropped before each where the machine lets us (`/proc/sys/vm/drop_caches`, as root), so that neither side
reads from memory what the other wrote. Prints one JSON object: each case's seconds per run, min / median /
max, and its ratio to `cp` (`cp` seconds / its seconds: 1.0 is as fast as cp; the goal is 0.7 for the large
file both ways, 0.3 for the small files); and the CPU seconds each side spent (`*_cpu_s`: GPUYARD's, the API's
process and the client's together; cp's own; an S3 server's not counted), which other work on the machine
moves less than the seconds.

With `--store s3` the volume lives in a bucket of an S3-compatible server started on loopback (`moto_server`,
from `moto[server]`, in a process of its own), `GPUYARD_VOLUME_STORE=s3://…`, and each case is set beside the
same transfer made with s3fs directly (`put_file` / `get_file`, `put` / `get` of the folder), as `aws s3 cp`
would make it: the ratio then says what going through the API costs over talking to the bucket."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuyard import transfers
from gpuyard.client import Client
from gpuyard.supervisor.ports import free_ports

# imported as benchmarks.storage (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks.pipeline import cpu_seconds, platform_processes, start_platform, stop_platform
else:
    from pipeline import cpu_seconds, platform_processes, start_platform, stop_platform

VOLUME = "bench"


def drop_caches() -> bool:
    """Write back and forget the page cache, where allowed (root): each side then reads from the disk. Whether
    it was forgotten (False: written back only)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def cpu_used(api_pid: int | None) -> float:
    """CPU seconds spent so far by this process (the client's side, and s3fs's), its children waited for (`cp`)
    and the API's process."""
    own = os.times()
    api = cpu_seconds(api_pid) if api_pid is not None else 0.0
    return own.user + own.system + own.children_user + own.children_system + api


def timed(action, api_pid: int | None = None) -> tuple[float, float]:
    """(seconds, CPU seconds: `cpu_used`'s) that `action` took, the page cache dropped first."""
    drop_caches()
    cpu = cpu_used(api_pid)
    start = time.perf_counter()
    action()
    return time.perf_counter() - start, cpu_used(api_pid) - cpu


def make_data(folder: Path, large_mb: int, small: int) -> tuple[Path, Path]:
    large = folder / "large.bin"
    with open(large, "wb") as f:
        for _ in range(large_mb):
            f.write(os.urandom(1 << 20))
    tree = folder / "small"
    for i in range(small):
        sub = tree / f"d{i // 1000:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:05d}.bin").write_bytes(os.urandom(4096))
    return large, tree


class S3Bucket:
    """moto's S3 server on a free loopback port, in a process of its own, with one bucket; `env`: the variables
    that point s3fs (the platform's and ours) at it."""

    def __init__(self, scratch: Path):
        port = free_ports("127.0.0.1", 1)[0]
        self.endpoint = f"http://127.0.0.1:{port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench-secret",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(scratch / "aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(scratch / "aws-credentials"),
        }
        server = Path(sys.executable).parent / "moto_server"
        self.proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.environ.update(self.env)
        import s3fs

        self.fs = s3fs.S3FileSystem()
        deadline = time.monotonic() + 30
        while True:
            try:
                self.fs.mkdir("bench")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"moto_server did not answer at {self.endpoint}") from None
                time.sleep(0.2)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def direct_cases(fs, large: Path, tree: Path, scratch: Path) -> dict[str, object]:
    """name -> the same transfer with s3fs straight to the bucket."""

    def up_large():
        fs.put_file(str(large), "bench/direct/large.bin")

    def down_large():
        target = scratch / "large.s3"
        target.unlink(missing_ok=True)
        fs.get_file("bench/direct/large.bin", str(target))

    def up_small():
        if fs.exists("bench/direct/small"):
            fs.rm("bench/direct/small", recursive=True)
        fs.put(str(tree), "bench/direct/", recursive=True)

    def down_small():
        target = scratch / "small.s3"
        shutil.rmtree(target, ignore_errors=True)
        fs.get("bench/direct/small", str(target), recursive=True)

    return {
        "large_upload": up_large,
        "large_download": down_large,
        "small_upload": up_small,
        "small_download": down_small,
    }


def cases(client: Client, large: Path, tree: Path, scratch: Path) -> dict[str, tuple]:
    """name -> (ours, cp's): two callables each."""
    url = f"/v1/volumes/{VOLUME}/content"

    def up_large():
        transfers.upload_file(
            client, url, {"path": "large.bin"}, large, "application/octet-stream", lambda n: None
        )

    def down_large():
        target = scratch / "large.down"
        target.unlink(missing_ok=True)
        transfers.download(client, url, {"path": "large.bin"}, target, lambda n: None)

    def up_small():
        if _exists(client, "small"):
            client.request("DELETE", url, params={"path": "small"})
        transfers.upload(
            client,
            url,
            {"path": "", "archive": "true"},
            transfers.tree_chunks(tree, lambda n: None),
            "application/x-tar",
        )

    def down_small():
        target = scratch / "small.down"
        shutil.rmtree(target, ignore_errors=True)
        transfers.download(client, url, {"path": "small"}, target, lambda n: None)

    def cp(source: Path, target: Path, tree_: bool = False):
        def run():
            if tree_:
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
            subprocess.run(["cp", "-r" if tree_ else "--", str(source), str(target)], check=True)

        return run

    return {
        "large_upload": (up_large, cp(large, scratch / "large.cp")),
        "large_download": (down_large, cp(large, scratch / "large.cp")),
        "small_upload": (up_small, cp(tree, scratch / "small.cp", tree_=True)),
        "small_download": (down_small, cp(tree, scratch / "small.cp", tree_=True)),
    }


def _exists(client: Client, path: str) -> bool:
    listed = client.request("GET", f"/v1/volumes/{VOLUME}/files")
    return any(item["path"] == path for item in listed["items"])


def summary(values: list[float]) -> dict:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--large-mb", type=int, default=2000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--store", choices=("folder", "s3"), default="folder", help="where the volume's bytes live"
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gpuyard-storage-"))
    bucket = S3Bucket(scratch) if args.store == "s3" else None
    if bucket is not None:
        os.environ["GPUYARD_VOLUME_STORE"] = "s3://bench/volumes"
    them = "s3fs" if bucket else "cp"
    proc, client, tmp, _ = start_platform(1, None)
    try:
        large, tree = make_data(scratch, args.large_mb, args.small)
        size = args.large_mb * (1 << 20) * 2 + args.small * 4096 * 2 + (1 << 30)
        client.request("POST", "/v1/volumes", json={"name": VOLUME, "size": size})
        api = next((pid for pid, name in platform_processes(proc.pid).items() if name == "submit"), None)
        times: dict[str, dict[str, list[float]]] = {}
        cpu: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.runs):
            direct = direct_cases(bucket.fs, large, tree, scratch) if bucket else {}
            for name, (ours, theirs) in cases(client, large, tree, scratch).items():
                row = times.setdefault(name, {"gpuyard": [], them: []})
                used = cpu.setdefault(name, {"gpuyard": [], them: []})
                for side, action, pid in (("gpuyard", ours, api), (them, direct.get(name, theirs), None)):
                    seconds, cpu_s = timed(action, pid)
                    row[side].append(seconds)
                    used[side].append(cpu_s)
        result = {
            "store": args.store,
            "large_mb": args.large_mb,
            "small_files": args.small,
            "runs": args.runs,
            "cases": {
                name: {
                    "gpuyard_s": summary(row["gpuyard"]),
                    f"{them}_s": summary(row[them]),
                    f"ratio_to_{them}": summary(
                        [c / g for g, c in zip(row["gpuyard"], row[them], strict=True)]
                    ),
                    "all_gpuyard_s": [round(v, 3) for v in row["gpuyard"]],
                    f"all_{them}_s": [round(v, 3) for v in row[them]],
                    "gpuyard_cpu_s": summary(cpu[name]["gpuyard"]),
                    f"{them}_cpu_s": summary(cpu[name][them]),
                }
                for name, row in times.items()
            },
        }
    finally:
        stop_platform(proc, tmp)
        if bucket is not None:
            bucket.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
