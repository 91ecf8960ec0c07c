"""
HARNESS: the files the loop's records live in, written safely: only a regular file with one name (record_problem:
a link or a special file planted at a record's name would send the harness's lines elsewhere), opened never through
a link and never blocking (open_record), replaced atomically (write_atomic), appended and fsynced a line at a time
(append_line); the refusal's words and fix; the stores' library logs routed into a record of their own. Knows no
record's format (harness.ledger does).
"""

import errno
import logging
import os
import stat
import tempfile
from pathlib import Path

from harness.errors import Stop


def record_problem(path):
    """Why path cannot hold one of the loop's records (results.tsv, events.jsonl, run.log, the page, a store), or
    None: absent, or a regular file with one name. A symbolic link, a hard link or a special file planted there would
    send the harness's lines into another file (/etc/passwd, the user's train.py, a device)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):     # nothing there (a file where a folder should be: no link)
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"is a symbolic link (to {os.readlink(path)})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_nlink > 1:
        return f"is one of {st.st_nlink} names of one file (a hard link)"
    return None


def folder_problem(path):
    """Why path cannot be one of the loop's folders (the tag's, its logs), or None: absent, or a folder (not a link)."""
    path = Path(path)
    if path.is_symlink():
        return f"is a symbolic link (to {os.readlink(path)})"
    if path.exists() and not path.is_dir():
        return "is not a folder"
    return None


def record_refusal(path, problem):
    """The words for a record at path that cannot be written: the problem, that nothing was written, the fix."""
    return (f"{path} {problem}: the loop writes its records only into a regular file of its own, never through a "
            f"link, and wrote nothing there. {record_fix(path)}, then rerun the same command")


def record_fix(path):
    """How to make path a record the loop can write, keeping what is there (a hard link's `rm` would take the
    record's only name in this folder away; a symbolic link's removes the link, not the file it names)."""
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        return (f"Give it a file of its own, keeping its content (`cp {path} {path}.own && mv {path}.own {path}`: "
                f"the other name keeps the old file), or move it aside if it is not this loop's record")
    if st is not None and stat.S_ISLNK(st.st_mode):
        return f"Remove the link (`rm {path}` removes the link, not the file it names)"
    return "Move it aside (a folder, a FIFO or a device)"


class RecordError(Stop):
    """A record's path is a link or not a regular file (record_problem): the loop stops, nothing written to it."""


MODES = {"a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
         "w": os.O_WRONLY | os.O_CREAT, "wb": os.O_WRONLY | os.O_CREAT, "r+b": os.O_RDWR}


def open_record(path, mode="a"):
    """Open one of the loop's records for writing ("a"/"ab": append, "w"/"wb": replace its content, "r+b": in place),
    never through a symbolic link (O_NOFOLLOW) and only into a regular file with one name (checked on the open file,
    before anything is truncated or written; O_NONBLOCK so that a FIFO cannot hang the loop). Raises RecordError
    naming the path and the fix; other OSErrors (disk full, permissions) as they are."""
    try:
        fd = os.open(path, MODES[mode] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):     # a link; a FIFO with no reader; a folder
            raise RecordError(record_refusal(path, record_problem(path) or "is not a regular file")) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise RecordError(record_refusal(path, record_problem(path) or "is not a regular file"))
    os.set_blocking(fd, True)
    if mode in ("w", "wb"):
        os.ftruncate(fd, 0)
    return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8")


LIBRARY_LOGGERS = ("sqlalchemy", "alembic", "mlflow", "optuna")   # what the stores log: never the terminal's
LIBRARY_LOG = "libraries.log"       # in the tag's harness folder
_routed = {"handler": None}


def route_library_logs(path=None):
    """Send what the stores' libraries log (LIBRARY_LOGGERS: a locked SQLite file makes SQLAlchemy and MLflow log
    tracebacks, Ctrl-C inside a study query too) to the record at path (opened like every record: open_record),
    never to the terminal, where the harness's own warning says what happened. Called again after a library is
    imported (mlflow and optuna put their own terminal handlers on their loggers then): path None keeps the file
    routed to before (none: the lines are dropped)."""
    handler = _routed["handler"]
    if path is not None:
        if handler is not None:
            handler.close()
        try:
            handler = logging.StreamHandler(open_record(path))
        except OSError:                 # a refused or unwritable file: dropped, as before a tag has a folder
            handler = logging.NullHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        _routed["handler"] = handler
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler or logging.NullHandler()]
        logger.propagate = False


def write_atomic(path, content):
    """Write text to path through a new temporary file in the same folder (a random name, created exclusively: nothing
    planted at its name is written through) and os.replace: a reader sees the old file or the new one, never half
    of one; a link at path is replaced, not followed; the temporary file is removed on any failure. Returns path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)                            # mkstemp's 0600 would hide a page from a web server
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def copy_record(source, path):
    """Copy the file source to the record at path (run.log: the last run's log) through open_record."""
    with open(source, "rb") as src, open_record(path, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)


def append_line(path, line):
    """Append one line and fsync: a row or event is on disk before the next step starts. Raises RecordError when
    path is a link or not a regular file (open_record): nothing is appended anywhere else."""
    with open_record(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
