"""The shape of the house, read from the source of server_plugin/.

- Arrows: `core/` imports nothing of ours outside `core/`; `store/` knows no concept; nothing but
  `app.py` and `cli.py` imports `api/`; `retrieval/` and `jobs/` import nothing of `story/`; the
  base modules (services, hooks, errors, priority, placement, clock, settings) import nothing of ours.
- No import cycle between modules.
- No module is imported for its side effects only: every binding an import makes is used.
- Concepts register explicitly: every module with a top-level `register(jobs, hooks)` is in
  `app.CONCEPTS`, and every concept there has one.
- Modules stay readable: at most MAX_LINES lines, but for an explicit allowlist.
- Each table has one owning module (its docstring says `Owns: <tables>.`); SQL naming a table
  appears only in its owner, but for the documented exceptions below.

Pure AST analysis: nothing of server_plugin/ is imported, no app is built. An import under
`if TYPE_CHECKING:` is no dependency (it never runs); an import inside a function is one (it
runs when the function does, and a cycle through it is a cycle all the same).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "server_plugin"
SOURCE = ROOT / PACKAGE

# Modules that sit under every room: they import nothing of ours at run time (services imports
# hooks, whose `Hooks` every Services carries).
BASE = ("services", "hooks", "errors", "priority", "placement", "clock", "settings")
BASE_ALLOWED = {("services", "hooks")}

MAX_LINES = 550  # "about 500": a module longer than this becomes a package
# Modules over MAX_LINES today. Shrink it; never grow it. (The assembler, over it as one module, is
# a package: its budget rules live in core/assemble/__init__.py, its types and its text measuring
# beside it.)
TOO_LONG: dict[str, str] = {}

# SQL naming a table outside its owner, each on purpose. (module, table): why.
SHARED_TABLES = {
    # Who knows what is decided only in visibility, which sits below the story concepts and so
    # cannot ask them: it reads the facts knowledge comes from (members, messages and what cites
    # them) and reads and writes the `known_by` of the items a character may be told about (by
    # table name too, which no scan sees: visibility._TABLES).
    ("server_plugin/retrieval/visibility.py", "chat_members"): "who shares a chat (RV5, witnesses)",
    ("server_plugin/retrieval/visibility.py", "messages"): "a message's seq from its id",
    ("server_plugin/retrieval/visibility.py", "episode_sources"): "the messages an item came from",
    ("server_plugin/retrieval/visibility.py", "memories"): "known_by and sources of saved memories",
    ("server_plugin/retrieval/visibility.py", "episodes"): "known_by of episodes",
    ("server_plugin/retrieval/visibility.py", "lore"): "known_by of lore entries",
    ("server_plugin/retrieval/visibility.py", "characters"): "known_by of sheet secrets",
    # The search index takes the cast's names out of texts before embedding them.
    ("server_plugin/retrieval/docs.py", "characters"): "every character's name and aliases",
    # The re-embedding after a change of model joins its staged vectors to the rows (id, rev)
    # from a cursor: every row read into Python at each step took 150-360 ms at 100,000 rows.
    ("server_plugin/retrieval/reembed.py", "docs"): "the rows without the new model's vector",
}
# Modules that touch every table by design: the schema itself, and the whole-store document.
# (store/migrations/ is a package: one module per migration.)
ALL_TABLES = ("server_plugin/store/portable.py",)
SCHEMA = "server_plugin/store/migrations/"


# --- reading the source -------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    """One dependency: `source` imports `target` (both dotted module names) at `line`."""

    source: str
    target: str
    line: int
    lazy: bool  # inside a function: runs when it is called

    def __str__(self) -> str:
        return f"{path_of(self.source)}:{self.line} imports {self.target}{' (lazily)' if self.lazy else ''}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {module_name(p): p for p in sorted(SOURCE.rglob("*.py"))}


def path_of(name: str) -> str:
    return str(modules()[name].relative_to(ROOT)) if name in modules() else name


@lru_cache(maxsize=None)
def tree(name: str) -> ast.Module:
    return ast.parse(modules()[name].read_text(encoding="utf-8"))


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(name: str, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if modules()[name].name == "__init__.py" else name.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Our modules an import statement loads (`from pkg import mod` loads pkg.mod)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
    base = _absolute(name, node)
    if base.split(".")[0] != PACKAGE:
        return []
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else base for a in node.names]


def _walk_imports(name: str, nodes: Iterable[ast.AST], lazy: bool) -> Iterable[Import]:
    for node in nodes:
        if isinstance(node, ast.If) and _type_checking(node.test):
            yield from _walk_imports(name, node.orelse, lazy)  # the body is for type checkers
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in dict.fromkeys(_targets(name, node)):
                yield Import(name, target, node.lineno, lazy)
        else:
            inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _walk_imports(name, ast.iter_child_nodes(node), inner)


@lru_cache(maxsize=None)
def imports(name: str) -> tuple[Import, ...]:
    """What a module imports of ours at run time (module level and inside functions)."""
    return tuple(_walk_imports(name, tree(name).body, False))


def all_imports() -> list[Import]:
    return [i for name in modules() for i in imports(name)]


def room(name: str) -> str:
    """'server_plugin.story.messages' -> 'story'; 'server_plugin.app' -> 'app'."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations(source: Callable[[str], bool], target: Callable[[str], bool]) -> list[str]:
    return [str(i) for i in all_imports() if source(i.source) and target(i.target)]


