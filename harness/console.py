"""
HARNESS: what the user sees in the terminal: one live status line (terminals only) and printed lines, both with
secrets redacted. Writes to stdout only; never to a file.
"""

import shutil
import sys

from harness.redact import redact


def fmt_duration(seconds):
    """Seconds as m:ss, or h:mm:ss from an hour on."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def status(line):
    """Replace the live status line (terminals only; nothing when stdout is a file or pipe)."""
    if not sys.stdout.isatty():
        return
    width = shutil.get_terminal_size((120, 20)).columns
    sys.stdout.write("\r\x1b[2K" + redact(line)[:width - 1])
    sys.stdout.flush()


def say(message):
    """Print a line (clearing the status line on a terminal)."""
    if sys.stdout.isatty():
        sys.stdout.write("\r\x1b[2K")
    print(redact(message), flush=True)
