"""The sandbox as root sees it: confinement (capabilities, mount, namespaces, seccomp) and the allow-list view, probed
from inside with real bubblewrap runs. CI runs as root, as most GPU containers do: these tests are what make the
sandbox's promises hold there."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.run import sandbox, view
from harness.run.runner import interpreter
from helpers import REPO, remove_at_end, require_bwrap

SHARED = REPO.parent / "shared" / "data"

# What a train.py tried as root against the old sandbox (two mount(2) calls gave it the host's disk read-write,
# unmounting /proc gave it the harness's environment, setns its network): each must be refused inside now.
ESCAPES = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def refused(rc):
    return "refused" if rc != 0 else "ALLOWED"
MS_BIND, MS_REMOUNT, MS_REC = 4096, 32, 16384
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
found = {
    "uid": os.getuid(), "gid": os.getgid(),
    "CapEff": status["CapEff"].strip(), "CapBnd": status["CapBnd"].strip(), "Seccomp": status["Seccomp"].strip(),
    "mount tmpfs": refused(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
    "bind-mount /": refused(libc.mount(b"/", b"/tmp", None, MS_BIND | MS_REC, None)),
    "remount / read-write": refused(libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND, None)),
    "umount /proc": refused(libc.umount2(b"/proc", 2)),
    "unshare a user namespace": refused(libc.unshare(0x10000000)),
    "unshare a mount namespace": refused(libc.unshare(0x00020000)),
    "chroot": refused(libc.chroot(b"/tmp")),
}
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
found["setns"] = refused(libc.setns(fd, 0))
found["ptrace attach to its parent"] = refused(libc.ptrace(16, os.getppid(), None, None))
# the harness's environment (the API keys): its processes are not in the sandbox's PID namespace
leaked = []
for entry in os.listdir("/proc"):
    try:
        leaked += [entry] if entry.isdigit() and b"sk-probe-" in open(f"/proc/{entry}/environ", "rb").read() else []
    except OSError:
        pass
found["read the harness's environment"] = "ALLOWED" if leaked else "refused"
# the kernel lets uid 0 write sysctls without a capability, and the sandbox's uid is 0 outside when root runs it:
# core_pattern set to a program runs it as root outside at the next crash (found by a hostile test). Opened for
# writing, never written.
for setting in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"):
    try:
        os.close(os.open(setting, os.O_WRONLY))
        found["open " + setting + " for writing"] = "ALLOWED"
    except FileNotFoundError:
        pass
    except OSError:
        found["open " + setting + " for writing"] = "refused"
# root-only files the sandbox's uid 0 could read: physical page maps, kernel keys; zram's hot_add makes a block
# device on the host when read (only its presence is looked at here)
for secret in ("/proc/kpageflags", "/proc/keys"):
    try:
        open(secret, "rb").read(8)
        found["read " + secret] = "ALLOWED"
    except FileNotFoundError:
        pass
    except OSError:
        found["read " + secret] = "refused"
found["see /sys/class/zram-control"] = "ALLOWED" if os.path.exists("/sys/class/zram-control/hot_add") else "refused"
try:
    os.mknod("/tmp/sda", 0o600 | 0o060000, os.makedev(8, 0))
    found["mknod a block device"] = "ALLOWED"
except OSError:
    found["mknod a block device"] = "refused"
print(json.dumps(found))
"""


def run_inside(argv, env=None):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                            env={**(env or os.environ), **sandbox.scratch_env()})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_root_is_confined(tmp_path, monkeypatch):
    require_bwrap()
    if os.environ.get("CI", "").lower() in ("true", "1"):   # CI runs as root: every protection must hold there
        assert os.getuid() == 0 and sandbox.missing() == [], sandbox.missing()
    run = tmp_path / "run"
    run.mkdir()
    from harness.redact import clean_env
    monkeypatch.setenv("OPENAI_API_KEY", "sk-probe-DO-NOT-LEAK-0123456789")   # in the harness's environment only
    found = run_inside(sandbox.wrap([interpreter(), "-c", ESCAPES], run_dir=run), env=clean_env())
    assert found.pop("CapEff") == "0000000000000000" and found.pop("CapBnd") == "0000000000000000"
    if not sandbox.missing():
        assert (found.pop("uid"), found.pop("gid"), found.pop("Seccomp")) == (65534, 65534, "2")
    else:
        found = {k: v for k, v in found.items() if k not in ("uid", "gid", "Seccomp")}
    assert found == {k: "refused" for k in found}, found


