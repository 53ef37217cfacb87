"""The client package (the repository's gpuyard/ folder) never imports a service (gpuyard.services): it talks to the API and runs the simulator as a
program. Checked on the source, so an import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuyard

PACKAGE = Path(gpuyard.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


def is_service(module: str) -> bool:
    """Whether `module` is a service's (gpuyard.services.*), or the folder's own name (services.*)."""
    return module.split(".")[0] == "services" or f"{module}.".startswith("gpuyard.services.")


def service_imports(source: str) -> list[str]:
    """Every module of `services` the source imports: import and from-import statements anywhere, and
    importlib.import_module / __import__ of a constant name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names = [str(node.args[0].value)]
        else:
            continue
        found += [f"line {node.lineno}: {name}" for name in names if is_service(name)]
    return found


def test_the_check_finds_imports_at_the_top_inside_functions_and_by_name():
    source = (
        "import os\nimport gpuyard.services.submit\nfrom gpuyard.services.scheduler import sim\n"
        "def f():\n    from gpuyard.services.scheduler.sim import cli\n    import importlib\n"
        "    importlib.import_module('gpuyard.services.executor')\n    return __import__('services')\n"
        "from shared import api\nimport servicesx\n"
    )
    assert service_imports(source) == [
        "line 2: gpuyard.services.submit",
        "line 3: gpuyard.services.scheduler",
        "line 5: gpuyard.services.scheduler.sim",
        "line 7: gpuyard.services.executor",
        "line 8: services",
    ]


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_of_the_client_imports_a_service(module):
    assert service_imports(module.read_text()) == []
