"""Structural gates for the agent/ package, read with `ast` only (nothing is imported or run):
the layers docs/ARCHITECTURE.md declares (no import upward, lazy ones included; no two
sub-packages importing each other), no import cycles, a real sub-package layout, no names that
shadow builtins; a warning (not a failure) for modules over WARN_LINES lines."""

from __future__ import annotations

import ast
import builtins
import re
import warnings
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from functools import cache
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[1] / "agent"
ARCHITECTURE = AGENT.parent / "docs" / "ARCHITECTURE.md"
WARN_LINES = 500  # a module this long probably holds more than one noun: a warning, not a gate
MIN_SUBPACKAGES = 5
BUILTIN_NAMES = frozenset(name for name in dir(builtins) if not name.startswith("_"))

Graph = Mapping[str, Iterable[str]]


@cache
def agent_modules() -> dict[str, tuple[Path, str, ast.Module]]:
    """Dotted name -> (file, source, tree) for every module under agent/; packages by __init__."""
    found = {}
    for path in sorted(AGENT.rglob("*.py")):
        parts = path.relative_to(AGENT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        source = path.read_text(encoding="utf-8")
        found[".".join(parts)] = (path, source, ast.parse(source, str(path)))
    return found


def resolve(target: str, known: Collection[str]) -> str | None:
    """The longest prefix of a dotted name that is a known module, or None."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def imported_modules(
    tree: ast.AST, name: str, is_package: bool, known: Collection[str]
) -> set[str]:
    """Known modules that `name` imports anywhere in its body, lazy imports included.

    `from agent.pkg import mod` resolves to agent.pkg.mod when that is a module, else agent.pkg.
    """
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: max(0, package.count(".") + 2 - node.level)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in (resolve(t, known) for t in targets) if t and t != name)
    return found


def import_graph() -> tuple[dict[str, set[str]], set[str]]:
    """The import graph of agent/ and the set of its packages."""
    modules = agent_modules()
    packages = {name for name, (path, _, _) in modules.items() if path.name == "__init__.py"}
    graph = {
        name: imported_modules(tree, name, name in packages, modules)
        for name, (_, _, tree) in modules.items()
    }
    return graph, packages


def edges(graph: Graph, packages: Collection[str], node: str) -> list[str]:
    """Imports of `node` that can close a cycle: not itself, and not (for a package) its children."""
    return [
        dep
        for dep in graph.get(node, ())
        if dep != node and not (node in packages and dep.startswith(node + "."))
    ]


def find_cycles(graph: Graph, packages: Collection[str] = ()) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in edges(graph, packages, node):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def cycle_path(graph: Graph, packages: Collection[str], members: list[str]) -> list[str]:
    """One concrete import loop through the first member of a cycle, for the failure message."""
    start, inside = members[0], set(members)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for dep in edges(graph, packages, node):
            if dep == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if dep in inside and dep not in came_from:
                came_from[dep] = node
                queue.append(dep)
    return members


@pytest.mark.parametrize(
    ("graph", "packages", "expected"),
    [
        pytest.param({"a": {"b"}, "b": {"c"}, "c": {"a"}}, (), [["a", "b", "c"]], id="cycle"),
        pytest.param({"a": {"b", "c"}, "b": {"c"}, "c": set()}, (), [], id="dag"),
        pytest.param({"a": {"a"}}, (), [], id="self-import"),
        pytest.param(
            {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"d", "f"}, "f": set()},
            (),
            [["a", "b"], ["d", "e"]],
            id="two-cycles",
        ),
        pytest.param(
            {"agent.p": {"agent.p.m"}, "agent.p.m": {"agent.p"}},
            {"agent.p"},
            [],
            id="package-init-imports-own-child",
        ),
        pytest.param(
            {"agent.p": {"agent.p.m"}, "agent.p.m": {"agent.p"}},
            (),
            [["agent.p", "agent.p.m"]],
            id="same-edges-not-a-package",
        ),
        pytest.param(
            {"agent.p": {"agent.px"}, "agent.px": {"agent.p"}},
            {"agent.p"},
            [["agent.p", "agent.px"]],
            id="name-prefix-is-not-a-child",
        ),
    ],
)
def test_find_cycles(graph, packages, expected):
    """The cycle finder reports every loop, passes DAGs, and ignores self-imports and a package
    __init__ importing its own sub-modules, so the cycle gate below cannot pass vacuously."""
    assert find_cycles(graph, packages) == expected
    for members in expected:
        path = cycle_path(graph, packages, members)
        assert path[0] == path[-1] == members[0] and set(path) == set(members)


KNOWN = {"agent", "agent.errors", "agent.pkg", "agent.pkg.mod", "agent.pkg.sub", "agent.other"}


@pytest.mark.parametrize(
    ("source", "name", "is_package", "expected"),
    [
        ("import agent.pkg.mod", "agent.other", False, {"agent.pkg.mod"}),
        ("from agent.pkg import mod, helper", "agent.other", False, {"agent.pkg.mod", "agent.pkg"}),
        ("from agent.pkg.mod import thing", "agent.other", False, {"agent.pkg.mod"}),
        ("from . import sub", "agent.pkg.mod", False, {"agent.pkg.sub"}),
        ("from .sub import x", "agent.pkg", True, {"agent.pkg.sub"}),
        ("from ..errors import E", "agent.pkg.mod", False, {"agent.errors"}),
        ("def f():\n    from agent.other import x", "agent.pkg.mod", False, {"agent.other"}),
        ("import os\nfrom rich import print", "agent.other", False, set()),
        ("from agent.other import y", "agent.other", False, set()),
    ],
)
def test_imported_modules(source, name, is_package, expected):
    """Absolute, relative and function-local imports resolve to the agent modules they load."""
    assert imported_modules(ast.parse(source), name, is_package, KNOWN) == expected


def test_no_import_cycles():
    """No set of agent modules imports each other in a loop (lazy imports count): loops make
    import order matter and break on partial initialisation."""
    graph, packages = import_graph()
    assert len(graph) >= 10 and any(graph.values()), "agent/ import graph looks empty"
    loops = [" -> ".join(cycle_path(graph, packages, c)) for c in find_cycles(graph, packages)]
    assert not loops, "import cycles among agent modules:\n" + "\n".join(loops)


def test_long_modules_are_named():
    """A module is as long as its one noun needs; one over WARN_LINES lines is named (a warning)."""
    long = {
        name: len(source.splitlines())
        for name, (_, source, _) in agent_modules().items()
        if len(source.splitlines()) > WARN_LINES
    }
    if long:
        report = ", ".join(f"{name} ({count})" for name, count in sorted(long.items()))
        warnings.warn(f"modules over {WARN_LINES} lines: {report}", stacklevel=1)


# -- layers -------------------------------------------------------------------------------
def layer_of(module: str) -> str:
    """The part of agent/ a module belongs to: its sub-package, or the top-level module itself
    (agent.errors -> errors); '' for the agent package's own __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def declared_layers(text: str) -> dict[str, int]:
    """docs/ARCHITECTURE.md's `## Layers` section: numbered lines, lowest first, each naming
    its parts in backticks before an em dash ("3. `plan` — what will run")."""
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    for line in section.splitlines():
        found = re.match(r"\s*(\d+)\.\s+(.*)", line)
        if found:
            for name in re.findall(r"`([\w.]+)`", found.group(2).split(" — ")[0]):
                layers[name] = int(found.group(1))
    return layers


def layer_violations(graph: Graph, layers: Mapping[str, int]) -> list[str]:
    """Imports from one part of agent/ to another that is not in a lower layer (lazy imports
    count: the graph holds every import in a module's body)."""
    found = []
    for module, deps in sorted(graph.items()):
        here = layer_of(module)
        for dep in sorted(deps):
            there = layer_of(dep)
            if not here or not there or here == there:
                continue
            if layers.get(there, 10**6) >= layers.get(here, -1):
                found.append(
                    f"{module} -> {dep} ({here}, layer {layers.get(here)} -> {there}, "
                    f"layer {layers.get(there)})"
                )
    return found


def mutual_imports(graph: Graph) -> list[tuple[str, str]]:
    """Pairs of parts of agent/ that import each other (in either direction, any module)."""
    pairs = {
        (layer_of(module), layer_of(dep))
        for module, deps in graph.items()
        for dep in deps
        if layer_of(module) and layer_of(dep) and layer_of(module) != layer_of(dep)
    }
    return sorted((a, b) for a, b in pairs if (b, a) in pairs and a < b)


LAYERS_DOC = """
## Layers (lowest first)
1. `errors` — errors
2. `world`, `plan` — two in one line
3. `node` — membership; `run` named after the dash is not declared here

## Next section
4. `later` — not part of the layers
"""


def test_declared_layers_reads_the_numbered_lines():
    assert declared_layers(LAYERS_DOC) == {"errors": 1, "world": 2, "plan": 2, "node": 3}


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        pytest.param({"agent.node.a": {"agent.plan.b"}}, [], id="downward"),
        pytest.param({"agent.node.a": {"agent.node.b"}}, [], id="within-a-package"),
        pytest.param({"agent.plan.b": {"agent.node.a"}}, ["agent.plan.b"], id="upward"),
        pytest.param({"agent.plan.b": {"agent.world.c"}}, ["agent.plan.b"], id="same-layer"),
        pytest.param({"agent.node.a": {"agent.nowhere.x"}}, ["agent.node.a"], id="undeclared"),
    ],
)
def test_layer_violations(graph, expected):
    """Only imports into a lower layer pass, so the gate below cannot pass vacuously."""
    layers = {"errors": 1, "world": 2, "plan": 2, "node": 3}
    assert [v.split(" ")[0] for v in layer_violations(graph, layers)] == expected


