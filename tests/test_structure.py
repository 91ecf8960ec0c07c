"""
Tests of the code's structure, read from the source (no run): every event name the repository writes or compares is
one of harness/schema.py's, and each of those is used; ledger.log_event refuses any other name.
"""

import ast
from pathlib import Path

import pytest

from harness import ledger, schema
from harness.schema import NAMES, Event

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"tag", "run", "judge", "propose", "record"}     # harness/'s subpackages, one per phase
SOURCES = [REPO / "agent.py", REPO / "report.py", *sorted((REPO / "harness").rglob("*.py")),
           *sorted((REPO / "bench").glob("*.py")), *sorted((REPO / "grpo").glob("*.py"))]
WRITERS = {"log", "event", "log_event"}         # session.log(name), Watch.event(name), ledger.log_event(path, tag, name)


def trees():
    for path in SOURCES:
        yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text(), str(path))


def is_event_field(node):
    """e["event"] or e.get("event")."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "event"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "event")


def named(node):
    """The event names a written or compared expression stands for: a str constant, Event.X, or a tuple/set of
    them; [] for anything else (a variable: checked at run time by schema.check)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Event":
        return [getattr(Event, node.attr, f"Event.{node.attr} (undefined)")]
    if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
        return [name for elt in node.elts for name in named(elt)]
    return []


def test_every_event_name_written_or_compared_is_in_the_schema():
    """Each name passed to a writer (first argument of .log / .event, third of log_event) and each name an "event"
    field is compared with, across agent.py, report.py, harness/, bench/ and grpo/."""
    unknown, seen = [], 0
    for where, tree in trees():
        for node in ast.walk(tree):
            found = []
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
                fname = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                at = 2 if fname == "log_event" else 0
                if fname in WRITERS and len(node.args) > at:
                    found = named(node.args[at])
            elif isinstance(node, ast.Compare) and is_event_field(node.left):
                found = [name for c in node.comparators for name in named(c)]
            unknown += [f"{where}:{node.lineno}: {name!r}" for name in found if name not in NAMES]
            seen += len(found)
    assert seen > 60, seen                          # the scan sees the writers and readers (about 120 today)
    assert unknown == [], "not in harness/schema.py's Event:\n" + "\n".join(unknown)


def test_each_event_name_in_the_schema_is_used():
    """No dead names: each Event constant is written or read somewhere outside schema.py."""
    used = set()
    for where, tree in trees():
        if where != "harness/schema.py":
            used |= {getattr(Event, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id == "Event" and hasattr(Event, n.attr)}
    assert sorted(NAMES - used) == []
    assert len(NAMES) == 41 and "run_end" in NAMES and "experiment" in NAMES


def test_log_event_refuses_a_name_outside_the_schema_and_writes_nothing(tmp_path):
    path = tmp_path / "events.jsonl"
    ledger.log_event(path, "t", Event.RUN_END, n=1)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"'run_ended' is not an event name: add it to harness/schema.py"):
        ledger.log_event(path, "t", "run_ended", n=1)
    assert path.read_bytes() == before
    assert before.count(b"\n") == 1 and b'"event": "run_end", "tag": "t", "n": 1' in before


def test_the_readers_select_by_kind_and_tag():
    events = [{"event": "run", "tag": "a", "n": 1}, {"event": "run_end", "tag": "a", "n": 1},
              {"event": "run_end", "tag": "b", "n": 1}, {"event": "experiment", "tag": "a", "n": 1},
              {"event": "run_end", "tag": "a", "n": 2}, {"bad": True}]
    assert schema.of(events, Event.RUN_END) == [events[1], events[2], events[4]]
    assert schema.of(events, Event.RUN_END, tag="a") == [events[1], events[4]]
    assert schema.of(events, Event.RUN, Event.EXPERIMENT, tag="a") == [events[0], events[3]]
    assert schema.last(events, Event.RUN_END, tag="b") is events[2]
    assert schema.last(events, Event.STOP) is None
    with pytest.raises(ValueError, match="'runs' is not an event name"):
        schema.of(events, "runs")


