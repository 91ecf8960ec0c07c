"""The guard (harness/run/guard.py) on a real repository: what a run outside the sandbox changed is restored and named,
what it held is saved, and the checks of two runs in flight at once never undo each other."""

import git

from harness.run import guard


def repo_with_results(tmp_path):
    """A repository whose working tree holds a results.tsv the harness owns; returns (repo, the file's path)."""
    repo = git.Repo.init(tmp_path / "repo", initial_branch="main")
    (tmp_path / "repo" / "x.txt").write_text("x\n")
    repo.index.add(["x.txt"])
    repo.index.commit("initial")
    results = tmp_path / "repo" / "results.tsv"
    results.write_text("commit\tval_bpb\tmemory_gb\tstatus\tdescription\n")
    return repo, results


def test_an_edit_seen_by_two_runs_is_blamed_once_saved_and_never_put_back(tmp_path):
    """Run A in flight; your line appended; run C starts (its snapshot holds your line); A's check restores the file
    (your line saved) and tells C's snapshot, so C's check finds nothing and does not put your line back."""
    repo, results = repo_with_results(tmp_path)
    header = results.read_bytes()
    a = guard.take(repo, [results])
    with open(results, "a") as f:
        f.write("mine\t0.5\t0.0\tkeep\tmy note\n")
    c = guard.take(repo, [results])
    found = guard.check(repo, a, keep_dir=tmp_path / "changed", others=[c])
    [copy] = (tmp_path / "changed").iterdir()
    assert found == [f"wrote results.tsv (restored; copy at {copy})"]
    assert copy.read_bytes() == header + b"mine\t0.5\t0.0\tkeep\tmy note\n" and results.read_bytes() == header
    assert guard.check(repo, c, keep_dir=tmp_path / "changed") == [] and results.read_bytes() == header
    # the harness's own appends meanwhile are expected by every live snapshot
    d = guard.take(repo, [results])
    with open(results, "a") as f:
        f.write("abc1234\t1.0\t0.0\tkeep\tbaseline\n")
    d.appended(results, "abc1234\t1.0\t0.0\tkeep\tbaseline\n")
    assert guard.check(repo, d) == []


def test_a_fifo_left_in_place_of_your_edited_file_is_named_not_read(tmp_path):
    """Without the sandbox a run could swap a tracked file you were editing for a FIFO: the check must not block
    reading it (it hashes only regular files, runner.file_hash) and names the file as modified, not undone."""
    import os
    repo, results = repo_with_results(tmp_path)
    edited = tmp_path / "repo" / "x.txt"
    edited.write_text("your edit\n")
    snap = guard.take(repo, [results])
    edited.unlink()
    os.mkfifo(edited)
    assert guard.check(repo, snap) == ["modified x.txt in your checkout (not undone: check it)"]
