"""The sizes of the containers a long-lived component holds, to show that they do not grow with the jobs."""

from __future__ import annotations

from collections import deque


def containers(root: object, name: str, modules: tuple[str, ...], depth: int) -> dict[str, int]:
    """Size of every container held by `root` and by its parts (objects of `modules`, `depth` levels down),
    by attribute path from `name`."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def visit(obj: object, path: str, depth: int) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        names = list(getattr(obj, "__dict__", {})) + [
            slot for cls in type(obj).__mro__ for slot in getattr(cls, "__slots__", ())
        ]
        for attribute in names:
            value = getattr(obj, attribute, None)
            ours = type(value).__module__.startswith(modules)
            if isinstance(value, dict | set | frozenset | list | deque) or (
                ours and hasattr(value, "__len__")
            ):
                sizes[f"{path}.{attribute}"] = len(value)
            if ours and depth:
                visit(value, f"{path}.{attribute}", depth - 1)

    visit(root, name, depth)
    return sizes
