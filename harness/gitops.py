"""
HARNESS: git. Owns the ratchet branch autoresearch/<tag> (moved by update-ref only), candidate commits (only
train.py, made in the harness's own worktree, hooks respected), the candidate refs refs/autoresearch/<tag>/<n>-<sha7>,
exports of a commit for a run, the record commits of search mechanisms, and the repository lock. It never switches,
resets or writes the user's checkout, never passes --no-verify, and knows nothing of the ledger.
"""

import fcntl
import hashlib
import io
import os
import shutil
from pathlib import Path, PurePosixPath

import git
from gitdb import IStream

from harness import files
from harness.errors import SetupError, Stop, os_words


def open_repo(target, committed=("prepare.py", "train.py")):
    """The git repository holding the target, with a named branch checked out and `committed` (files of the
    target) tracked; SetupError otherwise."""
    try:
        repo = git.Repo(target, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SetupError(f"{target} is not inside a git repository: run `git init && git add -A && "
                         "git commit -m init` there first") from None
    harden(repo)
    if repo.head.is_detached:
        raise SetupError("HEAD is detached: check out a branch first (e.g. `git switch main`)")
    tracked = set(repo.git.ls_files("-z", "--", *[str(target / f) for f in committed]).split("\0"))
    for f in committed:
        rel = repo_rel(repo, target / f)
        if rel not in tracked:
            raise SetupError(f"{rel} is not committed: `git add {rel} && git commit` first")
    return repo


# core.fsmonitor off; and a refs/replace/ ref would swap the bytes of a blob in every export (the pristine evaluator's
# prepare.py among them): the harness reads the objects themselves. Also for git run as a plain subprocess.
HARDENED = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "false",
            "GIT_NO_REPLACE_OBJECTS": "1"}


def harden(repo):
    """The harness's git commands never run a program named in the repository's config for its own sake
    (core.fsmonitor runs on every status and diff): a config line planted by a run must not run in the harness.
    Your global git config is read from the copy global_config() took when this agent.py started, so that a hook
    path or filter a run (without the sandbox) writes to ~/.gitconfig never runs in the harness's git either."""
    repo.git.update_environment(**HARDENED, GIT_CONFIG_GLOBAL=str(global_config(repo)))
    return repo


_global_copies = {}


def global_config(repo):
    """<git dir>/autoresearch/global.gitconfig: a copy of your global git config (the file $GIT_CONFIG_GLOBAL names,
    else $XDG_CONFIG_HOME/git/config then ~/.gitconfig, as git reads them) taken once per agent.py process. The
    guard checks it after every run."""
    path = git_dir(repo).resolve() / "autoresearch" / "global.gitconfig"
    if path not in _global_copies:
        problem = files.folder_problem(path.parent)       # a link there would take the copy (and every tag's files)
        if problem:
            raise SetupError(files.record_refusal(path.parent, problem))
        named = os.environ.get("GIT_CONFIG_GLOBAL")
        sources = [Path(named)] if named else user_configs()[:2]
        text = "".join(p.read_text(errors="replace") + "\n" for p in sources if p.is_file())
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(path, text)
        _global_copies[path] = text
    return path


def user_configs():
    """Your own git files that can make git run a program or change what it writes: $XDG_CONFIG_HOME/git/config,
    ~/.gitconfig and $XDG_CONFIG_HOME/git/attributes (filters). Without the sandbox the guard checks them around
    every run."""
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "git"
    return [xdg / "config", Path.home() / ".gitconfig", xdg / "attributes"]


def repo_rel(repo, path):
    """path relative to the repository root, in git's / form."""
    return Path(path).resolve().relative_to(Path(repo.working_tree_dir).resolve()).as_posix()


def git_dir(repo):
    """The common git directory (shared by worktrees) as an absolute Path; asked of git once per Repo object (a
    loop asks for it several times per experiment, and it cannot change under an open Repo)."""
    known = getattr(repo, "_autoresearch_git_dir", None)
    if known is None:
        common = Path(repo.git.rev_parse("--git-common-dir"))
        known = repo._autoresearch_git_dir = common if common.is_absolute() else Path(repo.working_tree_dir) / common
    return known


def changed_files(repo):
    """Tracked files that differ from HEAD (staged or not), relative to the repository root."""
    return [p for p in repo.git.diff("--name-only", "-z", "HEAD").split("\0") if p]


def ensure_ignored(repo, paths):
    """Outputs (results.tsv, events.jsonl, run.log) must be untracked and ignored (the ratchet resets train.py,
    never these). Names the repo's .gitignore does not cover go to .git/info/exclude, which is never committed."""
    rels = [(PurePosixPath(repo_rel(repo, Path(p).parent)) / Path(p).name).as_posix() for p in paths]  # a link's own name
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