def test_mutual_imports():
    graph = {"agent.a.x": {"agent.b.y"}, "agent.b.z": {"agent.a.w"}, "agent.c.q": {"agent.a.x"}}
    assert mutual_imports(graph) == [("a", "b")]


def test_every_import_goes_down_the_declared_layers():
    """docs/ARCHITECTURE.md declares the layers; every sub-package and top-level module is in one,
    and no import (lazy ones included) reaches a part in the same or a higher layer."""
    layers = declared_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    graph, _ = import_graph()
    parts = {layer_of(m) for m in graph} - {""}
    assert not parts - set(layers), f"not in docs/ARCHITECTURE.md's layers: {parts - set(layers)}"
    wrong = layer_violations(graph, layers)
    assert not wrong, "imports against the declared layers:\n" + "\n".join(wrong)


def test_no_two_subpackages_import_each_other():
    graph, _ = import_graph()
    pairs = mutual_imports(graph)
    assert not pairs, f"sub-packages that import each other: {pairs}"


def test_agent_has_subpackages():
    """agent/ is organised into at least MIN_SUBPACKAGES sub-packages rather than a flat list."""
    subpackages = sorted(init.parent.name for init in AGENT.glob("*/__init__.py"))
    assert len(subpackages) >= MIN_SUBPACKAGES, f"only {len(subpackages)}: {subpackages}"


