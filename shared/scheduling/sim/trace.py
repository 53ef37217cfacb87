"""Reading the Alibaba openb traces (and any CSV with the same columns) into plain arrays."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHIPPED_DIR = Path(__file__).resolve().parent / "traces"  # package data: README.md, license, citation
DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"
SHIPPED = (DEFAULT_NODES, DEFAULT_PODS, "openb_pod_list_gpushare40.csv")  # the files gpuyard installs
MIB = 1 << 20
GPU_MEMORY_GIB = {"V100M16": 16, "V100M32": 32, "P100": 16, "T4": 16, "A10": 24}  # G1-G3 undisclosed: 0


@dataclass(slots=True)
class NodeTable:
    names: list[str]
    cpus: np.ndarray  # CPUs
    memory: np.ndarray  # bytes
    gpus: np.ndarray  # GPUs per node
    models: list[str]

    @property
    def total_gpus(self) -> int:
        return int(self.gpus.sum())


@dataclass(slots=True)
class PodTable:
    names: list[str]
    cpus: np.ndarray
    memory: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray  # per GPU; 1000 for whole GPUs
    gpu_spec: list[tuple[str, ...]]
    creation: np.ndarray  # seconds; NaN when absent
    scheduled: np.ndarray
    deletion: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_demand_milli(self) -> np.ndarray:
        return self.num_gpu * self.gpu_milli

    @property
    def has_times(self) -> bool:
        return bool(np.isfinite(self.creation).any())


def resolve(path: str | Path, default_name: str) -> Path:
    """The trace file meant by `path`: one of the SHIPPED file names (or nothing: `default_name`) is the file
    installed with gpuyard; anything else is a path, relative to the working directory. A FileNotFoundError
    names the file as given and where it was looked for."""
    given = str(path) if path else default_name
    if given in SHIPPED:
        p = SHIPPED_DIR / given
        if not p.exists():  # an installation that lost its package data
            raise FileNotFoundError(f"trace file not found: {given} (looked for the shipped copy {p})")
        return p
    p = Path(given)
    if not p.exists():
        where = p if p.is_absolute() else Path.cwd() / p
        raise FileNotFoundError(
            f"trace file not found: {given} (looked for {where}; shipped with gpuyard: {', '.join(SHIPPED)})"
        )
    return p


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu")


def _rows(path: Path, required: tuple[str, ...], what: str) -> list[dict]:
    """The CSV's rows; a ValueError naming the missing columns when the header lacks any of `required`."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                f"{path} is not an openb {what} file: missing column{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)}"
            )
        return list(reader)


def read_nodes(path: str | Path = "") -> NodeTable:
    rows = _rows(resolve(path, DEFAULT_NODES), NODE_COLUMNS, "node")
    return NodeTable(
        names=[r["sn"] for r in rows],
        cpus=np.array([_number(r["cpu_milli"]) / 1000 for r in rows]),
        memory=np.array([_number(r["memory_mib"]) * MIB for r in rows]),
        gpus=np.array([int(_number(r.get("gpu")) or 0) for r in rows], dtype=np.int64),
        models=[(r.get("model") or "").strip() for r in rows],
    )


def read_pods(path: str | Path = "") -> PodTable:
    rows = _rows(resolve(path, DEFAULT_PODS), POD_COLUMNS, "pod")
    num_gpu = np.array([int(_number(r.get("num_gpu")) or 0) for r in rows], dtype=np.int64)
    milli = np.array([_number(r.get("gpu_milli")) for r in rows])
    milli = np.where(np.isnan(milli), 1000, milli).astype(np.int64)
    milli = np.where(num_gpu > 1, 1000, np.where(num_gpu == 0, 0, np.clip(milli, 1, 1000)))
    return PodTable(
        names=[r["name"] for r in rows],
        cpus=np.array([_number(r.get("cpu_milli")) / 1000 for r in rows]),
        memory=np.array([_number(r.get("memory_mib")) * MIB for r in rows]),
        num_gpu=num_gpu,
        gpu_milli=milli,
        gpu_spec=[tuple(sorted({x for x in (r.get("gpu_spec") or "").split("|") if x})) for r in rows],
        creation=np.array([_number(r.get("creation_time")) for r in rows]),
        scheduled=np.array([_number(r.get("scheduled_time")) for r in rows]),
        deletion=np.array([_number(r.get("deletion_time")) for r in rows]),
    )