# --- arrows -------------------------------------------------------------------------------------
def test_core_imports_nothing_of_ours_outside_core():
    assert violations(lambda s: room(s) == "core", lambda t: room(t) != "core") == []


def test_store_knows_no_concept():
    concepts = {"story", "retrieval", "jobs", "api"}
    assert violations(lambda s: room(s) == "store", lambda t: room(t) in concepts) == []


def test_only_app_and_cli_import_api():
    callers = {"app", "cli", "api"}  # modules inside api/ may import each other
    assert violations(lambda s: room(s) not in callers, lambda t: room(t) == "api") == []


def test_retrieval_and_jobs_import_nothing_of_story():
    assert violations(lambda s: room(s) in ("retrieval", "jobs"), lambda t: room(t) == "story") == []


def test_base_modules_import_nothing_of_ours():
    found = [str(i) for i in all_imports() if room(i.source) in BASE
             and (room(i.source), room(i.target)) not in BASE_ALLOWED]
    assert found == []


# --- cycles -------------------------------------------------------------------------------------
def find_cycle(graph: dict[str, list[Import]]) -> list[Import] | None:
    """One import cycle (the imports that close it, in order), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[Import] = []

    def visit(name: str) -> list[Import] | None:
        state[name] = 1
        for edge in graph.get(name, []):
            if state.get(edge.target) == 1:
                start = next(i for i, e in enumerate(path) if e.source == edge.target) \
                    if edge.target != name else len(path)
                return path[start:] + [edge]
            if edge.target not in state:
                path.append(edge)
                found = visit(edge.target)
                if found:
                    return found
                path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return None


def test_no_import_cycle():
    graph = {name: [i for i in imports(name) if i.target in modules() and i.target != name]
             for name in modules()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle:\n  " + "\n  ".join(str(i) for i in cycle or [])


def test_find_cycle_reports_the_cycle():
    edges = [Import("a", "b", 1, False), Import("b", "c", 2, True), Import("c", "a", 3, False)]
    graph = {"a": [edges[0]], "b": [edges[1]], "c": [edges[2]], "d": []}
    assert find_cycle(graph) == edges
    assert find_cycle({"a": [edges[0]], "b": []}) is None


# --- no import for side effects -----------------------------------------------------------------
def _bindings(name: str) -> list[tuple[str, int]]:
    """(bound name, line) of every import of ours, type-checking ones included."""
    out = []
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.Import):
            out += [((a.asname or a.name).split(".")[0], node.lineno) for a in node.names
                    if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom) and _absolute(name, node).split(".")[0] == PACKAGE:
            out += [(a.asname or a.name, node.lineno) for a in node.names if a.name != "*"]
    return out


def _annotation_names(node: ast.expr | None) -> set[str]:
    """Names used in an annotation, string annotations ("Services") included."""
    if node is None:
        return set()
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                found |= _annotation_names(ast.parse(sub.value, mode="eval").body)
            except SyntaxError:
                pass
    return found


def _used_names(module: ast.Module) -> set[str]:
    used: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.arg):
            used |= _annotation_names(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            used |= _annotation_names(node.returns)
        elif isinstance(node, ast.AnnAssign):
            used |= _annotation_names(node.annotation)
    return used


def _exported(module: ast.Module) -> set[str]:
    """The names of a top-level `__all__` list or tuple."""
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


def unused_imports(name: str) -> list[str]:
    module = tree(name)
    used = _used_names(module) | _exported(module)
    return [f"{path_of(name)}:{line} imports {bound} and never uses it"
            for bound, line in _bindings(name) if bound not in used]


def test_every_import_is_used():
    assert [u for name in modules() for u in unused_imports(name)] == []


# --- concepts register explicitly ----------------------------------------------------------------
def concepts() -> dict[str, str]:
    """The names in app.CONCEPTS and the modules they are bound to by app.py's imports."""
    app = f"{PACKAGE}.app"
    bound = {}
    for node in tree(app).body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                target = f"{_absolute(app, node)}.{a.name}"
                bound[a.asname or a.name] = target if target in modules() else _absolute(app, node)
    listed = next(node.value for node in tree(app).body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "CONCEPTS" for t in node.targets))
    return {e.id: bound.get(e.id, "?") for e in listed.elts}  # type: ignore[attr-defined]


