"""The package rules, read from the real imports (`ast`, imports inside functions included) and sizes.

Data flows one way: NVML -> inventory -> resources -> servers. A module imports only from areas of a lower
rank in RANKS (never one of its own rank or higher): so only `__main__` imports `cli/`, and `cli/` may
import anything. `plugin/` is the generic framework and imports nothing GPU-specific. No import cycle
between modules; no hand-written module over 400 lines, no function over 60 (generated *_pb2* aside).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nvidia_device_plugin"
BENCH = PACKAGE.parent / "bench"

RANKS = {  # area (top-level module or package) -> rank; "" is the package itself (__version__)
    **dict.fromkeys(("", "errors", "logs", "workers", "atomicfile", "fswatch", "signals", "api"), 0),
    **dict.fromkeys(("config", "devices", "plugin"), 1),
    **dict.fromkeys(("events", "nvml", "mig_layout"), 2),  # nvml/sim/ is part of nvml
    "resources": 3,
    **dict.fromkeys(("resource_plans", "health", "sharing", "devnodes"), 4),
    **dict.fromkeys(("serving", "cdi"), 5),  # one rank: neither imports the other; both read devnodes
    "snapshot": 6,
    **dict.fromkeys(("labels", "mps_control", "configmanager", "metrics", "probes"), 7),
    "daemon": 8,
    "cli": 9,
    "__main__": 10,
}
PLUGIN_MAY_IMPORT = {"", "errors", "logs", "workers", "atomicfile", "fswatch", "signals", "api"}

# Violations being fixed in parallel (issue 20), each in its helper's area; the lead empties this set.
KNOWN_VIOLATIONS = {
    "cdi.scan imports serving.allocate",  # serving: device-node facts move to devnodes.py
    "cdi.spec imports serving.allocate",  # serving
    "plugin.manager imports events",  # nvml: plugin/ gets its own events Protocol
    "plugin.server imports events",  # nvml
    "cycle plugin.protocol -> plugin.server",  # nvml: handlers() moves into plugin/server.py
    "nvml/discovery.py:_gpu has over 60 lines",  # nvml
    "serving/allocate.py:_container_response has over 60 lines",  # serving: Allocate as named steps
    "health/monitor.py has over 400 lines",  # workers
    "sharing/mps_daemon.py has over 400 lines",  # workers
    "nvml/discovery.py has over 400 lines",  # nvml
    "nvml/sim/simulator.py has over 400 lines",  # nvml
    "plugin/manager.py has over 400 lines",  # nvml
    "serving/allocate.py has over 400 lines",  # serving
    "serving/preferred.py has over 400 lines",  # serving
}


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, anywhere in the file ("config.v1", "" for the package)."""
    paths = {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix("__init__").rstrip("."): p
        for p in PACKAGE.rglob("*.py")
        if "_pb2" not in p.name
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}:{node.lineno}: write imports absolute"
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] != "nvidia_device_plugin":
                    continue
                name = name.removeprefix("nvidia_device_plugin").removeprefix(".")
                while name not in paths:  # `from pkg.mod import name`: the module is pkg.mod
                    name = name.rpartition(".")[0]
                graph[module].add(name)
        graph[module].discard(module)
    return graph


def _area(module: str) -> str:
    return module.split(".")[0]


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for other in graph[todo.pop()] - seen:
            seen.add(other)
            todo.append(other)
    return seen


def _import_violations(graph: dict[str, set[str]]) -> set[str]:
    found = set()
    for module, imported in graph.items():
        for other in imported:
            mine, theirs = _area(module), _area(other)
            gpu_specific = mine == "plugin" and theirs not in PLUGIN_MAY_IMPORT
            if mine != theirs and (RANKS[theirs] >= RANKS[mine] or gpu_specific):
                found.add(f"{module} imports {other}")
    reach = {module: _reachable(graph, module) for module in graph}
    for module in graph:
        if module in reach[module]:
            found.add("cycle " + " -> ".join(sorted(m for m in reach[module] if module in reach[m])))
    return found


def _length(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return (function.end_lineno or function.lineno) - function.lineno + 1


def _size_violations() -> set[str]:
    found = set()
    for path in [*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")]:
        if "_pb2" in path.name:  # generated by grpc_tools.protoc
            continue
        name = str(path.relative_to(PACKAGE if path.is_relative_to(PACKAGE) else BENCH.parent))
        text = path.read_text()
        if len(text.splitlines()) > 400:
            found.add(f"{name} has over 400 lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _length(node) > 60:
                found.add(f"{name}:{node.name} has over 60 lines")
    return found


def test_every_area_has_a_rank() -> None:
    areas = {_area(module) for module in _graph()}
    assert sorted(areas - RANKS.keys()) == [], "give each new package or top-level module a rank in RANKS"


def test_the_package_rules_hold() -> None:
    new = sorted((_import_violations(_graph()) | _size_violations()) - KNOWN_VIOLATIONS)
    assert new == [], "\n".join(new)
