"""
HARNESS: the edit format. Parses a proposer's answer (a DESCRIPTION line, then SEARCH/REPLACE blocks) and applies
it to train.py's text; the one path every proposer's answer takes, LLM or random/grid. Pure text in, text out:
never touches files, git or the ledger.
"""

import ast
import re
from pathlib import Path

from harness.ledger import SMOKE_LABEL

BLOCK_RE = re.compile(r"^<{7} SEARCH[ \t]*\n(.*?)^={7}[ \t]*\n(.*?)^>{7} REPLACE[ \t]*$", re.S | re.M)


class EditError(Exception):
    """An answer that cannot be applied to train.py; the message goes back to the LLM verbatim."""


def apply_answer(answer, train_src, frozen=("prepare.py",)):
    """Parse an answer and apply its edits to train_src.

    Returns (description, new_source). Raises EditError (message meant for the LLM) when the DESCRIPTION line or
    the blocks are missing, a block names a file other than train.py, a SEARCH does not match exactly once, the
    result is unchanged, or the result does not parse as Python."""
    answer = answer.replace("\r\n", "\n")
    m = re.search(r"^\s*DESCRIPTION:[ \t]*(.*\S)", answer, re.M)
    if not m:
        raise EditError('the answer has no "DESCRIPTION: ..." line')
    description = clean_description(m.group(1))
    for name in re.findall(r"^\s*FILE:[ \t]*(\S+)", answer, re.M):
        if Path(name).name != "train.py":
            raise EditError(f"the answer edits {name}, but only train.py may change ({', '.join(frozen)} and "
                            "every other file are read-only)")
    blocks = BLOCK_RE.findall(answer)
    if not blocks:
        raise EditError("the answer has no <<<<<<< SEARCH / ======= / >>>>>>> REPLACE block")
    if len(blocks) != answer.count("<<<<<<< SEARCH"):
        raise EditError("a block is malformed: every <<<<<<< SEARCH line needs a ======= line and a "
                        ">>>>>>> REPLACE line")
    source = train_src
    for i, (search, replace) in enumerate(blocks, 1):
        if not search.strip():
            raise EditError(f"edit {i}: the SEARCH section is empty")
        count = source.count(search)
        if count != 1:
            first = search.strip().splitlines()[0]
            if count == 0:
                raise EditError(f"edit {i}: the SEARCH text starting {first!r} does not occur in train.py; copy the "
                                "lines exactly, including indentation")
            raise EditError(f"edit {i}: the SEARCH text starting {first!r} occurs {count} times in train.py; "
                            "add surrounding lines so that it matches exactly once")
        source = source.replace(search, replace, 1)
    if source == train_src:
        raise EditError("the edits leave train.py unchanged")
    try:
        ast.parse(source)
    except SyntaxError as e:
        raise EditError(f"the edited train.py does not parse: {e.msg} (line {e.lineno})") from None
    return description, source


def clean_description(text):
    """One line of printable text, at most 200 characters: safe for a results.tsv cell, a commit subject and a
    terminal. Control characters (NUL, which git refuses; ESC and BEL, which drive terminals; C1 codes) become
    spaces, and runs of whitespace (tabs, newlines) one space."""
    text = "".join(c if c.isprintable() else " " for c in text)
    return SMOKE_LABEL.sub("", " ".join(text.split()))[:200]   # that label is the harness's (smoke runs)
