"""
Tests of the documentation (README.md, docs/*.md, and the two program.md for the commands they give an agent):
every relative link points at a file (and heading) that exists, every `uv run agent.py / report.py / prepare.py ...`
command they show names a script that exists and uses only flags its parser has (read from its own --help, run once
each), the --help commands they point to run, and the README stays short. The recipe that trains (docs/grpo.md's
offline GRPO block) is run line by line in tests/test_grpo.py.
"""

import concurrent.futures
import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BRIEFS = [REPO / "program.md", REPO / "grpo" / "program.md"]     # an external agent runs what these say
README_MAX_LINES = 200
CHECKED = ("agent.py", "report.py", "prepare.py")    # the scripts whose flags are checked against their parser
SEPARATORS = {"&&", "||", ";", "|", "&"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(\s*)(```|~~~)")


def rel(path):
    return path.relative_to(REPO).as_posix()


def doc_cwd(doc, fenced):
    """The directory a page's commands run in: the repository root; grpo/ for grpo/program.md, and for the prose of
    docs/grpo.md (its fenced blocks say `cd grpo` themselves)."""
    if doc == REPO / "grpo" / "program.md" or doc == REPO / "docs" / "grpo.md" and not fenced:
        return REPO / "grpo"
    return REPO


def fenced_blocks(text):
    """[(first line number, [lines])] of the fenced code blocks of a markdown text."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            if current is None:
                current, start = [], number + 1
            else:
                blocks.append((start, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def prose(text):
    """The text outside fenced code blocks."""
    lines, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            lines.append("")
        else:
            lines.append("" if inside else line)
    return "\n".join(lines)


def commands_of(line):
    """The simple commands of one shell line (comments dropped; split at &&, ||, ;, |, &), each a token list, or
    None when the line does not parse as shell. Placeholders such as <tag> stand for one word."""
    line = re.sub(r"<[A-Za-z][\w .-]*>", "PLACEHOLDER", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return None
    commands = [[]]
    for token in tokens:
        if token in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def uv_runs(doc):
    """(doc:line, the script's path, its arguments) for every `uv run X.py ...` in doc: in fenced blocks (following
    `cd` within a block) and in inline code spans of the prose."""
    text = doc.read_text()
    found = []

    def scan(where, line, cwd):
        for command in commands_of(line) or []:
            while command and (command[0] in ("(", ")") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", command[0])):
                command = command[1:]                       # a subshell's parenthesis, VAR=value prefixes
            if not command:
                continue
            if command[0] == "cd" and len(command) > 1:
                cwd = (cwd / command[1]).resolve()
            elif command[:2] == ["uv", "run"] and len(command) > 2 and command[2].endswith(".py"):
                args = []
                for token in command[3:]:
                    if re.fullmatch(r"[<>|&()0-9]*[<>][<>|&()0-9]*", token):   # a redirection: the rest is not argv
                        break
                    args.append(token)
                found.append((where, (cwd / command[2]).resolve(), args))
        return cwd

    for start, lines in fenced_blocks(text):
        cwd = doc_cwd(doc, fenced=True)
        for offset, line in enumerate(lines):
            if "uv run" in line or line.lstrip().startswith("cd "):
                cwd = scan(f"{rel(doc)}:{start + offset}", line, cwd)
    outside = prose(text)
    for match in re.finditer(r"`([^`]+)`", outside):
        span = " ".join(match.group(1).split())
        if span.startswith("uv run ") or re.match(r"[A-Z_]+=\S+ uv run ", span):
            scan(f"{rel(doc)}:{outside.count(chr(10), 0, match.start()) + 1}", span, doc_cwd(doc, fenced=False))
    return found


@functools.lru_cache(maxsize=None)
def help_text(script, *argv):
    """`python script [argv] --help`, run once: (exit code, output)."""
    p = subprocess.run([sys.executable, script.name, *argv, "--help"], cwd=script.parent, capture_output=True,
                       text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def flags(args):
    """The options an argv uses: tokens starting with '-' (not negative numbers), without '=value'."""
    return [a.split("=", 1)[0] for a in args if a.startswith("-") and a != "-" and not re.fullmatch(r"-[\d.]+", a)]


def has_flag(text, flag):
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc):
    return {slug(line.lstrip("#")) for line in prose(doc.read_text()).splitlines() if re.match(r"#{1,6} ", line)}


# ---------------------------------------------------------------------------


def test_each_map_of_harness_names_every_module():
    """harness/__init__.py and docs/architecture.md each list every module of harness/ (in its subpackage); the
    README's layout names each subpackage."""
    paths = [p.relative_to(REPO).as_posix() for p in sorted((REPO / "harness").rglob("*.py")) if p.stem != "__init__"]
    maps = {"harness/__init__.py": lambda path: rf"^\s+{Path(path).stem}\s", "docs/architecture.md": re.escape}
    for name, pattern in maps.items():
        text = (REPO / name).read_text()
        missing = [path for path in paths if not re.search(pattern(path), text, re.M)]
        assert missing == [], f"{name} does not name {missing}"
    packages = sorted(p.parent.name for p in (REPO / "harness").glob("*/__init__.py"))
    assert len(packages) == 5 and [p for p in packages if not re.search(rf"^\s+{p}/\s", (REPO / "README.md").read_text(),
                                                                         re.M)] == []


def test_the_readme_is_short():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_the_readme_and_each_docs_page_link_only_to_what_exists():
    assert len(DOCS) > 5, DOCS
    broken = []
    for doc in DOCS:
        for number, line in enumerate(prose(doc.read_text()).splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):            # http(s), mailto: not checked offline
                    continue
                path, _, anchor = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                if not dest.exists():
                    broken.append(f"{rel(doc)}:{number}: {target} (no {path})")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{rel(doc)}:{number}: {target} (no heading #{anchor} in {rel(dest)})")
    assert not broken, "\n".join(broken)


def test_every_command_the_docs_show_names_a_script_and_flags_that_exist():
    runs = [run for doc in DOCS + BRIEFS for run in uv_runs(doc)]
    shown = {script.name for _, script, _ in runs}
    assert set(CHECKED) <= shown and len(runs) >= 20, (shown, len(runs))   # the scan finds what the docs show
    helps = {(script, "try") if script.name == "agent.py" and args[:1] == ["try"] else (script,)
             for _, script, args in runs if script.name in CHECKED and script.is_file()}
    with concurrent.futures.ThreadPoolExecutor(len(helps)) as pool:    # each --help once, side by side
        list(pool.map(lambda argv: help_text(*argv), helps))
    wrong = []
    for where, script, args in runs:
        if not script.is_file():
            wrong.append(f"{where}: {rel(script) if script.is_relative_to(REPO) else script} does not exist")
            continue
        if script.name not in CHECKED:
            continue
        sub = ("try",) if script.name == "agent.py" and args[:1] == ["try"] else ()
        rc, text = help_text(script, *sub)
        assert rc == 0, f"{rel(script)} {' '.join(sub)} --help exited {rc}:\n{text[-2000:]}"
        for flag in flags(args):
            if not has_flag(text, flag):
                wrong.append(f"{where}: {' '.join([rel(script), *sub])} has no {flag} (uv run {rel(script)} "
                             f"{shlex.join(args)})")
    assert not wrong, "\n".join(wrong)


def test_the_help_the_docs_point_to_runs():
    """`uv run agent.py --help`, `agent.py try --help`, `report.py --help` (the docs send readers there instead of
    copying flag tables) exit 0 and describe the flags."""
    for argv, expect in ((("agent.py",), "--max-experiments"), (("agent.py", "try"), "--baseline"),
                         (("report.py",), "--holdout")):
        rc, text = help_text(REPO / argv[0], *argv[1:])
        assert rc == 0 and has_flag(text, expect), text[-2000:]