def harness_imports():
    """{module of harness/: the harness modules and top-level scripts it imports}, at any depth (a function's lazy
    import counts); a subpackage imported whole (`from harness import record`) is named with a slash ("record/")."""
    scripts = {"agent", "report", "prepare", "train"}
    graph = {}
    for path in sorted((REPO / "harness").rglob("*.py")):
        if path.stem == "__init__":
            continue
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == "harness" and (len(parts) == 1 or parts[1] in PACKAGES) and len(parts) <= 2:
                    found |= {a.name for a in node.names}           # from harness(.run) import runner, ...
                elif parts[0] == "harness":
                    found.add(parts[-1])                            # from harness.run.runner import Kind
                elif parts[0] in scripts:
                    found.add(parts[0] + ".py")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    top = a.name.split(".")
                    found.add(top[-1] if top[0] == "harness" and len(top) > 1 else
                              top[0] + ".py" if top[0] in scripts else "")
        graph[path.stem] = {f"{d}/" if d in PACKAGES else d for d in found} - {"", path.stem}
    return graph


def package_of():
    """{module: its subpackage of harness/ ("" for the records every phase shares at harness/'s top)}."""
    return {path.stem: "" if path.parent.name == "harness" else path.parent.name
            for path in (REPO / "harness").rglob("*.py") if path.stem != "__init__"}


def test_harness_imports_no_script_and_has_no_import_circle():
    graph = harness_imports()
    assert len(graph) >= 40 and "ledger" in graph["experiment"]
    scripts = {m: sorted(d for d in deps if d.endswith(".py")) for m, deps in graph.items()}
    assert {m: d for m, d in scripts.items() if d} == {}, "harness/ imports a top-level script"
    circles, state = [], {}

    def visit(m, path):                 # depth-first; a module met again on the current path closes a circle
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                circles.append(path[path.index(d):] + [d])
            elif d in graph and d not in state:
                visit(d, path + [d])
        state[m] = "done"
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_the_run_and_judging_packages_import_nothing_of_the_tag_proposing_or_recording():
    """A run and a verdict stand on the shared records alone: harness/run and harness/judge import nothing of
    harness/tag, harness/propose or harness/record (lazy imports included), so a backend or a rule can be read,
    tested and shipped to a node without the loop's state."""
    graph, where = harness_imports(), package_of()
    assert set(where.values()) == PACKAGES | {""} and where["runner"] == "run" and where["ledger"] == ""
    above = {"tag", "propose", "record"}
    upward = {m: sorted(d for d in deps if (d[:-1] if d.endswith("/") else where.get(d)) in above)
              for m, deps in graph.items() if where[m] in {"run", "judge"}}
    assert {m: d for m, d in upward.items() if d} == {}


def test_every_command_has_one_parser_and_one_entry_in_the_table():
    """agent.py's commands are one table (agent.COMMANDS: what runs on the opened tag) and their parsers another
    (settings.SUBCOMMANDS; the loop's is parse_args): each parsed command names an entry."""
    import agent
    from harness.tag import settings
    assert set(agent.COMMANDS) == {"loop", *settings.SUBCOMMANDS}
    assert settings.parse(["--tag", "t", "--proposer", "random"]).command == "loop"
    for name in settings.SUBCOMMANDS:
        assert settings.parse([name, "--tag", "t", "-m", "x"]).command == name


MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 500, 110, 60     # lines (issue 38: "~500, ~100, ~60"), docstrings included


def test_no_module_class_or_function_of_harness_is_over_its_size():
    """A module of harness/ fits in one reading (MAX_MODULE lines), a class MAX_CLASS, a function MAX_FUNCTION;
    agent.py reads like program.md's loop in at most 300 lines."""
    over = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(REPO).as_posix()
        if len(source.splitlines()) > MAX_MODULE:
            over.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            most = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
            if most is not None and node.end_lineno - node.lineno + 1 > most:
                over.append(f"{name}: {node.name} {node.end_lineno - node.lineno + 1} lines")
    assert over == []
    assert len((REPO / "agent.py").read_text().splitlines()) <= 300
