"""
HARNESS: what a run may not change outside its run directory, checked around every run. Before: the repository's
refs and HEAD, the tracked files already modified in the user's checkout, and the bytes of the harness's own files
(results.tsv, events.jsonl, the pristine evaluator, .git/config, .git/hooks, .git/info: what would make git run a
program). After: what the harness owns is put back (its own files, the autoresearch refs, the frozen files) and
named. The user's own work is never reverted: you may keep working (commit, stash, switch branches, edit program.md)
while a run trains. Only runs outside the bubblewrap sandbox are checked (macOS, no user namespaces): inside it a run
cannot even see the repository or the harness's files, so every change there is yours and is never blamed on it. Outside
it a change to your refs or checkout is reported (the run is rejected, since the harness cannot tell who made it) and
left as it is.
"""

import dataclasses
import os
import stat
import time
from pathlib import Path

from harness.gitops import changed_files
from harness.run.runner import file_hash   # a FIFO or link left in your checkout is never read

LINKED = object()        # _own_bytes of a link or a file that is not a regular one
HARNESS_REFS = ("refs/heads/autoresearch/", "refs/autoresearch/")    # the ratchet branches and candidate refs


@dataclasses.dataclass
class Snapshot:
    refs: dict              # refname -> sha, every ref of the repository
    head: str               # what HEAD points at: refs/heads/<branch>, or a sha when detached
    dirty: dict             # rel path -> sha256 of the tracked files that differed from HEAD before the run
    own: dict               # Path -> bytes of the harness's own files (None: did not exist)
    dirs: dict              # Path -> set of the file names in a directory the harness owns whole (git hooks)
    put_back: set = dataclasses.field(default_factory=set)   # own files put back while the run was in flight

    def appended(self, path, text):
        """The harness itself appended text to its own file `path` since the snapshot (an event): expect it."""
        self.own[Path(path)] = (self.own.get(Path(path)) or b"") + text.encode("utf-8")

    def restored(self, path, data):
        """Another run's check put the harness's file `path` back to data (what the harness expects it to hold):
        expect that, so that a change seen by both is blamed once and never undone by the later check."""
        if Path(path) in self.own:
            self.own[Path(path)] = data


def take(repo, own_files, own_dirs=()):
    """The Snapshot of the repository, the harness's files `own_files` and every file of `own_dirs` now."""
    root = Path(repo.working_tree_dir)
    dirs = {Path(d): {p.name for p in Path(d).glob("*")} for d in own_dirs}
    files = [Path(p) for p in own_files] + [Path(d) / name for d, names in dirs.items() for name in names]
    return Snapshot(refs=_refs(repo), head=_head(repo),
                    dirty={rel: file_hash(root / rel) for rel in changed_files(repo)},
                    own={p: (p.read_bytes() if p.is_file() else None) for p in files}, dirs=dirs)


def check(repo, snap, frozen=(), keep_dir=None, others=()):
    """Compare with the snapshot, restore what the harness owns, and return a list of what the run changed
    (empty when nothing): e.g. ["moved refs/heads/autoresearch/t (restored)", "wrote results.tsv (restored)"].
    frozen: the target's frozen files (repository paths): never yours to edit, so restored from HEAD when they were
    clean before the run. keep_dir: where a harness file changed during the run is saved before it is restored
    (without the sandbox a change of yours cannot be told from the run's: it is refused, never lost). others: the
    snapshots of the runs still in flight, told of each restore."""
    found = []
    now = _refs(repo)
    for ref in sorted(set(snap.refs) | set(now)):
        before, after = snap.refs.get(ref), now.get(ref)
        if before == after:
            continue
        if not ref.startswith(HARNESS_REFS):         # yours (a commit, a stash, a new branch): never undone
            found.append(f"{'created' if before is None else 'moved' if after else 'deleted'} {ref} (not undone)")
        elif before is None:
            repo.git.update_ref("-d", ref, after)
            found.append(f"created {ref} (deleted)")
        else:
            repo.git.update_ref(ref, before)
            found.append(f"{'moved' if after else 'deleted'} {ref} (restored)")
    if _head(repo) != snap.head:
        found.append(f"switched the checkout's HEAD from {snap.head} to {_head(repo)} (not undone: `git switch` back)")
    root = Path(repo.working_tree_dir)
    for rel in changed_files(repo):
        if rel in frozen and rel not in snap.dirty:
            repo.git.checkout("HEAD", "--", rel)
            found.append(f"modified {rel} in your checkout (restored from HEAD)")
        elif rel not in snap.dirty or file_hash(root / rel) != snap.dirty[rel]:
            found.append(f"modified {rel} in your checkout (not undone: check it)")
    return found + _check_own(snap, keep_dir, root, others)


def _check_own(snap, keep_dir=None, root=None, others=()):
    """Put the harness's own files back as they were (what was there saved in keep_dir first, named relative to root
    when inside it; the other live snapshots told); what was changed, as in check()."""
    found = []
    for path, data in snap.own.items():
        current = _own_bytes(path)
        if current != data or path in snap.put_back:
            saved = ""
            if isinstance(current, bytes) and current != data and keep_dir is not None:
                keep = Path(keep_dir) / f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}"
                keep = next(k for i in range(1000) if not (k := keep.with_name(f"{keep.name}{f'-{i}' if i else ''}"))
                            .exists())
                keep.parent.mkdir(parents=True, exist_ok=True)
                keep.write_bytes(current)
                saved = f"; copy at {keep.relative_to(root) if root and keep.is_relative_to(root) else keep}"
            _restore(path, data)
            for other in others:
                other.restored(path, data)
            found.append(f"wrote {path.name} (restored{saved})")
    for folder, names in snap.dirs.items():
        for new in sorted({p.name for p in folder.glob("*")} - names):
            if (folder / new).is_file() or (folder / new).is_symlink():
                (folder / new).unlink()
            found.append(f"created {folder.name}/{new} (deleted)")
    return found


def put_back(snaps, path, line):
    """A run in flight changed the harness's own file `path` (cut it, linked it, replaced it) before the harness could
    append `line` (str, with its newline): write what the oldest snapshot of `snaps` expects plus line, atomically
    (a new file: never through a link, never appended to a file the run still holds), and mark it in every snapshot,
    so that each run's check still reports the change."""
    path = Path(path)
    data = (snaps[0].own.get(path) or b"") + line.encode("utf-8")
    _restore(path, data)
    for snap in snaps:
        snap.restored(path, data)
        snap.put_back.add(path)


def _own_bytes(path):
    """The bytes of a harness file; None when there is none; LINKED when it is a link, one of several names of a
    file, or not a regular file (a FIFO): never equal to what the harness expects, so put back."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        return LINKED
    return path.read_bytes()


def _refs(repo):
    """{refname: sha} of every ref."""
    out = repo.git.for_each_ref("--format=%(refname) %(objectname)")
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def _head(repo):
    """refs/heads/<branch> that HEAD points at, or its sha when detached."""
    try:
        return repo.git.symbolic_ref("-q", "HEAD")
    except Exception:
        return repo.git.rev_parse("HEAD")


def _restore(path, data):
    """Put a harness file back as it was (atomically: write beside it, then rename)."""
    if data is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(path.name + ".restore")
    tmp.write_bytes(data)
    os.replace(tmp, path)
