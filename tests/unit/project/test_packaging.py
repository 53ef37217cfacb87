"""Dependencies: the core installs what the core imports; ONNX Runtime and matplotlib are extras, the
Makefile's test target installs every extra the tests exercise, the examples import only what the core and
the extras the README has the user install provide, and the wheel's install hint names the installed gpuyard."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = ("gpuyard", "shared", "services")


def names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements}


def imports_of(module: str) -> dict[Path, list[ast.AST]]:
    """Where the project's packages import `module` (or a submodule): file -> the import statements."""
    found: dict[Path, list[ast.AST]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                targets = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                if any(t == module or t.startswith(f"{module}.") for t in targets):
                    found.setdefault(path.relative_to(ROOT), []).append(node)
    return found


def test_onnx_runtime_and_matplotlib_are_extras_not_core():
    extras = {name: names(reqs) for name, reqs in PROJECT["optional-dependencies"].items()}
    assert not {"onnxruntime", "onnxruntime-gpu", "matplotlib"} & names(PROJECT["dependencies"])
    assert extras["serving"] == {"onnxruntime"} and extras["gpu"] == {"onnxruntime-gpu"}
    assert extras["sim"] == {"matplotlib"}
    for path, nodes in imports_of("onnxruntime").items():  # where the core uses it, only when it serves
        assert not any(node in ast.parse((ROOT / path).read_text()).body for node in nodes), path


def test_matplotlib_is_imported_only_when_the_simulator_plots():
    found = imports_of("matplotlib")
    assert set(found) == {Path("shared/scheduling/sim/cli.py")}
    tree = ast.parse((ROOT / "shared/scheduling/sim/cli.py").read_text())
    assert not any(node in tree.body for node in found[Path("shared/scheduling/sim/cli.py")])  # in a function


def make_installs() -> list[set[str]]:
    """The extras each `pip install -e '.[…]'` of the Makefile installs: `make install`'s, then `make test`'s."""
    makefile = (ROOT / "Makefile").read_text()
    return [set(x.split(",")) for x in re.findall(r"pip install -q -e '\.\[([a-z,]+)\]'", makefile)]


def test_make_test_installs_the_extras_the_tests_use():
    install, test = make_installs()
    assert install == {"platform"}  # `make demo`: the platform, on which the README's examples run
    assert test == {"platform", "test", "train", "sim", "serving"}
    assert test <= set(PROJECT["optional-dependencies"])


SHIPPED_TRACE = (
    "openb_node_list_gpu_node.csv",
    "openb_pod_list_default.csv",
    "openb_pod_list_gpushare40.csv",
)
TRACE_DATA = "shared/scheduling/sim/traces"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install` would install, built from a copy of the project's own files."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    build = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"
    subprocess.run([sys.executable, "-c", build, str(out)], cwd=source, check=True, capture_output=True)
    (found,) = out.glob("gpuyard-*.whl")
    return found


def test_the_wheel_installs_one_import_package_gpuyard(wheel):
    """The services and the contracts install inside `gpuyard` (gpuyard.services, gpuyard.shared): nothing named
    `services` or `shared` lands at the top of site-packages, where another distribution's would clash."""
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        names = set(archive.namelist())
    assert tops == {"gpuyard", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert {
        "gpuyard/services/submit/__main__.py",
        "gpuyard/shared/contracts/events/jobs.py",
        "gpuyard/cli/__init__.py",
    } <= names


def test_the_wheel_ships_the_trace_with_its_license_and_citation(wheel):
    with zipfile.ZipFile(wheel) as archive:
        for name in (*SHIPPED_TRACE, "LICENSE-CC-BY-4.0.txt"):
            assert archive.read(f"gpuyard/{TRACE_DATA}/{name}") == (ROOT / TRACE_DATA / name).read_bytes(), (
                name
            )
        readme = archive.read(f"gpuyard/{TRACE_DATA}/README.md").decode()
    assert "CC BY 4.0" in readme and "@inproceedings" in readme and "alibaba/clusterdata" in readme


def test_the_readme_sim_command_works_from_the_installed_files_alone(wheel, tmp_path):
    """The README's `gpuyard sim --trace openb_pod_list_gpushare40.csv`, run from the wheel's files in a
    folder with no trace beside it (the default node list comes from the package too)."""
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    away = tmp_path / "elsewhere"
    away.mkdir()
    args = ["--trace", "openb_pod_list_gpushare40.csv", "--policy", "bestfit", "--seeds", "1", "--json"]
    run = subprocess.run(
        [sys.executable, "-m", "gpuyard.shared.scheduling.sim", *args],
        cwd=away,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["gpus"] == 6212 and set(result["policies"]) == {"fifo", "bestfit"}
    assert result["policies"]["bestfit"]["pods_mean"] > 8000  # drawn from the gpushare40 file


def test_from_a_wheel_the_plot_hint_names_the_installed_gpuyard(wheel, tmp_path):
    """Where gpuyard was installed from a wheel, `pip install 'gpuyard[sim]'` is the hint: pip finds gpuyard
    installed and adds the extra's packages (no registry has gpuyard itself)."""
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    hide_matplotlib = (
        "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'sim'; "
        "runpy.run_module('gpuyard.shared.scheduling.sim', run_name='__main__')"
    )
    run = subprocess.run(
        [sys.executable, "-c", hide_matplotlib, "--plot", str(tmp_path / "out.png")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("gpuyard sim: --plot needs matplotlib: ")
    assert run.stderr.rstrip().endswith(" install 'gpuyard[sim]'"), run.stderr


# ------------------------------------------------------------------------ the examples' dependencies

EXAMPLES = ROOT / "examples"
SPELLED_EXTRAS = re.compile(r"'\.\[([a-z0-9,_-]+)\]'")  # '.[train,serving]', as the README writes them
OPTIONAL_IMPORT = {"ImportError", "ModuleNotFoundError"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def readme_steps(text: str) -> list[str]:
    """The README as a reader follows it: every paragraph, and each code block with the paragraph just before
    it (which says what the block needs)."""
    pieces = re.split(r"(^```[^\n]*\n.*?^```[^\n]*$)", text, flags=re.M | re.S)
    steps = []
    paragraphs = [[p for p in re.split(r"\n\s*\n", piece) if p.strip()] for piece in pieces[::2]]
    for i, block in enumerate(pieces[1::2]):
        steps.append("\n".join([*paragraphs[i][-1:], block]))
    return steps + [p for prose in paragraphs for p in prose]


def example_scripts() -> list[Path]:
    return sorted(p for p in EXAMPLES.rglob("*.py") if "__pycache__" not in p.parts)


def names_of(script: Path) -> set[str]:
    """How the README may name a script: its path, or that of a job file whose command runs it."""
    path = script.relative_to(ROOT).as_posix()
    jobs = [p for p in EXAMPLES.rglob("*.yaml") if path in p.read_text()]
    return {path, *(job.relative_to(ROOT).as_posix() for job in jobs)}


def readme_extras(script: Path, readme: str) -> set[str] | None:
    """The extras the README tells the user to install for `script` (None: the README never names it)."""
    steps = [step for step in readme_steps(readme) if any(name in step for name in names_of(script))]
    if not steps:
        return None
    return {extra for step in steps for group in SPELLED_EXTRAS.findall(step) for extra in group.split(",")}


def third_party_imports(script: Path) -> set[str]:
    """The top-level modules `script` imports that are neither the standard library, nor GPUYARD's own, nor a
    file beside it; an import guarded by `except ImportError` is optional and left out."""
    tree = ast.parse(script.read_text())
    optional = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.Try)
        and any(
            h.type is not None
            and {getattr(t, "id", None) for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])}
            & OPTIONAL_IMPORT
            for h in node.handlers
        )
        for statement in node.body
        for inner in ast.walk(statement)
    }
    modules = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            modules.add(node.module.split(".")[0])
    return {
        m
        for m in modules
        if m not in sys.stdlib_module_names and m not in PACKAGES and not (script.parent / f"{m}.py").exists()
    }


def unprovided_imports(script: Path, project: dict, readme: str) -> list[str]:
    """The third-party modules of `script` that no distribution of the core dependencies, of the extras `make
    demo` installs (the README's first command) and of the extras the README names for it provides."""
    extras = (readme_extras(script, readme) or set()) | make_installs()[0]
    unknown = extras - set(project["optional-dependencies"])
    if unknown:
        return [f"the README names extras the project lacks: {sorted(unknown)}"]
    provided = {normalized(n) for n in names(project["dependencies"])}
    for extra in extras:
        provided |= {normalized(n) for n in names(project["optional-dependencies"][extra])}
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module in sorted(third_party_imports(script)):
        dists = {normalized(d) for d in providers.get(module, [])}
        if not dists:
            missing.append(f"{module}: not installed here, so no distribution can be named for it")
        elif not dists & provided:
            extras_said = ",".join(sorted(extras)) or "none"
            missing.append(
                f"{module} ({', '.join(sorted(dists))}): not in the core nor in extras {extras_said}"
            )
    return missing


@pytest.mark.parametrize("script", example_scripts(), ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_every_example_imports_only_what_the_readme_has_the_user_install(script):
    readme = (ROOT / "README.md").read_text()
    assert readme_extras(script, readme) is not None, f"the README never names {sorted(names_of(script))}"
    missing = unprovided_imports(script, PROJECT, readme)
    assert not missing, "\n".join(missing)


def test_the_examples_check_finds_a_client_missing_from_the_extras():
    """The train extra as it was before it carried Triton's client: infer.py's import is found wanting."""
    infer = EXAMPLES / "train-and-serve" / "infer.py"
    readme = (ROOT / "README.md").read_text()
    assert readme_extras(infer, readme) == {"train", "serving"}
    assert third_party_imports(infer) == {"numpy", "torch", "tritonclient"}
    extras = PROJECT["optional-dependencies"]
    before = {**PROJECT, "optional-dependencies": {**extras, "train": ["torch==2.13.0", "onnxscript"]}}
    assert unprovided_imports(infer, before, readme) == [
        "tritonclient (tritonclient): not in the core nor in extras platform,serving,train"
    ]
    assert third_party_imports(EXAMPLES / "ddp_train.py") == {"torch"}  # (gpuyard.training: optional)
    assert readme_extras(EXAMPLES / "ddp_train.py", readme) >= {"train"}