def test_no_builtin_names():
    """No agent module or top-level function is named after a Python builtin (input, exec, ...),
    which would shadow it for readers and for code that imports the name."""
    clashes = []
    for name, (_, _, tree) in agent_modules().items():
        if name.rpartition(".")[2] in BUILTIN_NAMES:
            clashes.append(f"module {name}")
        clashes += [
            f"function {node.name} in {name} (line {node.lineno})"
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name in BUILTIN_NAMES
        ]
    assert not clashes, "names that shadow builtins: " + ", ".join(clashes)


def private_reaches(modules: Mapping[str, tuple[Path, str, ast.Module]]) -> list[str]:
    """`obj._name` where `_name` is not defined in obj's sub-package: a private attribute
    reached from another package (self/cls and dunders aside; `os._exit` & co. are the
    standard library's own spelling)."""
    defined: dict[str, set[str]] = {}
    for name, (_, _, tree) in modules.items():
        package = ".".join(name.split(".")[:2])
        names = defined.setdefault(package, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    found = []
    for name, (_, _, tree) in modules.items():
        package = ".".join(name.split(".")[:2])
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            if node.attr.startswith("__") or node.attr in STDLIB_PRIVATE:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in defined[package]:
                found.append(f"{name}:{node.lineno} .{node.attr}")
    return sorted(found)


# The standard library's own private names we call on purpose: a warm rank ends and runs its
# script as the interpreter would (atexit, threading, runpy — agent.warm.script).
STDLIB_PRIVATE = frozenset(
    {"_exit", "_getframe", "_current_frames", "_asdict", "_replace", "_fields"}
    | {"_run_exitfuncs", "_shutdown", "_run_module_as_main"}
    # exit finalisers: a fast exit drops torch's operator deregistration and keeps the others
    | {"_registry"}
    # io's C bases: isinstance on io's ABCs over torch's 165K objects costs 0.36 s at exit
    | {"_IOBase", "_TextIOBase", "_BufferedIOBase"}
    # torch offers no public way to a rank's flight recorder nor to its groups' members: the
    # probe in each rank (agent.hang.probe) reads them where torch's own debug tools do.
    | {"_C", "_distributed_c10d", "_world", "_get_process_group_name"}
)


def test_no_private_attribute_is_reached_from_another_package():
    assert private_reaches(agent_modules()) == []


def test_private_reaches_finds_a_reach_across_packages():
    tree = {
        "agent.a.x": (Path("x"), "", ast.parse("class A:\n    def _own(self): self._v = 1\n")),
        "agent.b.y": (Path("y"), "", ast.parse("def f(a):\n    a._own(); a.public; a._v\n")),
        "agent.a.z": (Path("z"), "", ast.parse("def g(a):\n    return a._v, os._exit\n")),
    }
    assert private_reaches(tree) == ["agent.b.y:2 ._own", "agent.b.y:2 ._v"]


def test_no_module_function_is_a_method_in_exile():
    """A module-level function whose first parameter is `self` is a method of some other
    object, reaching into it untyped: it belongs in a class."""
    exiled = [
        f"{name}.{node.name}"
        for name, (_, _, tree) in agent_modules().items()
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.args.args
        and node.args.args[0].arg == "self"
    ]
    assert exiled == []


def test_a_run_reaches_its_node_only_through_the_seat():
    """agent.run never imports the node agent itself: what a run needs is agent.node.seat."""
    graph, _ = import_graph()
    reaching = sorted(
        m
        for m, targets in graph.items()
        if m.startswith("agent.run") and "agent.node.agent" in targets
    )
    assert reaching == []


# The failure record's owner (agent.node.failure: `Kind`, `Failure`): no other module builds or
# compares a dict by a "kind" key; a reader matches on `Kind`, so a new kind shows every one.
RECORDS = frozenset({"agent/node/failure.py"})
_KIND_KEY = re.compile(r"""["']kind["']""")


def kind_keys(modules: Mapping[str, tuple[Path, str, ast.Module]]) -> list[str]:
    """`"kind"` as a string anywhere outside the records module (a key built, read or named)."""
    return [
        f"{path.relative_to(AGENT.parent).as_posix()}:{number}"
        for path, source, _ in modules.values()
        if path.relative_to(AGENT.parent).as_posix() not in RECORDS
        for number, line in enumerate(source.splitlines(), 1)
        if _KIND_KEY.search(line)
    ]


def test_no_kind_key_outside_the_records_module():
    assert kind_keys(agent_modules()) == []


def test_kind_keys_finds_a_record_spelt_by_hand():
    tree = {
        "agent.run.x": (AGENT / "run" / "x.py", 'r = {"kind": "lost"}\nr.get(\'kind\')\n', None),
        "agent.node.failure": (AGENT / "node" / "failure.py", '{"kind": "rank"}\n', None),
    }
    assert kind_keys(tree) == ["agent/run/x.py:1", "agent/run/x.py:2"]


def test_no_message_text_decides():
    """Tampering is a field of the record (Failure.tampering, NodeOutput.tampered), never a
    prefix of its message."""
    found = [
        f"{name}:{number}"
        for name, (_, source, _) in agent_modules().items()
        for number, line in enumerate(source.splitlines(), 1)
        if re.search(r"\.startswith\(\s*TAMPERING", line)
    ]
    assert found == []


# -- the log dir's file names: one owner -------------------------------------------------
LOG_DIR_OWNER = "agent.plan.log_dir"
# A file name of the log dir spelled as code (a literal, an f-string's or a pattern's text):
# summary.json & co. whole, a rank file's or an agent log's stem, the stacks file.
FILE_NAME_LITERAL = re.compile(
    r"(summary|ranks|control)\.json|metrics\.prom|\.summary-reserve"
    r"|(^|[./])rank-$|rank-\{|rank-\(|rank-\\d|(^|[./])agent-$|agent-\{|agent-\\d|stacks-a"
)


def code_strings(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, text) of every string constant that is code: docstrings are prose, and so is a
    string with a space in it (a help text, a log line naming a file for people)."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and " " not in node.value
    ]


