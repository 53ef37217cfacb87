"""`python -m gpuyard.shared.scheduling.sim` is the whole simulator command line (`gpuyard sim` runs it): a tiny run,
and every argument that cannot work is one line on stderr with exit status 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.shared.runtime.installhint import install_command
from gpuyard.shared.scheduling.sim import cli

ROOT = Path(__file__).resolve().parents[4]
NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,G2\nn1,32000,131072,2,T4\n"
PODS_CSV = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
    "scheduled_time\np0,4000,8192,1,1000,,LS,Running,0,1000,0\np1,2000,4096,1,500,,LS,Running,10,400,20\n"
    "p2,8000,16384,2,1000,,BE,Running,20,3000,25\n"
)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    (tmp_path / "nodes.csv").write_text(NODES_CSV)
    (tmp_path / "pods.csv").write_text(PODS_CSV)
    (tmp_path / "columns.csv").write_text("foo,bar\n1,2\n")
    return tmp_path


def sim(capsys, trace: Path, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--nodes", str(trace / "nodes.csv"), "--seeds", "1", *args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str) -> str:
    assert code == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_a_tiny_run_prints_json(capsys, trace):
    code, out, err = sim(capsys, trace, "--trace", str(trace / "pods.csv"), "--policy", "bestfit", "--json")
    assert code == 0, err
    results = json.loads(out)
    assert results["mode"] == "inflation" and results["gpus"] == 10
    assert list(results["policies"]) == ["fifo", "bestfit"]


def test_a_time_replay_gives_the_wait_tail_in_its_table_and_json(capsys, trace):
    args = ("--trace", str(trace / "pods.csv"), "--mode", "time", "--policy", "gpuyard")
    code, out, err = sim(capsys, trace, *args, "--json")
    assert code == 0, err
    for summary in json.loads(out)["policies"].values():
        keys = ("p95_wait_s", "p99_wait_s", "p99_9_wait_s", "longest_wait_s")
        assert all(summary[a] <= summary[b] for a, b in zip(keys, keys[1:], strict=False)), summary
        assert summary["waits_over_1h"] == 0
    code, out, err = sim(capsys, trace, *args)
    assert code == 0 and out == ""
    header = next(line for line in err.splitlines() if "p99.9" in line)
    columns = ("policy", "avg", "p95", "p99", "p99.9", "longest", "over 1 h")
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == list(columns)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--trace", "{t}/missing.csv"], "trace file not found: {t}/missing.csv"),
        (["--trace", "{t}/pods.csv", "--policy", "nope"], "unknown policy 'nope'"),
        (["--trace", "{t}"], "cannot read {t}: Is a directory"),
        (["--trace", "{t}/pods.csv", "--plot", "{t}/no/such/dir/out.png"], "folder {t}/no/such/dir does not"),
        (["--trace", "{t}/pods.csv", "--plot", "{t}/out.txt"], "must end in .png"),
        (["--trace", "{t}/pods.csv", "--ratio", "-1"], "--ratio must be positive"),
        (["--trace", "{t}/pods.csv", "--mode", "time", "--speedup", "0"], "--speedup must be positive"),
        (["--trace", "{t}/pods.csv", "--cluster-fraction", "2"], "--cluster-fraction must be in (0, 1]"),
    ],
)
def test_arguments_that_cannot_work_are_one_line(capsys, trace, args, expected):
    code, _, err = sim(capsys, trace, *[a.format(t=trace) for a in args])
    assert expected.format(t=trace) in one_line_error(code, err)
    assert err.startswith("gpuyard sim: ")


def test_a_missing_file_is_named_as_given_with_where_it_was_looked_for(capsys, trace, monkeypatch):
    """A bare name that is not shipped is a path in the working directory; the error names that file (not the
    default node list, which is found) and the folder it looked in."""
    monkeypatch.chdir(trace)
    code = cli.main(["--trace", "openb_pod_list_gpuspec33.csv", "--seeds", "1"])
    err = one_line_error(code, capsys.readouterr().err)
    assert err == (
        f"gpuyard sim: trace file not found: openb_pod_list_gpuspec33.csv (looked for "
        f"{trace}/openb_pod_list_gpuspec33.csv; shipped with gpuyard: openb_node_list_gpu_node.csv, "
        "openb_pod_list_default.csv, openb_pod_list_gpushare40.csv)"
    )
    code = cli.main(["--trace", str(trace / "pods.csv"), "--nodes", "nodes/missing.csv", "--seeds", "1"])
    assert (
        f"trace file not found: nodes/missing.csv (looked for {trace}/nodes/missing.csv;"
        in one_line_error(code, capsys.readouterr().err)
    )


def test_the_shipped_files_are_found_by_name_from_any_folder(capsys, trace, monkeypatch):
    monkeypatch.chdir(trace)  # nothing of the trace here
    code = cli.main(
        ["--trace", "openb_pod_list_gpushare40.csv", "--policy", "bestfit", "--seeds", "1", "--json"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["gpus"] == 6212 and result["published_at_100"] == {"bestfit": 8.56, "fgd": 6.04}


def test_a_plot_is_written(capsys, trace):
    plot = trace / "curve.png"
    code, out, err = sim(capsys, trace, "--trace", str(trace / "pods.csv"), "--policy", "bestfit")
    assert code == 0 and out == ""  # without --json: the table, on stderr
    assert "inflation replay of pods" in err and "bestfit" in err
    code, out, err = sim(
        capsys, trace, "--trace", str(trace / "pods.csv"), "--policy", "bestfit", "--plot", str(plot)
    )
    assert code == 0, err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote the plot to {plot}" in err


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(capsys, trace):
    code, _, err = sim(capsys, trace, "--trace", str(trace / "pods.csv"), "--policy", "bestfit")
    assert code == 0, err
    lines = [line for line in err.splitlines() if "% (" in line]
    assert lines and lines[-1].startswith("bestfit seed 42: 100% ("), err
    assert [int(line.split(": ")[1].split("%")[0]) for line in lines] == sorted(
        int(line.split(": ")[1].split("%")[0]) for line in lines
    )


def test_missing_columns_are_named_in_one_line(capsys, trace):
    code, _, err = sim(capsys, trace, "--trace", str(trace / "columns.csv"))
    assert "num_gpu" in one_line_error(code, err)
    code = cli.main(["--trace", str(trace / "pods.csv"), "--nodes", str(trace / "columns.csv")])
    err = capsys.readouterr().err
    assert "sn" in one_line_error(code, err) and "column" in err


def test_plot_without_matplotlib_names_the_extra(capsys, trace, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails as when not installed
    code, out, err = sim(capsys, trace, "--trace", str(trace / "pods.csv"), "--plot", str(trace / "out.png"))
    assert one_line_error(code, err) == f"gpuyard sim: --plot needs matplotlib: {install_command('sim')}"
    assert out == "" and not (trace / "out.png").exists()  # refused before the replay


def test_the_module_runs_as_the_command(trace):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuyard.shared.scheduling.sim",
            "--trace",
            str(trace),
            "--nodes",
            str(trace / "nodes.csv"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and done.stderr.strip() == f"gpuyard sim: cannot read {trace}: Is a directory"
    helped = subprocess.run(
        [sys.executable, "-m", "gpuyard.shared.scheduling.sim", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert helped.returncode == 0 and helped.stdout.startswith("usage: gpuyard sim")
    assert "--plot" in helped.stdout and "--cluster-fraction" in helped.stdout