# Walks everything the sandboxed process can see and says what it should not: files whose bytes are those of a
# protected file, paths in the user's home outside the environment, unix sockets it can connect to, and writable
# folders outside its run dir and its private /tmp. argv: a JSON object {"sizes": {size: [sha256, name]}, "home",
# "allowed": [paths], "writable": [paths]}.
WALKER = r"""
import hashlib, json, os, socket, stat, sys
spec = json.loads(sys.argv[1])
targets = {int(size): (sha, name) for size, (sha, name) in spec["sizes"].items()}
found = {"copies": [], "home": [], "sockets": [], "writable": [], "files": 0}
def under(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
for top, dirs, files in os.walk("/proc"):        # kernel settings: none writable (its own processes aside)
    if top.split("/")[2:3] and (top.split("/")[2].isdigit() or top.split("/")[2] in ("self", "thread-self")):
        dirs[:] = []
        continue
    for f in files:
        try:
            os.close(os.open(os.path.join(top, f), os.O_WRONLY | os.O_NONBLOCK))   # opened, never written
            found["writable"].append(os.path.join(top, f))
        except OSError:
            pass
for top, dirs, files in os.walk("/"):
    if top in ("/proc", "/sys", "/dev") or top.startswith(("/proc/", "/sys/", "/dev/")):
        dirs[:] = []
        continue
    if os.access(top, os.W_OK) and not under(top, spec["writable"]):
        found["writable"].append(top)
    for name in dirs + files:
        path = os.path.join(top, name)
        if under(path, [spec["home"]]) and not under(path, spec["allowed"]) and not under(spec["home"], [path]) \
                and not any(under(a, [path]) for a in spec["allowed"]):
            found["home"].append(path)
    for name in files:
        path = os.path.join(top, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        found["files"] += 1
        if stat.S_ISSOCK(st.st_mode):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                found["sockets"].append(path)
            except OSError:
                pass
            finally:
                s.close()
        elif stat.S_ISREG(st.st_mode) and st.st_size in targets:
            try:
                with open(path, "rb") as f:
                    if hashlib.sha256(f.read()).hexdigest() == targets[st.st_size][0]:
                        found["copies"].append([targets[st.st_size][1], path])
            except OSError:
                pass
print(json.dumps(found))
"""


def protected(**files):
    """The walker's targets: {size: [sha256, name]} of each protected file."""
    out = {}
    for name, path in files.items():
        data = Path(path).read_bytes()
        out[str(len(data))] = [hashlib.sha256(data).hexdigest(), name]
    return out


def walk(argv_of, targets, run=None):
    """Run the walker through argv_of(walker argv) and return its findings."""
    spec = {"sizes": targets, "home": str(Path.home()), "allowed": [str(p.resolve()) for p in view.environment()],
            "writable": ["/tmp", "/var/tmp", "/dev/shm"] + ([str(run.resolve())] if run else [])}
    return run_inside(argv_of([interpreter(), "-c", WALKER, json.dumps(spec)]))