def file_name_literals(modules: Mapping[str, tuple[Path, str, ast.Module]]) -> list[str]:
    """Where a module other than the log dir's owner spells one of its files' names."""
    return sorted(
        f"{name}:{line} {text!r}"
        for name, (_, _, tree) in modules.items()
        if name != LOG_DIR_OWNER
        for line, text in code_strings(tree)
        if FILE_NAME_LITERAL.search(text)
    )


@pytest.mark.parametrize(
    ("source", "found"),
    [
        pytest.param('p = os.path.join(d, "summary.json")', ["1 'summary.json'"], id="literal"),
        pytest.param('p = f"{d}/rank-{r:05d}.out"', ["1 '/rank-'"], id="f-string"),
        pytest.param(r'R = re.compile(r"rank-(\d+)\.out")', [r"1 'rank-(\\d+)\\.out'"], id="re"),
        pytest.param('p = d + "/stacks-a1.txt"', ["1 '/stacks-a1.txt'"], id="stacks"),
        pytest.param('P = "agent-{i:05d}.log"', ["1 'agent-{i:05d}.log'"], id="agent-log"),
        pytest.param('"""summary.json, read."""\nx = 1', [], id="docstring"),
        pytest.param('help = "needs ranks.json or summary.json"', [], id="prose"),
        pytest.param('flag = "--rank-prefix"', [], id="an-option"),
    ],
)
def test_file_name_literals_finds_a_spelled_name(source, found):
    modules = {"agent.x.y": (Path("y"), source, ast.parse(source))}
    assert [f.split(":", 1)[1] for f in file_name_literals(modules)] == found


