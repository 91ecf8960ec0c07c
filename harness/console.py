"""
HARNESS: what the user sees in the terminal: one live status line (on a terminal; a plain progress line per phase,
at most every PLAIN_EVERY_S seconds, when stdout is a file or pipe), printed lines and error messages, all with
secrets redacted and control characters shown as escapes. Writes to stdout and stderr only; never to a file.
"""

import shutil
import sys
import time

from harness.redact import redact


def shown(text):
    """text as it may reach a terminal: secrets redacted, and control characters other than newline and tab written
    as escapes (\\x1b), so that an LLM endpoint's error body or a run's log cannot retitle, clear or drive it."""
    return "".join(c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode() for c in redact(text))


def error(message):
    """Print a line to stderr (agent.py's final error or stop message)."""
    print(shown(message), file=sys.stderr, flush=True)


def fmt_duration(seconds):
    """Seconds as m:ss, or h:mm:ss from an hour on."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


PLAIN_EVERY_S = 30.0             # without a terminal: a progress line when the phase changes, else this often
_plain = {"phase": None, "at": 0.0}


def status(line, phase=None):
    """Replace the live status line on a terminal. When stdout is a file or pipe (an overnight run's log), print it
    as a plain line when `phase` changed since the last one, or PLAIN_EVERY_S seconds after it."""
    if not sys.stdout.isatty():
        now = time.monotonic()
        if phase != _plain["phase"] or now - _plain["at"] >= PLAIN_EVERY_S:
            _plain.update(phase=phase, at=now)
            print(shown(line), flush=True)
        return
    width = shutil.get_terminal_size((120, 20)).columns
    sys.stdout.write("\r\x1b[2K" + shown(line)[:width - 1])
    sys.stdout.flush()


def say(message):
    """Print a line (clearing the status line on a terminal)."""
    if sys.stdout.isatty():
        sys.stdout.write("\r\x1b[2K")
    print(shown(message), flush=True)
