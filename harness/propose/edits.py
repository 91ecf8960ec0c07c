"""
HARNESS: the edit format. Parses a proposer's answer (a DESCRIPTION line, then SEARCH/REPLACE blocks) and applies
it to train.py's text; the one path every proposer's answer takes, LLM or random/grid. Pure text in, text out:
never touches files, git or the ledger.
"""

import ast
import difflib
import hashlib
import io
import re
import tokenize
from pathlib import Path

from harness.ledger import LABELS

MARKERS = ("<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE")   # each alone on its line (trailing blanks allowed)
MAX_ANSWER_CHARS = 200_000       # an answer may rewrite train.py (~30 KB) several times over, not flood the parser
MAX_BLOCKS = 200
# Invisible characters an answer may carry before or inside its DESCRIPTION line (a BOM, zero-width characters, bidi
# controls): removed from the lines before the first block, so that the line is found and its words are what shows.
INVISIBLE = re.compile("[\ufeff\u200b-\u200f\u2060-\u2064\u202a-\u202e\u2066-\u2069\u00ad]")
EMPTY_DESCRIPTION = "describe the idea in a few words"     # an empty description, wherever it comes from (try -m too)
MALFORMED = ("a block is malformed: every <<<<<<< SEARCH line needs a ======= line and a >>>>>>> REPLACE line, "
             "in that order")


class EditError(Exception):
    """An answer that cannot be applied to train.py; the message goes back to the LLM verbatim."""


def apply_answer(answer, train_src, frozen=("prepare.py",)):
    """Parse an answer and apply its edits to train_src.

    Returns (description, new_source). Raises EditError (message meant for the LLM) when the DESCRIPTION line or
    the blocks are missing, a block names a file other than train.py, a SEARCH does not match exactly once, the
    result is unchanged, or the result does not parse as Python."""
    answer = answer.replace("\r\n", "\n")
    if len(answer) > MAX_ANSWER_CHARS or answer.count(MARKERS[0]) > MAX_BLOCKS:
        raise EditError(f"the answer is {len(answer):,} characters with {answer.count(MARKERS[0])} blocks; an edit "
                        f"may be at most {MAX_ANSWER_CHARS:,} characters and {MAX_BLOCKS} blocks: send only the lines "
                        "that change")
    head, sep, rest = answer.partition(MARKERS[0])
    answer = INVISIBLE.sub("", head) + sep + rest
    m = re.search(r"^[ \t]*DESCRIPTION:(.*)$", answer, re.M)     # no backtracking over a line of blanks
    if not m:
        raise EditError('the answer has no "DESCRIPTION: ..." line')
    description = clean_description(m.group(1))
    if not description:
        raise EditError(f"the DESCRIPTION line is empty (or holds only labels the harness writes): {EMPTY_DESCRIPTION}")
    for name in re.findall(r"^[ \t]*FILE:[ \t]*(\S+)", answer, re.M):
        if Path(name).name != "train.py":
            raise EditError(f"the answer edits {name}, but only train.py may change ({', '.join(frozen)} and "
                            "every other file are read-only)")
    blocks = split_blocks(answer)
    if not blocks:
        raise EditError("the answer has no <<<<<<< SEARCH / ======= / >>>>>>> REPLACE block")
    if len(blocks) != answer.count("<<<<<<< SEARCH"):
        raise EditError(MALFORMED)
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


def split_blocks(answer):
    """The (search, replace) texts of an answer's SEARCH/REPLACE blocks, in order, each with its lines' newlines.
    One pass over the lines (linear in the answer's size, whatever it holds). Raises EditError when a block is open
    at the end or a SEARCH line starts a block inside another."""
    search_line, middle, replace_line = MARKERS
    blocks, part, search, replace = [], None, [], []
    lines = answer.split("\n")
    for i, line in enumerate(lines):
        bare, text = line.rstrip(" \t"), line + ("\n" if i < len(lines) - 1 else "")
        if bare == search_line:
            if part is not None:
                raise EditError(MALFORMED)
            search, replace = [], []
            part = search
        elif part is search and bare == middle:
            part = replace
        elif part is replace and bare == replace_line:
            blocks.append(("".join(search), "".join(replace)))
            part = None
        elif part is not None:
            part.append(text)
    if part is not None:
        raise EditError(MALFORMED)
    return blocks


def answer_for(description, old, new):
    """The answer, in this format, that turns train.py text `old` into `new`: one SEARCH/REPLACE block per changed
    hunk (difflib's opcodes), each widened by the fewest unchanged lines that make its SEARCH text occur once where
    it applies (the blocks apply in order), so that it also applies to another train.py holding those lines (an
    idea re-applied to a best that moved)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    current, blocks, shift = list(a), [], 0
    for kind, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if kind == "equal":
            continue
        lo, hi, text, k = i1 + shift, i2 + shift, "".join(current), 0
        while True:
            top, end = max(0, lo - k), min(len(current), hi + k)
            search = "".join(current[top:end])
            if search.strip() and text.count(search) == 1 or (top, end) == (0, len(current)):
                break
            k += 1
        replace = "".join(current[top:lo] + b[j1:j2] + current[hi:end])
        blocks.append(f"{MARKERS[0]}\n{search}{MARKERS[1]}\n{replace}{MARKERS[2]}")
        current[lo:hi] = b[j1:j2]
        shift += (j2 - j1) - (i2 - i1)
    return "\n".join([f"DESCRIPTION: {description}", *blocks])


def fingerprint(source):
    """What makes two train.py the same idea: their Python tokens, comments, blank lines and spacing left out (a
    sha256 hex digest). A source Python cannot tokenize falls back to its whitespace-separated words."""
    try:
        tokens = [(t.type, "" if t.type in (tokenize.INDENT, tokenize.DEDENT) else t.string)
                  for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)]
        text = "\x00".join(f"{kind}:{string}" for kind, string in tokens)
    except (tokenize.TokenError, SyntaxError, ValueError):
        text = " ".join(source.split())
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def clean_description(text):
    """One line of printable text, at most 200 characters: safe for a results.tsv cell, a commit subject and a
    terminal. Control characters (NUL, which git refuses; ESC and BEL, which drive terminals; C1 codes) become
    spaces, and runs of whitespace (tabs, newlines) one space. Leading labels only the harness writes ("[budget
    10s]", "[hw2]", any number of them) are removed: a description cannot pass for a smoke row or another hardware's.
    Invisible characters (INVISIBLE) are removed, not spaced: they show as nothing."""
    text = "".join(c if c.isprintable() else " " for c in INVISIBLE.sub("", text))
    return shorten(LABELS.sub("", " ".join(text.split())), DESCRIPTION_CHARS)


DESCRIPTION_CHARS = 200     # a row's description: karpathy's rows are short, and the dashboard shows it whole


def shorten(text, limit):
    """text cut to at most limit characters at a word boundary, "..." marking the cut (a word longer than the limit
    is cut inside). Unchanged when it fits."""
    if len(text) <= limit:
        return text
    cut = text[:max(0, limit - 3)]
    if " " in cut.strip() and not text[len(cut)].isspace():
        cut = cut[:cut.rstrip().rfind(" ")]
    return cut.rstrip() + "..."


def with_reason(description, reason):
    """A row's description with its reason in parentheses after it, the whole at most DESCRIPTION_CHARS: the reason
    kept whole (it says why the row's metric is what it is) unless it alone leaves under 60 characters for the
    description; both cut at word boundaries."""
    room = max(60, DESCRIPTION_CHARS - len(reason) - 3)
    head = shorten(description, room)
    return f"{head} ({shorten(reason, DESCRIPTION_CHARS - len(head) - 3)})"
