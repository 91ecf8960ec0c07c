"""
HARNESS: the two ways a problem ends the loop, and the words for a failure of the machine itself (os_words).
Owns nothing else; never catches anything.
"""

import errno


class SetupError(Exception):
    """Bad input or state before the loop starts: the message names the problem and the fix (exit code 2)."""


class Stop(Exception):
    """The loop must end now (auth error, blocking hook, circuit breaker ...); the message says why (exit code 1)."""


IMMUTABLE = "make it writable for root (`lsattr` shows an immutable flag: `chattr -i`)"
FIXES = {errno.ENOSPC: "free space on that disk", errno.EDQUOT: "free space (a disk quota is full)",
         errno.EACCES: IMMUTABLE, errno.EPERM: IMMUTABLE, errno.EROFS: "the filesystem is read-only: remount it "
         "read-write", errno.ENOENT: "it is gone: put it back", errno.EIO: "the disk reports I/O errors: check it"}


def os_words(e):
    """An OSError of the machine (a file: disk full, permissions, gone) in one line with the fix; None for one that
    names no file (a bug, left to its traceback)."""
    if e.filename is None:
        return None
    return f"{e.filename}: {e.strerror or e}; {FIXES.get(e.errno, 'fix that')}"


def from_interrupt(e):
    """Whether exception e is, or was caused by, a KeyboardInterrupt (Python 3.11 wraps one raised inside a class
    body's __set_name__, as an SDK's import can be, in a RuntimeError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