def commit_file(repo, rel, message, amend=False, allow_empty=False):
    """Commit only `rel` (`git commit --only -- rel`, so nothing else can enter the commit) with this message, or
    amend HEAD with it; allow_empty: even when `rel` is unchanged (a re-baseline). Hooks run; a blocking hook raises
    Stop with its output. Returns the full sha."""
    argv = (["-q", "--no-edit", "--amend"] if amend else ["-q"]) + (["--allow-empty"] if allow_empty else [])
    try:
        repo.git.commit(*argv, "-m", message, "--only", "--", rel)
    except git.GitCommandError as e:
        if any(words in (e.stderr or "") for words in ENVIRONMENT):
            raise Stop(f"{git_words(e)}. Fix that, then rerun the same command to resume") from None
        raise Stop(f"git commit of the candidate failed (a pre-commit or commit-msg hook, or git config); the agent "
                   f"does not bypass hooks. Fix it and rerun the same command to resume.\n{e.stderr.strip()}")
    return repo.head.commit.hexsha


def make_candidate_ref(repo, tag, n, commit):
    """refs/autoresearch/<tag>/<n>-<sha7>: keeps every tried candidate reachable after a discard. Returns the ref."""
    ref = f"refs/autoresearch/{tag}/{n:04d}-{commit[:7]}"
    repo.git.update_ref(ref, commit)
    return ref


NOTES_REF = "refs/notes/commits"           # git's default notes ref: plain `git log` shows the notes


def note_of(repo, commit):
    """The git note of commit on the default notes ref ("" when it has none)."""
    try:
        return repo.git.notes("show", commit)
    except git.GitCommandError:
        return ""


def add_note(repo, commit, text):
    """Attach text to commit as a git note on the default notes ref (refs/notes/commits), so that plain `git log` and
    `git show` print it. Appended to a note already there (the same commit measured by two tags, or your own note),
    and skipped when that note already holds text (a resume writes it again)."""
    if text not in note_of(repo, commit):
        repo.git.notes("append", "-m", text, commit)


def commit_files(repo, files, message):
    """A parentless commit holding `files` ({name: text}, at the top of its tree) with this message, written straight
    to the object database (no worktree, no index, no hooks: it is a record, not a candidate). Returns its sha."""
    entries = []
    for name in sorted(files):
        data = files[name].encode()
        blob = repo.odb.store(IStream("blob", len(data), io.BytesIO(data))).binsha
        entries.append(b"100644 " + name.encode() + b"\0" + blob)
    tree = b"".join(entries)
    tree_sha = repo.odb.store(IStream("tree", len(tree), io.BytesIO(tree))).hexsha
    return repo.git.commit_tree(tree_sha.decode() if isinstance(tree_sha, bytes) else tree_sha, "-m", message)


