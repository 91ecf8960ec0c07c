"""
HARNESS: git. Owns the ratchet branch autoresearch/<tag>, candidate commits (only train.py, hooks respected), the
candidate refs refs/autoresearch/<tag>/<n>-<sha7>, the reset to the best commit, and the repository lock. It never
stashes, deletes or resets a file it did not write, never passes --no-verify, and knows nothing of the ledger.
"""

import fcntl
import hashlib
from pathlib import Path

import git

from harness.errors import SetupError, Stop


def open_repo(target, committed=("prepare.py", "train.py")):
    """The git repository holding the target, with a named branch checked out and `committed` (files of the
    target) tracked; SetupError otherwise."""
    try:
        repo = git.Repo(target, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SetupError(f"{target} is not inside a git repository: run `git init && git add -A && "
                         "git commit -m init` there first") from None
    if repo.head.is_detached:
        raise SetupError("HEAD is detached: check out a branch first (e.g. `git switch main`)")
    tracked = set(repo.git.ls_files("-z", "--", *[str(target / f) for f in committed]).split("\0"))
    for f in committed:
        rel = repo_rel(repo, target / f)
        if rel not in tracked:
            raise SetupError(f"{rel} is not committed: `git add {rel} && git commit` first")
    return repo


def repo_rel(repo, path):
    """path relative to the repository root, in git's / form."""
    return Path(path).resolve().relative_to(Path(repo.working_tree_dir).resolve()).as_posix()


def git_dir(repo):
    """The common git directory (shared by worktrees) as an absolute Path."""
    common = Path(repo.git.rev_parse("--git-common-dir"))
    return common if common.is_absolute() else Path(repo.working_tree_dir) / common


def changed_files(repo):
    """Tracked files that differ from HEAD (staged or not), relative to the repository root."""
    return [p for p in repo.git.diff("--name-only", "-z", "HEAD").split("\0") if p]


def ensure_ignored(repo, paths):
    """Outputs (results.tsv, events.jsonl, run.log) must be untracked and ignored (the ratchet resets train.py,
    never these). Names the repo's .gitignore does not cover go to .git/info/exclude, which is never committed."""
    rels = [repo_rel(repo, p) for p in paths]
    tracked = [p for p in repo.git.ls_files("-z", "--", *rels).split("\0") if p]
    if tracked:
        raise SetupError(f"{', '.join(tracked)} is tracked by git; untrack it (`git rm --cached {tracked[0]}` and "
                         "commit) so that resets never touch it")
    ignored = set(repo.ignored(*rels))
    missing = [r for r in rels if r not in ignored]
    if missing:
        exclude = git_dir(repo) / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as f:
            f.write("".join(f"/{r}\n" for r in missing))


def lock_repo(repo):
    """An exclusive lock in the git dir: two agents on one working tree would wreck each other's experiments.
    The kernel drops it when the process dies, even on SIGKILL. Returns the open lock file (keep it open)."""
    path = git_dir(repo) / "autoresearch.lock"
    lock = open(path, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SetupError(f"another agent.py is running in this repository (lock {path}); stop it first") from None
    return lock


def commit_file(repo, rel, message, amend=False):
    """Commit only `rel` (`git commit --only -- rel`, so nothing else can enter the commit) with this message, or
    amend HEAD with it. Hooks run; a blocking hook raises Stop with its output. Returns the full sha."""
    argv = ["-q", "--no-edit", "--amend"] if amend else ["-q"]
    try:
        repo.git.commit(*argv, "-m", message, "--only", "--", rel)
    except git.GitCommandError as e:
        raise Stop(f"git commit of the candidate failed (a pre-commit or commit-msg hook, or git config); the agent "
                   f"does not bypass hooks. Fix it and rerun the same command to resume.\n{e.stderr.strip()}")
    return repo.head.commit.hexsha


def make_candidate_ref(repo, tag, n, commit):
    """refs/autoresearch/<tag>/<n>-<sha7>: keeps every tried candidate reachable after a discard."""
    repo.git.update_ref(f"refs/autoresearch/{tag}/{n:04d}-{commit[:7]}", commit)


def reset_to(repo, commit, rel):
    """Move the checked-out branch back to commit and restore `rel` (train.py) from it: `git reset --soft` then
    `git checkout commit -- rel`. This is `git reset --hard` for the only file a candidate changes; other
    uncommitted edits (a human redirecting program.md), results.tsv and run.log are left alone."""
    if repo.head.commit.hexsha != commit:
        repo.git.reset("-q", "--soft", commit)
    repo.git.checkout(commit, "--", rel)


def is_candidate(commit, best, rel, blobs):
    """True if commit is a candidate made on top of the best commit: its parent is `best` and its `rel`
    (train.py) is one of the blob shas the agent wrote (checked by content, since a kill can precede the
    "commit" event)."""
    if len(commit.parents) != 1 or commit.parents[0].hexsha != best:
        return False
    try:
        return (commit.tree / rel).hexsha in blobs
    except KeyError:
        return False


def git_blob_sha(data):
    """The sha git gives these bytes as a blob (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