def registers(name: str) -> bool:
    """The module defines a top-level `register(jobs, hooks)`."""
    return any(isinstance(node, ast.FunctionDef) and node.name == "register"
               and [a.arg for a in node.args.args] == ["jobs", "hooks"] for node in tree(name).body)


def test_every_registering_module_is_a_concept_and_every_concept_registers():
    listed = concepts()
    assert "?" not in listed.values(), f"CONCEPTS names what app.py does not import: {listed}"
    missing = sorted(path_of(n) for n in modules() if registers(n) and n not in listed.values())
    assert missing == [], "register(jobs, hooks) but not in app.CONCEPTS"
    idle = sorted(f"{k} ({path_of(v)})" for k, v in listed.items() if not registers(v))
    assert idle == [], "in app.CONCEPTS without a register(jobs, hooks)"


# --- size ---------------------------------------------------------------------------------------
def test_modules_stay_under_the_line_limit():
    sizes = {path_of(n): len(p.read_text(encoding="utf-8").splitlines()) for n, p in modules().items()}
    too_long = sorted(f"{p}: {n} lines" for p, n in sizes.items() if n > MAX_LINES and p not in TOO_LONG)
    assert too_long == [], f"over {MAX_LINES} lines (split them)"
    shrunk = sorted(p for p in TOO_LONG if sizes.get(p, 0) <= MAX_LINES)
    assert shrunk == [], "no longer too long (or gone): take them off TOO_LONG"


# --- tables and their owners --------------------------------------------------------------------
CREATE = re.compile(r"\bCREATE (?:VIRTUAL )?TABLE (?:IF NOT EXISTS )?(\w+)")
# A table named by SQL (our SQL is written in capitals; prose in docstrings is not).
NAMED = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+\"?(\w+)")
OWNS = re.compile(r"^\s*Owns: ([\w, ]+)\.\s*$", re.MULTILINE)


