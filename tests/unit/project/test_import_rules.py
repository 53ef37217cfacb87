"""The layering of the packages (docs/architecture.md's table), checked on the source: an import inside a
function, or by name through importlib, counts as much as one at the top.

- no service imports another (they talk only through the bus);
- `gpuyard.shared` imports nothing outside itself (no service, no supervisor, no client);
- the contracts import nothing of GPUYARD but the contracts;
- the scheduling core and its simulator touch no NATS, web framework, database or store;
- the client (the `gpuyard` CLI, `gpuyard.Client`) imports no service anywhere, and no server package at the
  top of a module (what `import gpuyard.client` or the CLI's start would pull in);
- the supervisor starts the services as programs (`python -P -m gpuyard.services.NAME`), never imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "__init__.py").exists())
SERVER_PACKAGES = (
    "nats",
    "fastapi",
    "starlette",
    "uvicorn",
    "pymongo",
    "kubernetes",
    "onnx",
    "onnxruntime",
    "numpy",
    "pynvml",
)


def module_name(path: Path) -> str:
    """The import name of a product file: services/ and shared/ are mapped into `gpuyard`."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("services", "shared"):
        parts = ["gpuyard", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, *, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`: import and from-import statements (those at the top of the
    module only, with `top_level_only`), and importlib.import_module / __import__ of a constant name."""
    nodes = ast.parse(source).body if top_level_only else ast.walk(ast.parse(source))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            not top_level_only
            and isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, str(node.args[0].value)))
    return sorted(found)


def within(module: str, *packages: str) -> bool:
    return any(f"{module}.".startswith(f"{package}.") for package in packages)


def broken_rules(name: str, source: str) -> list[str]:
    """Each import of `source` (the module `name`) that breaks a rule, with the rule."""
    found = []
    for line, module in imports(source):
        if within(name, "gpuyard.services"):
            own = ".".join(name.split(".")[:3])
            if within(module, "gpuyard.services", "services") and not within(module, own):
                found.append(f"line {line}: {module} (a service imports no other service)")
        elif (
            within(name, "gpuyard.shared.contracts")
            and within(module, "gpuyard")
            and not within(module, "gpuyard.shared.contracts")
        ):
            found.append(f"line {line}: {module} (the contracts import only the contracts)")
        if (
            within(name, "gpuyard.shared")
            and within(module, "gpuyard", "services", "shared")
            and not within(module, "gpuyard.shared")
        ):
            found.append(f"line {line}: {module} (shared imports nothing outside itself)")
        if within(name, "gpuyard.shared.scheduling") and (
            within(module, *SERVER_PACKAGES[:6], "httpx", "gpuyard.shared.stores", "gpuyard.shared.bus")
        ):
            found.append(f"line {line}: {module} (the scheduling core does no I/O)")
        if within(name, "gpuyard.supervisor") and within(module, "gpuyard.services", "services"):
            found.append(f"line {line}: {module} (the supervisor starts services as programs)")
        if is_client(name) and within(module, "gpuyard.services", "services"):
            found.append(f"line {line}: {module} (the client imports no service)")
    if is_client(name):
        found += [
            f"line {line}: {module} (the client imports no server package at the top)"
            for line, module in imports(source, top_level_only=True)
            if within(module, *SERVER_PACKAGES, "gpuyard.shared.bus", "gpuyard.shared.stores")
        ]
    return found


def is_client(name: str) -> bool:
    return within(name, "gpuyard") and not within(
        name, "gpuyard.services", "gpuyard.shared", "gpuyard.supervisor", "gpuyard.docsgen"
    )


PRODUCT = sorted(p for top in ("gpuyard", "services", "shared") for p in (ROOT / top).rglob("*.py"))


def test_the_rules_find_each_kind_of_break():
    """Each rule on a module made of breaks, beside imports that are allowed."""
    service = (
        "import os\nimport gpuyard.services.submit.app\nfrom gpuyard.services.scheduler import view\n"
        "def f():\n    import importlib\n    importlib.import_module('gpuyard.services.executor')\n"
        "from gpuyard.shared.contracts import events\nimport services\n"
    )
    assert broken_rules("gpuyard.services.submit.routes", service) == [
        "line 3: gpuyard.services.scheduler (a service imports no other service)",
        "line 6: gpuyard.services.executor (a service imports no other service)",
        "line 8: services (a service imports no other service)",
    ]
    contract = (
        "from gpuyard.shared.contracts.units import x\nfrom gpuyard.shared.stores import y\nimport pydantic\n"
    )
    assert broken_rules("gpuyard.shared.contracts.api", contract) == [
        "line 2: gpuyard.shared.stores (the contracts import only the contracts)"
    ]
    core = "import numpy\nfrom gpuyard.shared.stores.events import base\nimport nats.js\nimport gpuyard.supervisor.up\n"
    assert broken_rules("gpuyard.shared.scheduling.cycle", core) == [
        "line 2: gpuyard.shared.stores.events (the scheduling core does no I/O)",
        "line 3: nats.js (the scheduling core does no I/O)",
        "line 4: gpuyard.supervisor.up (shared imports nothing outside itself)",
    ]
    client = (
        "import httpx\nimport numpy as np\nfrom gpuyard.shared.bus.jetstream import Bus\n"
        "def plot():\n    import numpy\n    from gpuyard.services.serving import v2app\n"
    )
    assert broken_rules("gpuyard.cli", client) == [
        "line 6: gpuyard.services.serving (the client imports no service)",
        "line 2: numpy (the client imports no server package at the top)",
        "line 3: gpuyard.shared.bus.jetstream (the client imports no server package at the top)",
    ]
    assert broken_rules("gpuyard.supervisor.up", "import gpuyard.services.submit.main\nimport nats\n") == [
        "line 1: gpuyard.services.submit.main (the supervisor starts services as programs)"
    ]


def test_the_product_holds_every_layer_the_rules_name():
    names = {module_name(p) for p in PRODUCT}
    for package in (
        "gpuyard.shared.contracts",
        "gpuyard.shared.scheduling",
        "gpuyard.supervisor",
        "gpuyard.cli",
    ):
        assert any(within(name, package) for name in names), package
    assert SERVICES == ["executor", "monitor", "scheduler", "serving", "submit"]


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_keeps_the_rules(path):
    assert broken_rules(module_name(path), path.read_text()) == []