def git_blob_sha(data):
    """The sha git gives these bytes as a blob (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

# ---------------------------------------------------------------------------
# Hermetic runs: the harness's own worktree for commits, exports of a commit for runs, the branch by update-ref
# ---------------------------------------------------------------------------


def harness_dir(repo, tag):
    """<git dir>/autoresearch/<tag>: the harness's own files for a tag (stage worktree, pristine frozen files,
    run dirs, logs). Inside .git, so never committed and hidden with the repository in the sandbox."""
    return git_dir(repo) / "autoresearch" / tag


def checked_out_in(repo, branch):
    """The worktree paths (the user's checkout included) that have refs/heads/<branch> checked out."""
    paths, current = [], None
    for line in repo.git.worktree("list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            current = line[len("worktree "):]
        elif line == f"branch refs/heads/{branch}":
            paths.append(current)
    return paths


def open_stage(repo, path, commit):
    """The harness's detached worktree at `path`, checked out (forced, clean) at `commit`: candidate commits are
    made there with `git commit`, so hooks run, and the user's checkout is never switched or written."""
    path = Path(path)
    if not (path / ".git").exists():       # -f: also when a removed stage is still registered (never `worktree prune`,
        path.parent.mkdir(parents=True, exist_ok=True)   # which would drop your worktrees on an unmounted drive)
        repo.git.worktree("add", "-f", "--detach", str(path), commit)
    stage = harden(git.Repo(path))
    (Path(stage.git_dir) / "index.lock").unlink(missing_ok=True)   # left by a kill mid-commit; we hold the repo lock
    try:
        stage.git.checkout("-q", "-f", "--detach", commit)
    except git.GitCommandError:     # the stage's own HEAD unreadable (a discard's damaged object): a fresh stage
        shutil.rmtree(path)
        repo.git.worktree("add", "-f", "--detach", str(path), commit)
        stage = harden(git.Repo(path))
    return stage


def export_commit(repo, commit, rel, dest, leave_out=()):
    """Write the files of `commit`'s subtree `rel` ("" for the root) into the new directory dest: exactly the
    committed bytes (read as blobs, so no filter, `export-subst` or other attribute of your config or of the
    repository can change what is measured), no .git, nothing untracked. Executable bits are kept; symbolic links and
    submodules are left out, and so are the files at or under the paths `leave_out` (relative to rel: the
    evaluation's own data, such as a sample corpus committed with the target). Returns dest."""
    dest = Path(dest)
    dest.mkdir(parents=True)
    tree = repo.commit(commit).tree
    for item in (tree / rel if rel else tree).traverse():
        if item.type != "blob" or item.mode & 0o170000 != 0o100000:     # trees, links, submodules
            continue
        inner = item.path[len(rel) + 1:] if rel else item.path
        if any(inner == out or inner.startswith(out.rstrip("/") + "/") for out in leave_out):
            continue
        path = dest / inner
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(item.data_stream.read())
        if item.mode & 0o111:
            path.chmod(0o755)
    return dest


# what git says when the machine, not a hook, made a command fail
ENVIRONMENT = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded",
               "unable to create temporary file", "Input/output error", "Out of diskspace")
GitError = git.GitCommandError             # what a failed git command raises (its stderr holds git's own words)


def git_words(e):
    """A failed git command in one line: the command and what git said (no traceback)."""
    said = " ".join((e.stderr or "").replace("stderr:", "").split()).strip(" '.") or f"exit status {e.status}"
    command = e.command if isinstance(e.command, str) else " ".join(map(str, e.command[:2]))
    return f"`{command}` failed: {said}"


def failure_words(e):
    """A failed git command (git_words) or file operation of the machine (errors.os_words) in one line with the fix;
    None for an error that is neither (a bug, left to its traceback)."""
    if not isinstance(e, GitError):
        return os_words(e)
    said = f"{e.stderr or ''}".lower()
    damaged = e.status is not None and isinstance(e.status, int) and e.status < 0 or any(
        word in said for word in ("unable to read", "inflate", "corrupt", "bad object", "loose object", "bad tree"))
    return f"{git_words(e)}. " + ("The repository's objects look damaged: `git fsck` names them; restore them from a "
                                  "backup or a clone that has them" if damaged else "Fix that")


def advance_branch(repo, branch, new, old):
    """Move refs/heads/<branch> from old to new (`git update-ref` with the old value checked, so a ref moved by
    anyone else is an error, not overwritten)."""
    repo.git.update_ref(f"refs/heads/{branch}", new, old)


def verified(repo, binsha):
    """The content of object binsha (20 bytes), checked against its hash as `git fsck` does (git's reader returns a
    damaged loose object's bytes unchecked). Raises ValueError when it does not match."""
    stream = repo.odb.stream(binsha)
    data = stream.read()
    header = stream.type + b" " + str(len(data)).encode() + b"\0"
    if len(data) != stream.size or hashlib.sha1(header + data).digest() != binsha:
        raise ValueError(f"object {binsha.hex()} is damaged: its content does not match its hash")
    return data


def set_aside_damaged(repo, data):
    """Before `data` is committed as a blob: when its loose object exists but is damaged (a discard's, unreadable:
    git would reuse it and the commit would hold the damaged bytes), rename it to <object>.damaged so that git
    writes it anew. A sound, missing or packed object is left as it is."""
    sha = git_blob_sha(data)
    path = git_dir(repo) / "objects" / sha[:2] / sha[2:]
    if not path.is_file():
        return
    try:
        verified(repo, bytes.fromhex(sha))
        return
    except (git.GitError, ValueError, OSError):
        pass
    repo.git.clear_cache()          # git's reader may be off track after a damaged object
    path.rename(path.with_name(path.name + ".damaged"))


def blob_at(repo, commit, rel):
    """The bytes of file rel at commit (`git show commit:rel`)."""
    return (repo.commit(commit).tree / rel).data_stream.read()


def file_at(repo, commit, rel):
    """The text of file rel at commit (blob_at, decoded); SetupError if it is not UTF-8."""
    try:
        return blob_at(repo, commit, rel).decode("utf-8")
    except UnicodeDecodeError as e:
        raise SetupError(f"{rel} at commit {commit[:7]} is not UTF-8 text ({e}): commit it as UTF-8 (and start a new "
                         "--tag from that commit)") from None
