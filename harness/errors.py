"""
HARNESS: the two ways a problem ends the loop, the words for a failure of the machine itself (os_words), and how
Ctrl-C or SIGTERM ends it (Interrupts, from_interrupt). Owns nothing else; never catches anything.
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
    """An OSError of the machine (a file: disk full, permissions, gone; a process it could not start: the process
    table or the memory full, as a run's fork bomb leaves it) in one line with the fix; None for another one that
    names no file (a bug, left to its traceback)."""
    if e.filename is None and e.errno in (errno.EAGAIN, errno.ENOMEM):
        return (f"the machine could not start a process ({e.strerror or e}): its process table or its memory is "
                "full; end what holds them (`ps -e | wc -l` counts the processes)")
    if e.filename is None:
        return None
    return f"{e.filename}: {e.strerror or e}; {FIXES.get(e.errno, 'fix that')}"


class Interrupts:
    """main's handler of SIGINT and SIGTERM (`kill` cleans up exactly as Ctrl-C does): the first raises
    KeyboardInterrupt, which starts the clean-up; a second one during the clean-up raises it again, to cut the
    clean-up short; any later one, or any after quiet() (the words are being printed), is only counted."""

    def __init__(self):
        self.count, self.loud = 0, True

    def __call__(self, signum, frame):
        self.count += 1
        if self.loud and self.count <= 2:
            raise KeyboardInterrupt

    def quiet(self):
        self.loud = False


def from_interrupt(e, signalled=False):
    """Whether exception e is, or was caused by, a KeyboardInterrupt (Python 3.11 wraps one raised inside a class
    body's __set_name__, as an SDK's import can be, in a RuntimeError). signalled: Ctrl-C or SIGTERM has arrived, so
    whatever e is, the interrupt caused it (the same Ctrl-C kills git's helper processes in our process group, and
    the next read from one raises BrokenPipeError before the KeyboardInterrupt)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if signalled or isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