def listener(path):
    """A unix socket listening at path on the host (a database, docker, an X server)."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    return server


@pytest.fixture(params=["tmp", "usr"])
def places(request, tmp_path):
    """(the folder of the data cache, corpus, run and pristine copy; the repository): in a temporary folder, or under
    /usr (the repository at /usr/src/<name>/repo, the official Python images' WORKDIR; the rest under
    /usr/local/share), where the view bound /usr whole and dropped every hide inside it (a hostile test). As root."""
    if request.param == "tmp":
        yield tmp_path, tmp_path / "repo"
        return
    if os.getuid() != 0:
        pytest.skip("writes under /usr: root only")
    import uuid
    name = f"ar-test-{uuid.uuid4().hex[:8]}"
    roots = [Path("/usr/local/share") / name, Path("/usr/src") / name]
    try:
        view.foreign_trees.cache_clear()
        yield roots[0], roots[1] / "repo"
    finally:
        remove_at_end(*roots)                           # at the run's end (helpers.USR_TREES_ENV)
        view.foreign_trees.cache_clear()


@pytest.mark.slow
def test_the_view_is_an_allow_list(tmp_path, places):
    require_bwrap()
    base, repo = places
    cache, corpus, run, frozen = (base / n for n in ("cache", "corpus", "run", "frozen"))
    for folder in (cache / "tokenizer", cache / "data" / "local", cache / "downloads", corpus, repo / ".git", run,
                   frozen):
        folder.mkdir(parents=True)
    val_text, holdout_text = "VALIDATION " * 997, "HOLDOUT " * 1013
    (cache / "prepared.json").write_text("{}")
    (cache / "tokenizer" / "tokenizer.pkl").write_text("TOKENIZER")
    (cache / "data" / "local" / "shard_00000.parquet").write_text("TRAINING " * 500)
    (cache / "data" / "local" / "val.parquet").write_text(val_text)
    (cache / "data" / "local" / "holdout.parquet").write_text(holdout_text)
    (cache / "downloads" / "raw.parquet").write_text(val_text)           # a download the splits were cut from
    (corpus / "book.txt").write_text(val_text)                           # a second copy of the corpus elsewhere
    (repo / "results.tsv").write_text(holdout_text)
    (frozen / "prepare.py").write_text("# the pristine evaluator\n")
    (run / "model.pt2").write_text("ARTIFACT")
    val, holdout = cache / "data" / "local" / "val.parquet", cache / "data" / "local" / "holdout.parquet"
    inputs = {"evaluator_only": [str(val), str(holdout), str(corpus)],
              "train_reads": [str(cache / "prepared.json"), str(cache / "tokenizer"), str(cache / "data" / "local")],
              "eval_reads": [str(cache / "prepared.json"), str(cache / "tokenizer"), str(val), str(holdout)]}
    (repo / ".git" / "config").write_text("[remote] " * 1201)              # the repository: unreadable wherever it is
    targets = protected(val=val, holdout=holdout, git_config=repo / ".git" / "config")
    sockets = [listener(tmp_path / "db.sock"), listener(cache / "tokenizer" / "in.sock")]
    try:
        seen = walk(lambda argv: sandbox.train_argv(argv, run, inputs, gpu="", hide=[repo]), targets, run)
        scored = walk(lambda argv: sandbox.eval_argv(argv, frozen, run / "model.pt2", inputs, gpu=""), targets)
    finally:
        for s in sockets:
            s.close()
    assert seen["files"] > 1000 and scored["files"] > 1000       # the system and the environment are there
    assert seen["copies"] == [] and seen["home"] == [] and seen["writable"] == []
    # a socket inside a declared folder is the one thing a read-only bind does not stop: the harness declares no
    # folder that holds one, and the walker of the real views (test below) checks that
    assert seen["sockets"] == [str(cache / "tokenizer" / "in.sock")]
    # the evaluator sees the evaluation splits where they are declared, and writes nowhere but its private /tmp
    assert sorted(scored["copies"]) == [["holdout", str(holdout)], ["val", str(val)]]
    assert scored["home"] == [] and scored["writable"] == []


def test_the_evaluator_runs_in_its_pristine_copy_and_reads_the_artifact_only(tmp_path):
    require_bwrap()
    run, frozen = tmp_path / "run", tmp_path / "frozen"
    run.mkdir()
    frozen.mkdir()
    (run / "model.pt2").write_text("ARTIFACT")
    (run / "Qwen").mkdir()                                    # what a candidate leaves beside its artifact
    code = textwrap.dedent(f"""
        import json, os
        found = {{"cwd": os.getcwd(), "artifact": open({str(run / "model.pt2")!r}).read(),
                 "beside": os.path.exists({str(run / "Qwen")!r})}}
        try:
            open({str(run / "model.pt2")!r}, "a")
            found["write"] = "ALLOWED"
        except OSError as e:
            found["write"] = e.strerror
        print(json.dumps(found))
        """)
    found = run_inside(sandbox.eval_argv([interpreter(), "-c", code], frozen, run / "model.pt2", {}, gpu=""))
    assert found == {"cwd": str(frozen.resolve()), "artifact": "ARTIFACT", "beside": False,
                     "write": "Read-only file system"}


@pytest.mark.slow
def test_the_real_pretraining_view_shows_no_evaluation_data(cpu_cache, tmp_path):
    """The real prepare.py's declared reads, on the real corpora: train.py's view holds no copy of the val or holdout
    split nor of any source file they were cut from, and no socket it can connect to."""
    require_bwrap()
    env = {**os.environ, "AUTORESEARCH_CACHE": str(cpu_cache)}
    out = subprocess.run([sys.executable, "prepare.py", "--frozen-inputs"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    inputs = json.loads(out.stdout.strip().splitlines()[-1])
    meta = json.loads((cpu_cache / "prepared.json").read_text())
    data = cpu_cache / meta["data_dir"]
    sources = {f"source {p.name}": p for p in sorted(Path(meta["source"]).rglob("*")) if p.is_file()}
    targets = protected(val=data / meta["val_name"], holdout=data / meta["holdout_name"], **sources)
    run = tmp_path / "run"
    run.mkdir()
    old = dict(os.environ)
    os.environ.update(AUTORESEARCH_CACHE=str(cpu_cache))
    try:
        seen = walk(lambda argv: sandbox.train_argv(argv, run, inputs, gpu=""), targets, run)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert seen["copies"] == [] and seen["sockets"] == [] and seen["home"] == [] and seen["writable"] == []
    assert str(data) in inputs["train_reads"] and str(Path(meta["source"]).resolve()) in inputs["evaluator_only"]


@pytest.mark.slow
def test_the_real_grpo_view_shows_no_test_split(tmp_path):
    """GRPO prepared offline from the real GSM8K (`--source`, the README's recipe): train.py's view holds neither the
    prepared test split nor the source folder's copy of it, though source.json names that folder."""
    require_bwrap()
    grpo = REPO / "grpo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESEARCH_")}
    env.update(AUTORESEARCH_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    tiny = subprocess.run([sys.executable, "tiny.py", "--out", str(tmp_path / "tiny"), "--warm-start-steps", "0"],
                          cwd=grpo, env=env, capture_output=True, text=True, timeout=600)
    assert tiny.returncode == 0, tiny.stderr[-2000:]
    env["AUTORESEARCH_GRPO_MODEL"] = str(tmp_path / "tiny" / "model")
    for argv in (["prepare.py", "--source", str(SHARED / "gsm8k")], ["prepare.py", "--frozen-inputs"]):
        out = subprocess.run([sys.executable, *argv], cwd=grpo, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
    inputs = json.loads(out.stdout.strip().splitlines()[-1])
    assert str((SHARED / "gsm8k").resolve()) in inputs["evaluator_only"]
    targets = protected(prepared_test=tmp_path / "cache" / "grpo" / "test.jsonl", source_test=SHARED / "gsm8k" / "test.jsonl")
    run = tmp_path / "run"
    run.mkdir()
    seen = walk(lambda argv: sandbox.train_argv(argv, run, inputs, gpu=""), targets, run)
    assert seen["copies"] == [] and seen["sockets"] == [] and seen["home"] == [] and seen["writable"] == []
    scored = walk(lambda argv: sandbox.eval_argv(argv, REPO / "grpo", run / "artifact", inputs, gpu=""), targets)
    # the evaluator sees the split it scores, and no other copy (the prepared split has the source's bytes)
    assert [path for _, path in scored["copies"]] == [str((tmp_path / "cache" / "grpo" / "test.jsonl").resolve())]


def test_an_environment_reached_through_a_symbolic_link_is_readable_there(tmp_path):
    """A venv (or data cache) named through a link, with paths inside it named through the link too: the sandbox
    makes the link and binds the real folder (before, bwrap failed to make the inner link and --sandbox auto turned
    itself off)."""
    require_bwrap()
    real = tmp_path / "real-venv"
    (real / "lib" / "site-packages").mkdir(parents=True)
    (real / "lib" / "site-packages" / "marker.txt").write_text("found")
    link = tmp_path / "checkout" / ".venv"
    link.parent.mkdir()
    link.symlink_to(real)
    run = tmp_path / "run"
    run.mkdir()
    code = f"import json; print(json.dumps(open({str(link / 'lib' / 'site-packages' / 'marker.txt')!r}).read()))"
    argv = sandbox.wrap([interpreter(), "-c", code], run_dir=run, expose=[link, link / "lib" / "site-packages"])
    assert run_inside(argv) == "found"
