"""Unit tests of harness/gitops.py on real throwaway git repositories in tmp_path: exports read exactly a commit's
blobs, the branch moves only from the value the harness last saw, candidate refs, git notes."""

import os
import subprocess

import git
import pytest

from harness import gitops
from harness.errors import SetupError


@pytest.fixture
def repo(tmp_path):
    """A repository with two commits of a.txt ("one\\n", then "two\\n") on main, a subfolder and an executable."""
    repo = git.Repo.init(tmp_path / "repo", initial_branch="main")
    with repo.config_writer() as c:
        c.set_value("user", "name", "test").set_value("user", "email", "test@example.com")
    root = tmp_path / "repo"
    (root / "a.txt").write_text("one\n")
    (root / "sub").mkdir()
    (root / "sub" / "b.txt").write_text("bee\n")
    (root / "sub" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "sub" / "run.sh").chmod(0o755)
    os.symlink("a.txt", root / "link")
    repo.git.add(A=True)
    repo.git.commit("-qm", "first")
    (root / "a.txt").write_text("two\n")
    repo.git.commit("-qam", "second")
    return repo


def test_export_commit_writes_exactly_the_commits_blobs(repo, tmp_path):
    root = tmp_path / "repo"
    first = repo.commit("main~1").hexsha
    (root / "a.txt").write_text("uncommitted\n")                     # the checkout differs from both commits
    (root / "untracked.txt").write_text("never exported\n")
    dest = gitops.export_commit(repo, first, "", tmp_path / "export")
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*"))
    assert files == ["a.txt", "sub", "sub/b.txt", "sub/run.sh"]          # no .git, no link, nothing untracked
    assert (dest / "a.txt").read_text() == "one\n" and (dest / "sub" / "run.sh").stat().st_mode & 0o111
    assert not (dest / "sub" / "b.txt").stat().st_mode & 0o111
    sub = gitops.export_commit(repo, "main", "sub", tmp_path / "sub-export")
    assert sorted(p.name for p in sub.iterdir()) == ["b.txt", "run.sh"]
    with pytest.raises(FileExistsError):                              # dest must be new
        gitops.export_commit(repo, first, "", dest)


def test_export_commit_ignores_attributes_and_filters(repo, tmp_path):
    """export-subst and a clean/smudge filter would change the bytes of `git archive` or a checkout: an export
    reads the blobs themselves."""
    root = tmp_path / "repo"
    (root / "a.txt").write_text("version $Format:%H$\n")
    (root / ".gitattributes").write_text("a.txt export-subst filter=shout\n")
    repo.git.add(A=True)
    repo.git.commit("-qm", "attributes")
    with repo.config_writer() as c:
        c.set_value('filter "shout"', "smudge", "tr a-z A-Z")
    dest = gitops.export_commit(repo, "main", "", tmp_path / "export")
    assert (dest / "a.txt").read_bytes() == b"version $Format:%H$\n"
    assert gitops.blob_at(repo, "main", "a.txt") == b"version $Format:%H$\n"


def test_advance_branch_refuses_a_stale_old_value(repo):
    first, second = repo.commit("main~1").hexsha, repo.commit("main").hexsha
    repo.git.branch("autoresearch/t", first)
    gitops.advance_branch(repo, "autoresearch/t", second, first)
    assert repo.commit("autoresearch/t").hexsha == second
    with pytest.raises(git.GitCommandError):                          # someone else moved it: not overwritten
        gitops.advance_branch(repo, "autoresearch/t", first, first)
    assert repo.commit("autoresearch/t").hexsha == second


def test_make_candidate_ref(repo):
    second = repo.commit("main").hexsha
    ref = gitops.make_candidate_ref(repo, "t", 3, second)
    assert ref == f"refs/autoresearch/t/0003-{second[:7]}" and repo.git.rev_parse(ref) == second
    assert gitops.make_candidate_ref(repo, "t", 12, second) == f"refs/autoresearch/t/0012-{second[:7]}"


def test_add_note_appends_once_on_the_default_notes_ref(repo):
    first, second = repo.commit("main~1").hexsha, repo.commit("main").hexsha
    repo.git.notes("add", "-m", "my own note", first)
    gitops.add_note(repo, first, "autoresearch t #1: keep")
    gitops.add_note(repo, first, "autoresearch t #1: keep")            # a resume writes it again: not repeated
    assert repo.git.notes("show", first) == "my own note\n\nautoresearch t #1: keep"
    gitops.add_note(repo, second, "autoresearch t #2: discard")
    assert "autoresearch t #2: discard" in repo.git.log("-1", second)    # plain `git log` shows it
    assert repo.git.rev_parse(gitops.NOTES_REF) == repo.git.rev_parse("refs/notes/commits")


def test_git_blob_sha_is_git_hash_object(tmp_path):
    data = b"print('hello')\n\x00\xff"
    (tmp_path / "f").write_bytes(data)
    out = subprocess.run(["git", "hash-object", str(tmp_path / "f")], capture_output=True, text=True, check=True)
    assert gitops.git_blob_sha(data) == out.stdout.strip()


def test_file_at_refuses_a_file_that_is_not_utf8(repo, tmp_path):
    (tmp_path / "repo" / "a.txt").write_bytes(b"caf\xe9\n")
    repo.git.commit("-qam", "latin-1")
    assert gitops.blob_at(repo, "main", "a.txt") == b"caf\xe9\n"
    with pytest.raises(SetupError, match="a.txt at commit .* is not UTF-8"):
        gitops.file_at(repo, "main", "a.txt")
    assert gitops.file_at(repo, "main~1", "a.txt") == "two\n"