def test_the_log_dir_names_its_files_once():
    """summary.json, ranks.json, control.json, metrics.prom, the rank files, the agent logs
    and the stacks files are named in agent.plan.log_dir only: every writer and reader asks a
    `LogDir`, so no two can disagree on a name."""
    assert LOG_DIR_OWNER in agent_modules()
    assert file_name_literals(agent_modules()) == []


# -- scheduler variables ------------------------------------------------------------------
# A Slurm or OpenMPI variable's name (or a prefix of such names) as a whole string: what a module
# reads a variable by (env.get, env[...], `in`, a prefix it matches names against). Prose that
# mentions one (help text, an error line) is no whole name and passes.
SCHEDULER_NAME = re.compile(r"(SLURM[A-Z]*|OMPI)_[A-Z0-9_]*\*?")


def scheduler_names(modules: Mapping[str, tuple[Path, str, ast.Module]]) -> list[str]:
    """Modules outside agent.world that spell a scheduler variable's name: where the world comes
    from is world/'s to read; the others get the values (a World, world.shell) passed in.
    (bootstrap/ is outside agent/: it writes sbatch scripts whose text names them.)"""
    found = []
    for name, (_, _, tree) in modules.items():
        if layer_of(name) == "world":
            continue
        found += [
            f"{name}:{node.lineno} {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and SCHEDULER_NAME.fullmatch(node.value)
        ]
    return sorted(found)


