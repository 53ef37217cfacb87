"""Settings of the executor's Slurm backend (GPUYARD_EXECUTOR_BACKEND=slurm): how it talks to Slurm and shapes
the batch jobs it submits.

A plain model, nested in `ExecutorSettings.slurm`: each field is read from GPUYARD_SLURM_<FIELD> (or the flag
--slurm.<field>). Slurm's own commands find their cluster as they always do (`SLURM_CONF`, or
/etc/slurm/slurm.conf), from the executor's environment.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuyard.shared.contracts.units import parse_size


class SlurmConfig(BaseModel):
    """The Slurm backend (GPUYARD_EXECUTOR_BACKEND=slurm)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    poll_interval: float = Field(
        1.0,
        gt=0,
        description="Seconds between readings of the job queue (`squeue --states=all`, one call for every job): "
        "starts, ends (an exit file shows a normal end sooner) and logs.",
    )
    exit_check_interval: float = Field(
        0.1,
        gt=0,
        description="Seconds between looks at the running batch jobs' exit files, where a job's end shows "
        "before Slurm's queue says it (a stat per running replica).",
    )
    partition: str = Field(
        "",
        description="Partition the jobs are submitted to and whose nodes are announced (default: every "
        "partition's nodes; jobs go to the cluster's default partition).",
    )
    account: str = Field("", description="Slurm account the jobs are charged to (default: the user's).")
    qos: str = Field("", description="Slurm QOS of the jobs (default: the account's).")
    spool_dir: str = Field(
        "",
        description="Folder of the batch jobs' output and exit files, which the compute nodes must reach at "
        "the same path (a shared filesystem); default: `<data dir>/slurm`.",
    )
    working_dir: str = Field(
        "",
        description="Working directory of a job that names none, on the compute nodes (default: the spool "
        "folder of its attempt).",
    )
    fractions: Literal["shard", "whole"] = Field(
        "shard",
        description="How a fractional GPU is asked of Slurm: shard (`--gres=shard:N`, its share of the "
        "node's shards per GPU, where the node has `shard` gres; else a whole GPU) or whole (always "
        "`--gres=gpu:1`).",
    )
    default_gpu_model: str = Field(
        "GPU", description="Model announced for a node's GPUs when its gres names no type (`gpu:4`)."
    )
    default_gpu_memory: int = Field(
        parse_size("16GiB"),
        gt=0,
        description="Memory (bytes) announced for each GPU: Slurm does not know it.",
    )
    time_margin: float = Field(
        120.0,
        ge=0,
        description="Seconds added to a job's timeout (and the grace) for the `--time` limit given to Slurm: "
        "GPUYARD stops the job at its timeout, Slurm's limit is the backstop.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description='More `sbatch` arguments for every job, a JSON list: `["--exclusive"]`.',
    )
