"""
HARNESS: what of this machine a sandboxed process is shown, as paths: the system's own folders (system_view), the
Python environment a run needs (environment), each folder holding a home directory narrowed to what its role needs
(narrow), and what lies inside the system folders and is no system's (foreign_trees: other clones, data caches, hub
models, entries no package installed), hidden in every view; the credentials hidden too. Reads the file system
only; harness.run.sandbox turns these into bubblewrap's argv.
"""

import functools
import os
import re
import sys
from pathlib import Path

# Credential stores in the home directory: outside the view anyway; hidden as well should a declared or environment
# path contain one (what train.py reads can come back in its log tail, which goes to the LLM's fix prompt).
CREDENTIALS = ("~/.netrc", "~/.git-credentials", "~/.ssh", "~/.gnupg", "~/.aws", "~/.azure", "~/.kube",
               "~/.docker/config.json", "~/.config/gcloud", "~/.config/gh", "~/.cache/huggingface/token",
               "~/.huggingface/token", "~/.kaggle", "~/.pypirc", "~/.npmrc", "~/.config/anthropic", "~/.config/openai")

# The system part of the view. /bin, /lib, ... are symlinks into /usr on a merged-/usr system (made so inside too).
# Of /usr only the system's own folders: /usr/src is the official Python images' WORKDIR (/usr/src/app), and
# /usr/local/share, /usr/local/src and the like are where admins put shared checkouts and caches (a hostile test
# read a second clone's val split and kept weights there). /usr/local keeps what a Python built from source or the
# CUDA toolkit installs there.
SYSTEM = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "libexec", "include", "share")
USR_LOCAL = ("bin", "sbin", "lib", "lib32", "lib64", "libexec", "include", "cuda", "cuda-*", "nvidia")
# A folder the environment names that holds a home directory, or a prefix or library folder inside one, is bound only
# in the parts its role needs: a Python prefix (PREFIX), CUDA_HOME (CUDA), a library folder its shared libraries
# alone; any other folder holding a home the union (NEEDED). Never the credentials every tool keeps in a home
# (~/.claude, ~/.codex, ...: a deny-list would fail open for the tools it does not name).
PREFIX = ("bin", "lib", "lib64", "include", "pyvenv.cfg")
CUDA = ("bin", "lib", "lib64", "include", "nvvm", "targets")
NEEDED = tuple(sorted({*PREFIX, *CUDA}))
# The folders of /usr whose entries the package manager records: an entry no package installed (a checkout, a copy of
# the data, a system user's home such as /usr/share/ollama) is no system's, and hidden (packaged()).
PACKAGED = ("share", "lib", "lib32", "lib64", "libx32", "libexec", "include")
DPKG_INFO = Path("/var/lib/dpkg/info")
SHARED_LIBRARY = re.compile(r"\.so(\.[\d.]+)?$")

def credential_paths():
    """The CREDENTIALS that exist here, expanded."""
    return [p for p in (Path(c).expanduser() for c in CREDENTIALS) if p.exists()]


def environment(known=None):
    """The Python environment a run needs, read-only: the prefixes of this interpreter and of its base (a venv's
    python is a link to it), their standard library and site-packages and the targets of links at their top level (a
    uv cache in symlink mode), existing LD_LIBRARY_PATH and CUDA_HOME folders, each narrowed to what its role needs
    where it holds a home directory or lies in one (narrow; known: homes(), when the caller has read them). A list of
    Paths. No model of the Hugging Face cache: a target declares the ones it reads."""
    known = homes() if known is None else known
    import site
    import sysconfig
    folders = {*site.getsitepackages(), sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
    for folder in site.getsitepackages():
        try:
            folders.update(str(Path(e.path).resolve()) for e in os.scandir(folder) if e.is_symlink())
        except OSError:
            pass
    if os.environ.get("UV_LINK_MODE") == "symlink":
        folders.add(os.environ.get("UV_CACHE_DIR") or str(Path("~/.cache/uv").expanduser()))
    roles = [(p, NEEDED, False) for p in folders]
    roles += [(p, PREFIX, True) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)]
    roles += [(p, (), True) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":")]
    roles += [(os.environ.get("CUDA_HOME", ""), CUDA, True)]
    found = {part for p, needed, inside in roles if os.path.isabs(p) and Path(p).exists()
             for part in narrow(Path(p), needed, inside, known)}
    return sorted(found)


def homes():
    """The home directories here (resolved): yours ($HOME), root's, each folder of /home and every account's in
    /etc/passwd (a service's home such as /usr/share/ollama holds its keys), but none that is or holds a folder of
    the system (daemon's /usr/sbin, a home of /). Every tool keeps its credentials in one."""
    import pwd
    found = {Path.home(), Path("/root")}
    try:
        found.update(p for p in Path("/home").iterdir() if p.is_dir())
        found.update(Path(e.pw_dir) for e in pwd.getpwall() if e.pw_dir.startswith("/"))
    except OSError:
        pass
    system = [root for root, link in system_view() if link is None] + [Path(p) for p in ("/dev", "/proc", "/sys")]
    real = {p.resolve() for p in found if p.is_dir()}
    return sorted(h for h in real if not any(r.is_relative_to(h) for r in system))


