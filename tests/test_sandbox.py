"""Tests of harness/run/sandbox.py: real bubblewrap runs of a real Python, no mocks."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.run import sandbox, view# noqa: E402
from harness.run.runner import interpreter  # noqa: E402
from helpers import remove_at_end, require_bwrap  # noqa: E402


def python_in(run_dir, code, **kw):
    """The sandbox argv that runs a Python snippet with this interpreter, its environment exposed (a checkout and its
    .venv may lie under /tmp, which the sandbox replaces, as in a CI clone)."""
    kw["expose"] = [*kw.get("expose", ()), Path(sys.prefix)]
    return sandbox.wrap([interpreter(), "-c", textwrap.dedent(code)], run_dir=run_dir, **kw)


def run_inside(code, run_dir, **kw):
    """Run a Python snippet in the sandbox; returns the CompletedProcess."""
    require_bwrap()
    argv = python_in(run_dir, code, **kw)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **sandbox.scratch_env()})


def check(code, run_dir, **kw):
    result = run_inside(code, run_dir, **kw)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


# tmp_path lies under the host's /tmp, which the sandbox replaces with its own: the tests expose tmp_path read-only
# so that what they hide inside it is visible without the hide, as a repository or a data cache would be.


def fake_repo(root):
    """A repository the sandbox must not read: git history, the ledger, the instructions."""
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/secret\n")
    (root / "results.tsv").write_text("commit\tval_bpb\n")
    (root / "program.md").write_text("the rules\n")
    return root


def test_writes_only_in_run_dir(tmp_path, run_dir):
    out = check(f"""
        import errno, pathlib
        pathlib.Path("out.txt").write_text("from inside")
        for target in [{str(Path.home())!r}, {str(Path(__file__).parent)!r}, {str(tmp_path)!r}]:
            try:
                open(target + "/sandbox-probe", "w")
            except OSError as e:
                print(target, errno.errorcode[e.errno])
            else:
                print(target, "WRITABLE")
        """, run_dir, expose=[tmp_path])
    assert (run_dir / "out.txt").read_text() == "from inside"
    found = out.split()
    # the checkout is read-only, or not there at all when it lies under /tmp (a CI clone): never writable
    assert found[:2] == [str(Path.home()), "EROFS"] and found[2:4] in ([str(Path(__file__).parent), "EROFS"],
                                                                    [str(Path(__file__).parent), "ENOENT"])
    assert found[4:] == [str(tmp_path), "EROFS"]


def test_tmp_is_private(run_dir):
    name = f"sandbox-{uuid.uuid4().hex}"
    check(f"open('/tmp/{name}', 'w').write('x'); open('/dev/shm/{name}', 'w').write('x')", run_dir)
    assert not (Path("/tmp") / name).exists()
    assert not (Path("/dev/shm") / name).exists()


def test_hidden_dir_and_hidden_file(tmp_path, run_dir):
    repo = fake_repo(tmp_path / "repo")
    data = tmp_path / "data"
    data.mkdir()
    (data / "val.bin").write_text("VALIDATION")
    (data / "train.bin").write_text("TRAINING")
    snippet = f"""
        import os
        print(sorted(os.listdir({str(repo)!r})))
        for path in [{str(repo / ".git" / "HEAD")!r}, {str(data / "val.bin")!r}, {str(data / "train.bin")!r}]:
            try:
                print(open(path).read().strip())
            except OSError as e:
                print(type(e).__name__)
        """
    # Without the hide everything is readable, so what follows is the hide's doing.
    assert check(snippet, run_dir, expose=[tmp_path]).split() == [
        "['.git',", "'program.md',", "'results.tsv']", "ref:", "refs/heads/secret", "VALIDATION", "TRAINING"]
    out = check(snippet, run_dir, expose=[tmp_path], hide=[repo, data / "val.bin", tmp_path / "no-such-file"])
    assert out.split() == ["[]", "FileNotFoundError", "PermissionError", "TRAINING"]


def test_run_dir_and_expose_inside_hidden_dir(tmp_path):
    repo = fake_repo(tmp_path / "repo")
    run = repo / ".git" / "autoresearch" / "runs" / "x"
    run.mkdir(parents=True)
    venv = repo / ".venv"
    venv.mkdir()
    (venv / "marker").write_text("venv")
    out = check(f"""
        import errno, os
        open("metrics.txt", "w").write("ok")
        print(open({str(venv / "marker")!r}).read())
        try:
            open({str(venv / "new")!r}, "w")
        except OSError as e:
            print(errno.errorcode[e.errno])
        try:
            open({str(repo / "planted")!r}, "w")
        except OSError as e:
            print(errno.errorcode[e.errno])
        print(os.path.exists({str(repo / "results.tsv")!r}))
        """, run, hide=[repo], expose=[tmp_path, venv])
    assert out.split() == ["venv", "EROFS", "EROFS", "False"]
    assert (run / "metrics.txt").read_text() == "ok"
    assert not (repo / "planted").exists()


def test_hidden_file_inside_exposed_dir_stays_hidden(tmp_path, run_dir):
    # Depth decides the order, not the argument lists: the deeper hide lands on top of the expose.
    outer = tmp_path / "outer"
    (outer / "cache").mkdir(parents=True)
    (outer / "cache" / "val.bin").write_text("VALIDATION")
    (outer / "cache" / "train.bin").write_text("TRAINING")
    out = check(f"""
        for name in ["val.bin", "train.bin"]:
            try:
                print(open({str(outer / "cache")!r} + "/" + name).read())
            except OSError as e:
                print(type(e).__name__)
        """, run_dir, hide=[outer, outer / "cache" / "val.bin"], expose=[tmp_path, outer / "cache"])
    assert out.split() == ["PermissionError", "TRAINING"]


def test_venv_inside_hidden_repo_imports(run_dir):
    prefix = Path(sys.prefix).resolve()
    # The harness's case: the venv lives in the repository it hides. Without a venv, hiding its parent hides /usr's.
    hide = [prefix.parent] if sys.prefix != sys.base_prefix else []
    out = check("import numpy, torch; print(torch.tensor([1, 2]).sum().item())", run_dir, hide=hide, expose=[prefix])
    assert out.strip() == "3"


def test_no_network(run_dir):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        out = check(f"""
            import errno, socket
            for address in [("127.0.0.1", {port}), ("1.1.1.1", 53)]:
                try:
                    socket.create_connection(address, timeout=5)
                    print("CONNECTED")
                except OSError as e:
                    print(errno.errorcode.get(e.errno, type(e).__name__))
            try:
                socket.getaddrinfo("pypi.org", 443)
                print("RESOLVED")
            except socket.gaierror:
                print("gaierror")
            """, run_dir)
    finally:
        server.close()
    assert out.split() == ["ECONNREFUSED", "ENETUNREACH", "gaierror"]


def host_pids_with(token):
    """Host PIDs whose command line contains token (the PID written inside a PID namespace is not the host's)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def spawn_sleeper(token):
    """Inside the sandbox: a child that starts a detached grandchild sleeping 60 s, then sleeps itself."""
    return f"""
        import os, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", {token!r}], start_new_session=True)
        open("started", "w").write("1")
        time.sleep(60)
        """


def wait_for(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_killing_the_group_kills_the_grandchild(run_dir):
    token = f"sandbox-grandchild-{uuid.uuid4().hex}"
    require_bwrap()
    argv = python_in(run_dir, spawn_sleeper(token))
    p = subprocess.Popen(argv, start_new_session=True)  # as the harness starts it
    try:
        assert wait_for(lambda: (run_dir / "started").exists() and host_pids_with(token), 20)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert wait_for(lambda: not host_pids_with(token), 5), "grandchild survived the group kill"
    finally:
        for pid in host_pids_with(token):
            os.kill(pid, signal.SIGKILL)


def test_harness_death_kills_the_sandbox(run_dir):
    token = f"sandbox-orphan-{uuid.uuid4().hex}"
    require_bwrap()
    argv = python_in(run_dir, spawn_sleeper(token))
    # A stand-in harness that starts the sandbox in its own session, then is SIGKILLed without cleaning up.
    stand_in = f"import subprocess, time; subprocess.Popen({argv!r}, start_new_session=True); time.sleep(60)"
    harness = subprocess.Popen([sys.executable, "-c", stand_in])
    try:
        assert wait_for(lambda: (run_dir / "started").exists() and host_pids_with(token), 20)
        harness.kill()
        harness.wait(timeout=10)
        assert wait_for(lambda: not host_pids_with(token), 5), "sandbox outlived the harness"
    finally:
        for pid in host_pids_with(token):
            os.kill(pid, signal.SIGKILL)


def fake_gpus(root, count):
    """A /dev and a /proc/driver/nvidia/gpus with `count` GPUs whose minor numbers run backwards (PCI order is not
    minor order), and the control nodes."""
    dev, table = root / "dev", root / "gpus"
    dev.mkdir()
    for name in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        (dev / name).touch()
    (dev / "dri").mkdir()
    for i in range(count):
        minor = count - 1 - i
        (dev / f"nvidia{minor}").touch()
        info = table / f"0000:{0x10 + i:02x}:00.0"
        info.mkdir(parents=True)
        (info / "information").write_text(f"Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-{i:04d}\n"
                                          f"Device Minor: \t {minor}\nBus Location: \t 0000:{0x10 + i:02x}:00.0\n")
    return dev, table


def test_a_run_sees_only_its_own_gpus_node(tmp_path, run_dir, monkeypatch):
    dev, table = fake_gpus(tmp_path, 4)
    monkeypatch.setattr(sandbox, "GPU_DEV_ROOT", dev)
    monkeypatch.setattr(sandbox, "GPU_PROC_ROOT", table)

    def binds(gpu):
        argv = sandbox.wrap(["true"], run_dir=run_dir, gpu=gpu)
        found = sorted(argv[i + 2] for i, flag in enumerate(argv) if flag == "--dev-bind")
        visible = [argv[i + 2] for i, flag in enumerate(argv) if flag == "--setenv" and argv[i + 1] ==
                   "CUDA_VISIBLE_DEVICES"]
        return found, visible

    control = ["/dev/dri", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]
    # index 1 in PCI order is minor 2; inside it is named by its UUID, whatever CUDA numbers it
    assert binds("1") == (sorted(control + ["/dev/nvidia2"]), ["GPU-0001"])
    assert binds("GPU-0003") == (sorted(control + ["/dev/nvidia0"]), ["GPU-0003"])
    assert binds("0,3") == (sorted(control + ["/dev/nvidia3", "/dev/nvidia0"]), ["GPU-0000,GPU-0003"])
    assert binds("") == ([], [])                  # a CPU worker: no GPU at all
    # a driver table that cannot be read: every node, as before, CUDA_VISIBLE_DEVICES alone choosing
    monkeypatch.setattr(sandbox, "GPU_PROC_ROOT", tmp_path / "none")
    assert binds("1")[0] == sorted(control + [f"/dev/nvidia{i}" for i in range(4)])
    monkeypatch.setattr(sandbox, "GPU_DEV_ROOT", tmp_path / "empty")
    assert binds("0") == ([], [])                 # no GPU on this machine


def test_the_gpu_of_a_run(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert sandbox.run_gpu({}) == "0"             # one run, one GPU, even on an 8-GPU machine
    assert sandbox.run_gpu({"CUDA_VISIBLE_DEVICES": "3"}) == "3"
    assert sandbox.run_gpu({"CUDA_VISIBLE_DEVICES": ""}) == ""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    assert sandbox.run_gpu({}) == "5"


def test_argv_must_be_a_list(run_dir):
    with pytest.raises(TypeError):
        sandbox.wrap("python train.py", run_dir=run_dir)


def test_the_view_check_names_each_file_a_view_reads_and_none_when_hidden(tmp_path, run_dir):
    """checks at tag start that train.py's view reads nothing of the repository (agent.py refuses to start if so)."""
    require_bwrap()
    repo = fake_repo(tmp_path / "repo")
    (repo / "empty").write_text("")                           # reveals nothing: not tried
    venv = repo / ".venv"                                      # shown on purpose inside the repository: not tried
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr\n")

    def view(expose, hide=()):
        return lambda argv: sandbox.wrap(argv, run_dir=run_dir, expose=[*expose, Path(sys.prefix)], hide=hide)
    shown = sandbox.readable_inside(view([repo]), [repo], [venv])
    assert shown == [str(repo / ".git" / "HEAD"), str(repo / "program.md"), str(repo / "results.tsv")]
    assert sandbox.readable_inside(view([tmp_path, venv], hide=[repo]), [repo], [venv]) == []


def test_a_folder_holding_a_home_is_bound_in_its_needed_parts_only(tmp_path, monkeypatch):
    home = tmp_path / "home"
    for name in ("bin", "lib", ".claude", ".sometool", "notes"):
        (home / name).mkdir(parents=True)
    for name in ("libcuda.so", "libfoo.so.1.2", "pyvenv.cfg", "secrets.json", "notes.so.txt"):
        (home / name).write_text("x")
    monkeypatch.setenv("HOME", str(home))
    assert view.narrow(home.resolve()) == [home.resolve() / n for n in ("bin", "lib", "libcuda.so",
                                                                            "libfoo.so.1.2", "pyvenv.cfg")]
    assert view.narrow(tmp_path.resolve()) == []             # holds the home, needs nothing of it
    assert view.narrow((home / "lib").resolve()) == [(home / "lib").resolve()]   # inside it: as it is


def test_a_view_reads_the_homes_once_and_binds_what_it_bound_before(tmp_path, monkeypatch):
    """The home directories are read once per view, not once per folder narrowed (16,000 readings, about 10 ms each,
    in a run of the test suite), and the view is the one that many readings gave."""
    home = tmp_path / "home"
    for name in ("bin", "lib", ".ssh"):
        (home / name).mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    readings, homes = [], view.homes
    view.foreign_trees()                        # walked once a process (it reads the homes too): before counting
    monkeypatch.setattr(view, "homes", lambda: readings.append(1) or homes())
    mounts, _ = sandbox._mounts(tmp_path / "run", [home], [])
    assert len(readings) == 1
    real = home.resolve()
    assert {p: kind for p, kind in mounts.items() if p.is_relative_to(real)} == {
        real / "bin": "ro", real / "lib": "ro", real / ".ssh": "hide"}
    assert [p for p in view.environment() if p.is_relative_to(home.resolve())] == []


def test_a_prefix_or_library_folder_inside_a_home_is_bound_in_its_needed_parts(tmp_path, monkeypatch):
    """A Python built with --prefix=$HOME/.local exposed ~/.local whole (shell history, uv's credentials): a hostile
    review. A prefix keeps bin, lib, include; a library folder its shared libraries; a data folder stays whole."""
    home = tmp_path / "home"
    local = home / ".local"
    for name in ("bin", "lib", "include", "share/fish", "share/uv/credentials"):
        (local / name).mkdir(parents=True)
    (local / "lib" / "libpython3.11.so.1.0").write_text("x")
    (local / "secret.so").symlink_to(local / "share" / "uv" / "credentials")   # a link named like a library
    monkeypatch.setenv("HOME", str(home))
    assert view.narrow(local, view.PREFIX, inside=True) == [local / n for n in ("bin", "include", "lib")]
    assert view.narrow(local / "lib", (), inside=True) == [local / "lib" / "libpython3.11.so.1.0"]
    assert view.narrow(local / "share") == [local / "share"]


def test_what_no_package_installed_under_usr_and_a_services_home_there_are_hidden(monkeypatch):
    """/usr/share/ollama (Ollama's account's home: its private key and models), a copy of the data under /usr/share
    and a clone inside a packaged folder were readable (a hostile review)."""
    import pwd
    if os.getuid() != 0 or view.packaged() is None:
        pytest.skip("writes under /usr (root) and reads dpkg's records")
    name = f"ar-test-{uuid.uuid4().hex[:8]}"
    service, copy = Path("/usr/share") / f"{name}-svc", Path("/usr/share") / f"{name}-val.parquet"
    clone = Path("/usr/lib/python3/dist-packages") / name
    real = pwd.getpwall
    monkeypatch.setattr(pwd, "getpwall", lambda: [*real(), pwd.struct_passwd(
        (name, "x", 999, 999, "", str(service), "/usr/sbin/nologin"))])
    try:
        (service / ".ollama").mkdir(parents=True)
        copy.write_text("the val split")
        (clone / ".git").mkdir(parents=True)
        view.foreign_trees.cache_clear()
        found = view.foreign_trees()
        assert {service, copy, clone} <= set(found)
        assert Path("/usr/share/doc") not in found and Path("/usr/lib/python3") not in found
        assert service in view.homes()
    finally:
        remove_at_end(service, clone, copy)             # at the run's end (helpers.USR_TREES_ENV)
        view.foreign_trees.cache_clear()


def test_a_library_folder_of_the_linker_or_a_library_no_package_installed_stays_in_view(monkeypatch, tmp_path):
    """WSL's libcuda lives in /usr/lib/wsl/lib (named in /etc/ld.so.conf.d, installed by no package), a driver's
    runfile puts libraries straight into /usr/lib: hiding them would take the GPU from every sandboxed run."""
    if os.getuid() != 0 or view.packaged() is None:
        pytest.skip("writes under /usr (root) and reads dpkg's records")
    name = f"ar-test-{uuid.uuid4().hex[:8]}"
    folder, library = Path("/usr/lib") / name / "lib", Path("/usr/lib") / f"lib{name}.so.1"
    monkeypatch.setattr(view, "linker_folders", lambda: [folder])
    try:
        folder.mkdir(parents=True)
        library.write_text("x")
        view.foreign_trees.cache_clear()
        assert not {folder.parent, library} & set(view.foreign_trees())
    finally:
        remove_at_end(folder.parent, library)           # at the run's end (helpers.USR_TREES_ENV)
        view.foreign_trees.cache_clear()