def test_scheduler_variables_are_read_only_in_world():
    assert scheduler_names(agent_modules()) == []


def test_scheduler_names_finds_a_read_outside_world():
    def module(source: str) -> tuple[Path, str, ast.Module]:
        return Path("m"), source, ast.parse(source)

    modules = {
        "agent.plan.a": module(
            'x = env.get("SLURM_GPUS_ON_NODE")\ny = "OMPI_COMM_WORLD_RANK" in env'
        ),
        "agent.control.b": module('P = ("SLURMD_", "PMI_")\nz = os.environ[f"SLURM_{k}"]'),
        "agent.serve.c": module('"""From SLURM_JOB_ID."""\nHELP = "default: SLURM_JOB_ID\'s"'),
        "agent.world.d": module('job = env.get("SLURM_JOB_ID")'),
    }
    assert scheduler_names(modules) == [
        "agent.control.b:1 'SLURMD_'",
        "agent.control.b:2 'SLURM_'",
        "agent.plan.a:1 'SLURM_GPUS_ON_NODE'",
        "agent.plan.a:2 'OMPI_COMM_WORLD_RANK'",
    ]


# -- the control plane's seam -------------------------------------------------------------
SEAT_PROTOCOLS = ("RunSeat", "ControlSeat", "Joining")  # agent.node.seat, agent.node.control_seat
SEAT_MODULES = ("agent.node.seat", "agent.node.control_seat")
# What a joined node holds beyond its seat: never imported by serve/ or control/.
NODE_INSIDES = frozenset(
    {
        "agent.node.agent",
        "agent.node.joined",
        "agent.node.membership",
        "agent.node.reporter",
        "agent.node.store",
    }
)


def _seat_of(annotation: ast.expr | None) -> str | None:
    """The seat Protocol an annotation names (`ControlSeat` or "ControlSeat"), else None."""
    if isinstance(annotation, ast.Name):
        name = annotation.id
    elif isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        name = annotation.value
    else:
        return None
    return name if name in SEAT_PROTOCOLS else None


def seat_members(
    modules: Mapping[str, tuple[Path, str, ast.Module]],
) -> dict[str, dict[str, str | None]]:
    """Each seat Protocol's members, inherited ones included → the seat a member yields (a
    method returning one, `Joining.connect`), else None."""
    own: dict[str, tuple[list[str], dict[str, str | None]]] = {}
    for module in SEAT_MODULES:
        for node in modules[module][2].body:
            if isinstance(node, ast.ClassDef) and node.name in SEAT_PROTOCOLS:
                members: dict[str, str | None] = {}
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members[item.target.id] = _seat_of(item.annotation)
                    elif isinstance(item, ast.FunctionDef):
                        members[item.name] = _seat_of(item.returns)
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                own[node.name] = ([b for b in bases if b in SEAT_PROTOCOLS], members)

    def every(name: str) -> dict[str, str | None]:
        bases, members = own[name]
        found: dict[str, str | None] = {}
        for base in bases:
            found |= every(base)
        return found | members

    return {name: every(name) for name in own}