def _strings(module: ast.Module) -> Iterable[tuple[str, int]]:
    """Every string constant but docstrings, with its line."""
    docstrings = {id(n.body[0].value) for n in ast.walk(module)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(module):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value, node.lineno


@lru_cache(maxsize=None)
def schema_tables() -> frozenset[str]:
    steps = [n for n in modules() if n.startswith(f"{PACKAGE}.store.migrations")]
    return frozenset(t for n in steps for s, _ in _strings(tree(n)) for t in CREATE.findall(s))


def owners() -> dict[str, list[str]]:
    """Table -> the modules whose docstring says they own it."""
    out: dict[str, list[str]] = {}
    for name in modules():
        doc = ast.get_docstring(tree(name)) or ""
        for match in OWNS.finditer(doc):
            for table in (t.strip() for t in match.group(1).split(",")):
                out.setdefault(table, []).append(path_of(name))
    return out


def test_every_table_has_one_owner():
    found = owners()
    assert sorted(t for t in schema_tables() if len(found.get(t, [])) != 1) == [], found
    assert sorted(set(found) - schema_tables()) == [], "owners of tables the schema does not create"


def test_only_its_owner_names_a_table():
    owner_of = {t: paths[0] for t, paths in owners().items()}
    strays = []
    for name in modules():
        path = path_of(name)
        if path in ALL_TABLES or path.startswith(SCHEMA):
            continue
        for text, line in _strings(tree(name)):
            for table in NAMED.findall(text):
                if table in schema_tables() and owner_of.get(table) != path \
                        and (path, table) not in SHARED_TABLES:
                    strays.append(f"{path}:{line} names {table} (owned by {owner_of.get(table)})")
    assert strays == []


def test_shared_tables_are_still_shared():
    used = {(path_of(n), t) for n in modules() for s, _ in _strings(tree(n)) for t in NAMED.findall(s)}
    assert sorted(k for k in SHARED_TABLES if k not in used) == [], "no longer shared: take them off"


# --- one SQLite library per process ---------------------------------------------------------------
def test_only_the_store_picks_the_sqlite_library():
    """store/db.py picks the SQLite library (the stdlib's where it loads extensions, else
    pysqlite3); every other module and test takes `sqlite3` from it. Two copies of SQLite in one
    process do not see each other's locks (POSIX locks belong to the process, and each copy keeps
    its own table of them): the second takes itself for the store's only connection, resets the
    WAL index the first has mapped, and the first dies of SIGBUS. That killed a CI run in
    tests/test_upgrade.py, which read a store open in the test's app with the stdlib's sqlite3."""
    direct = re.compile(r"^\s*(?:import sqlite3\b|from sqlite3 import)", re.MULTILINE)
    files = [*SOURCE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    offenders = sorted(str(p.relative_to(ROOT)) for p in files
                       if p != SOURCE / "store" / "db.py" and "fixtures" not in p.parts
                       and direct.search(p.read_text(encoding="utf-8")))
    assert offenders == [], "take sqlite3 from server_plugin.store.db"


# --- locks a paused background thread might hold ---------------------------------------------------
# Raw threading locks allowed, each on purpose. path: why.
RAW_LOCKS = {
    "server_plugin/priority.py": "priority's own condition and the lock inside priority.Lock",
    "server_plugin/store/db.py": "the write lock, whose holder is marked by priority.writing()",
}


def test_the_sidecars_locks_mark_their_holder():
    """rule OP4: a background thread pauses at its calls while a request is in flight, unless it
    holds something a request may wait for. So every lock of the sidecar is a priority.Lock (its
    holder counts as holding) — except core/'s, which guard built-in operations only (no Python
    call, hence no pause, while held), and those of RAW_LOCKS."""
    raw = re.compile(r"threading\.(?:Lock|RLock|Semaphore|BoundedSemaphore)\(|threading\.Condition\(\)")
    offenders = sorted(path_of(n) for n, p in modules().items()
                       if raw.search(p.read_text(encoding="utf-8")) and path_of(n) not in RAW_LOCKS
                       and not path_of(n).startswith(f"{PACKAGE}/core/"))
    assert offenders == [], "use priority.Lock() (or say why in RAW_LOCKS)"
    still = sorted(p for p in RAW_LOCKS if not raw.search((ROOT / p).read_text(encoding="utf-8")))
    assert still == [], "no raw lock left there: take it off RAW_LOCKS"