def narrow(path, needed=NEEDED, inside=False, known=None):
    """What of folder `path` is bound when it holds a home directory (it is one, or one lies inside it) or, with
    inside, lies in one: its `needed` parts and the shared libraries right in it (what the dynamic linker reads from
    an LD_LIBRARY_PATH folder; a link only to another shared library), never the rest; [path] otherwise. known: the
    homes() of the caller's one reading (a view reads them once: about 10 ms a reading, dozens of folders a view)."""
    real, known = path.resolve(), homes() if known is None else known
    if not any(home.is_relative_to(real) or inside and real.is_relative_to(home) for home in known):
        return [path]
    try:
        return sorted(e for e in path.iterdir() if e.name in needed or SHARED_LIBRARY.search(e.name) and e.is_file()
                      and SHARED_LIBRARY.search(e.resolve().name))
    except OSError:
        return []


def holds_system(path):
    """Whether path holds a folder of the system part of the view (/usr, /usr/local): what a run needs of it is there
    already, and binding it whole would show what the view leaves out (/usr/src, /usr/local/share)."""
    return any(root.is_relative_to(path) for root, link in system_view() if link is None)


def in_system(path):
    """Whether path lies in the system part of the view (a folder of system_view() bound as a folder, not a link)."""
    return any(path.is_relative_to(root) for root, link in system_view() if link is None)


@functools.cache
def system_view():
    """[(path, None: bound read-only | the target of the symbolic link made there)] of the system part of the view:
    SYSTEM, /usr's USR and /usr/local's USR_LOCAL (globs) where they exist. Read once a process."""
    names = [Path(n) for n in SYSTEM] + [Path("/usr", n) for n in USR]
    names += sorted(p for pattern in USR_LOCAL for p in Path("/usr/local").glob(pattern))
    return [(p, os.readlink(p) if p.is_symlink() else None) for p in names if p.is_symlink() or p.is_dir()]


# What marks a tree that is no system's inside a system folder: a git repository (a work tree holds .git, a bare one
# HEAD, objects and refs), a data cache of a target (prepared.json: prepare.py's record), a Hugging Face cache's
# model or dataset repository.
def _foreign(folder, names):
    return ".git" in names or "prepared.json" in names or {"HEAD", "objects", "refs"} <= names or \
        folder.name.startswith(("models--", "datasets--"))


def _holds_or_in(path, folders):
    return any(path.is_relative_to(f) or f.is_relative_to(path) for f in folders)


@functools.cache
def linker_folders():
    """The folders the dynamic linker is configured to search (/etc/ld.so.conf and the files it includes:
    /usr/lib/wsl/lib on WSL, a driver's folder): never hidden as no system's, whoever installed them. Paths; read
    once a process."""
    found, files = [], [Path("/etc/ld.so.conf"), *sorted(Path("/etc/ld.so.conf.d").glob("*.conf"))]
    for conf in files:
        try:
            found += [Path(line.strip()) for line in conf.read_text(errors="replace").splitlines()
                      if line.strip().startswith("/")]
        except OSError:
            pass
    return found


@functools.cache
def packaged():
    """The entries of /usr's PACKAGED folders that a package installed ({"/usr/share/doc", ...}: dpkg's file lists;
    a merged-/usr system records /lib/x for /usr/lib/x), or None where there is no dpkg database (then only the
    marks of _foreign find what is no system's). Read once a process (about 0.4 s for 800 packages)."""
    if not DPKG_INFO.is_dir():
        return None
    found = set()
    for listing in DPKG_INFO.glob("*.list"):
        try:
            lines = listing.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split("/", 4)
            if len(parts) >= 4 and parts[1] == "usr":
                found.add(f"/usr/{parts[2]}/{parts[3]}")
            elif len(parts) >= 3 and parts[1].startswith("lib"):
                found.add(f"/usr/{parts[1]}/{parts[2]}")
    return found


@functools.cache
def foreign_trees():
    """What lies inside the system part of the view and is no system's, hidden in every view: an entry of /usr's
    PACKAGED folders that no package installed (packaged(); a link aside: update-alternatives makes some, and what
    it points to is in view or not by itself; a shared library and a folder of the dynamic linker's aside: a driver's
    installer puts them there), a home of an account inside a system folder, and any
    folder with the marks of _foreign (another clone of a project, a data cache, hub models someone put under
    /usr/local/lib). Walked once a process (about half a second for 15,000 folders), links not followed."""
    roots = [root for root, link in system_view() if link is None]
    found = [h for h in homes() if any(h.is_relative_to(r) and h != r for r in roots)]
    owned = packaged()
    for root in roots if owned is not None else ():
        if root.parent == Path("/usr") and root.name in PACKAGED:
            try:
                found += sorted(e for e in root.iterdir() if str(e) not in owned and not e.is_symlink()
                                and not SHARED_LIBRARY.search(e.name) and not _holds_or_in(e, linker_folders()))
            except OSError:
                pass
    for root in roots:
        for top, dirs, files in os.walk(root, onerror=lambda e: None):
            here = Path(top)
            if here in found or _foreign(here, {*dirs, *files}):
                found.append(here)
                dirs[:] = []
    return sorted(set(found))