def _pairs(node: ast.Assign) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) of an assignment, `a, b = x, y` taken pairwise."""
    found = []
    for target in node.targets:
        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            found += list(zip(target.elts, node.value.elts, strict=False))
        else:
            found.append((target, node.value))
    return found


def seat_reaches(
    tree: ast.Module, name: str, members: Mapping[str, Mapping[str, str | None]]
) -> tuple[list[str], int]:
    """Attributes a module reads on its node's seat that the seat's Protocol does not declare,
    and how many it reads in all. A seat is a parameter or variable annotated with a seat
    Protocol, a variable a seat's method returned (`seat = agent.connect()`), or an object's
    attribute one was stored in (`self.seat = seat`: then `<anything>.seat.<attr>`)."""
    held: dict[str, str] = {}  # attribute names seats are kept under → their Protocol
    bound_in: list[tuple[ast.AST, dict[str, str]]] = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = function.args
        bound = {
            a.arg: seat
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
            if (seat := _seat_of(a.annotation)) is not None
        }
        for _ in range(2):  # a variable bound from another, once more
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.AnnAssign)
                    and isinstance(node.target, ast.Name)
                    and (seat := _seat_of(node.annotation)) is not None
                ):
                    bound[node.target.id] = seat
                if not isinstance(node, ast.Assign):
                    continue
                for target, value in _pairs(node):
                    call = value.func if isinstance(value, ast.Call) else None
                    if (
                        isinstance(target, ast.Name)
                        and isinstance(call, ast.Attribute)
                        and isinstance(call.value, ast.Name)
                        and call.value.id in bound
                        and (seat := members[bound[call.value.id]].get(call.attr)) is not None
                    ):
                        bound[target.id] = seat
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(value, ast.Name)
                        and value.id in bound
                    ):
                        held[target.attr] = bound[value.id]
        bound_in.append((function, bound))
    wrong, reads = [], 0

    def check(node: ast.Attribute, seat: str) -> None:
        nonlocal reads
        reads += 1
        if node.attr not in members[seat]:
            wrong.append(f"{name}:{node.lineno} .{node.attr} ({seat} declares no such member)")

    for function, bound in bound_in:
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
            ):
                check(node, bound[node.value.id])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in held
        ):
            check(node, held[node.value.attr])
    return sorted(set(wrong)), reads


def _reaches_node(module: str) -> bool:
    return module.startswith(("agent.serve", "agent.control"))


def test_serve_and_control_reach_their_node_only_through_its_seat():
    """agent.serve and agent.control hold their node as a seat (agent.node.control_seat: the
    Protocols `Joining` and `ControlSeat`), import none of what a joined node holds, and read
    no attribute of it that the Protocol does not declare."""
    graph, _ = import_graph()
    inside = sorted(
        f"{m} -> {t}" for m, ts in graph.items() if _reaches_node(m) for t in ts & NODE_INSIDES
    )
    assert inside == []
    members = seat_members(agent_modules())
    assert {"client_key", "node_scope", "publish_endpoint", "scope", "lost"} <= set(
        members["ControlSeat"]
    )
    wrong, reads = [], 0
    for name, (_, _, tree) in agent_modules().items():
        if _reaches_node(name):
            found, count = seat_reaches(tree, name, members)
            wrong, reads = wrong + found, reads + count
    assert wrong == []
    assert reads >= 30, f"only {reads} reads of a seat found: is the check still looking?"


SEAT_SOURCE = """
def serve(agent: Joining, other: "ControlSeat") -> None:
    seat = agent.connect()
    seat.meet()
    seat.membership.scope.put("x", {})
    agent.meet()
    other.keys.client_key
    runner = Runner(seat)
    runner.seat.reporter
    agent.farewell(None, "why")

class Runner:
    def __init__(self, seat: ControlSeat) -> None:
        self.seat, self.other = seat, 1

    def run(self) -> None:
        self.seat.store.wait([], 1.0)
        self.seat.idle()
        self.other.store
"""


def test_seat_reaches_finds_what_the_protocol_does_not_declare():
    members = {
        "Joining": {"connect": "ControlSeat", "farewell": None},
        "ControlSeat": {"meet": None, "idle": None, "scope": None},
    }
    wrong, reads = seat_reaches(ast.parse(SEAT_SOURCE), "m", members)
    assert [w.split(" (")[0] for w in wrong] == [
        "m:17 .store",
        "m:5 .membership",
        "m:6 .meet",
        "m:7 .keys",
        "m:9 .reporter",
    ]
    assert reads == 9
