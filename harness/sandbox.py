"""
HARNESS: the bubblewrap sandbox train.py runs in. Owns the bwrap command line (what the training process may see,
write and reach), the probe that says whether bwrap works here, and the scratch environment for tools that write
caches. Only builds argv and env: never starts the training run itself, never kills anything, never touches git
or the ledger.

Inside the sandbox train.py sees the whole filesystem read-only, its run directory read-write at the same path, a
private empty /tmp (and /dev/shm), no network, and none of the hidden paths. A hidden directory becomes an empty
read-only tmpfs; a hidden file has /dev/null bound over it on a nodev mount, so open() fails with EACCES.

    argv = wrap([sys.executable, "train.py"], run_dir=run, hide=[repo, val_file], expose=[Path(sys.prefix)])
    subprocess.Popen(argv, cwd=run, env={**os.environ, **scratch_env()}, start_new_session=True)
"""

import functools
import shutil
import subprocess
import sys
from pathlib import Path

PROTECTIONS = (
    "filesystem read-only except the run directory and a private /tmp and /dev/shm",
    "hidden paths (the repository: git history, results, program.md; evaluator-only data) unreadable",
    "no network: own network namespace (no TCP/UDP, no DNS, no abstract unix sockets of the host)",
    "own PID and IPC namespaces: other processes are invisible and unsignalable",
    "the whole process tree dies with the harness or when its process group is killed",
    "new terminal session: no TIOCSTI keystroke injection into the harness's terminal",
)

# Credential stores in the home directory, hidden from every sandboxed process: what train.py reads can come back
# in its log tail, which goes to the LLM's fix prompt and the records. (Home itself stays readable: the Hugging Face
# and torch caches are there.)
CREDENTIALS = ("~/.netrc", "~/.git-credentials", "~/.ssh", "~/.gnupg", "~/.aws", "~/.azure", "~/.kube",
               "~/.docker/config.json", "~/.config/gcloud", "~/.config/gh", "~/.cache/huggingface/token",
               "~/.huggingface/token", "~/.kaggle", "~/.pypirc", "~/.npmrc", "~/.config/anthropic", "~/.config/openai")


def credential_paths():
    """The CREDENTIALS that exist here, expanded."""
    return [p for p in (Path(c).expanduser() for c in CREDENTIALS) if p.exists()]


# Where the GPU device nodes are looked for; a module constant so a test can point it at fake nodes.
GPU_DEV_ROOT = Path("/dev")

# Always first: later mounts land on top of earlier ones, so everything else refines this base.
BASE = (
    "--ro-bind", "/", "/",
    "--dev", "/dev",             # a fresh minimal /dev with its own tmpfs /dev/shm
    "--proc", "/proc",           # a procfs of the new PID namespace: only the sandbox's own processes
    "--tmpfs", "/tmp",
    "--unshare-net",             # bwrap brings up only a loopback of its own
    "--unshare-pid",             # the tree dies with its PID 1 when bwrap is killed, even a setsid'd grandchild
    "--unshare-ipc",
    "--die-with-parent",         # SIGKILL to the sandbox when bwrap or the harness that started it dies
    "--new-session",             # setsid: the sandbox cannot push keystrokes into the harness's tty (TIOCSTI)
)


@functools.cache
def probe():
    """None when bubblewrap works here, else the reason it cannot be used (not installed; user namespaces disabled:
    include bwrap's own stderr). Runs `bwrap ... true` once; cache the answer."""
    if sys.platform != "linux":
        return f"bubblewrap needs Linux namespaces (this is {sys.platform})"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (no bwrap on PATH; apt install bubblewrap)"
    true = shutil.which("true") or "/bin/true"
    try:
        result = subprocess.run([bwrap, *BASE, "--", true], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not run: {e}"
    if result.returncode != 0:
        # The usual cause is unprivileged user namespaces being disabled (kernel.unprivileged_userns_clone=0,
        # an AppArmor restriction, or a container without CAP_SYS_ADMIN); bwrap's own words say which.
        return f"bwrap fails here (exit {result.returncode}): {result.stderr.strip() or 'no message'}"
    return None


def wrap(argv, *, run_dir, hide=(), expose=(), gpu=True):
    """The bwrap argv that runs argv (a list, never a shell string) inside the sandbox with cwd = run_dir.

    hide: directories (emptied) and files (unreadable); expose: paths made readable again inside hidden ones;
    run_dir: bound read-write, even inside a hidden directory. Paths are resolved; missing ones are skipped.
    """
    if isinstance(argv, (str, bytes)):
        raise TypeError("wrap takes argv as a list, never a shell string")
    run_dir = Path(run_dir).resolve(strict=True)
    # One mount per path; for the same path the later kind wins (a path both hidden and exposed is exposed).
    mounts = {}
    for kind, paths in (("hide", hide), ("expose", expose), ("rw", [run_dir])):
        for path in paths:
            path = Path(path).resolve()
            if path.exists() and path != Path("/"):
                mounts[path] = kind
    args = ["bwrap", *BASE]
    if gpu:
        args += _gpu_binds()
    # Outer paths first, so the more specific path always ends on top: a run dir or a venv inside a hidden repo,
    # a hidden validation file inside a visible data cache, a hidden dir inside an exposed one.
    hidden_dirs = []
    for path, kind in sorted(mounts.items(), key=lambda item: len(item[0].parts)):
        if kind == "rw":
            args += ["--bind", str(path), str(path)]
        elif kind == "expose":
            args += ["--ro-bind", str(path), str(path)]
        elif path.is_dir():
            args += ["--tmpfs", str(path)]
            hidden_dirs.append(path)
        else:
            # bwrap's --ro-bind mounts nodev, so the bound /dev/null cannot even be opened (EACCES).
            args += ["--ro-bind", "/dev/null", str(path)]
    # tmpfs starts writable; made read-only last, once bwrap has created the mount points of the paths inside it.
    # --remount-ro is not recursive: a run dir inside stays writable.
    for path in hidden_dirs:
        args += ["--remount-ro", str(path)]
    return [*args, "--chdir", str(run_dir), "--", *map(str, argv)]


def _gpu_binds():
    """--dev-bind for each NVIDIA and DRI device node that exists, at its /dev name (CUDA opens them by name)."""
    nodes = sorted(GPU_DEV_ROOT.glob("nvidia*")) + [GPU_DEV_ROOT / "dri"]
    args = []
    for node in nodes:
        if node.exists():
            args += ["--dev-bind", str(node), f"/dev/{node.name}"]
    return args


def scratch_env():
    """Env vars to add for a sandboxed run (cache dirs inside the private /tmp)."""
    # Compilers' caches must be writable; in the private /tmp they are, and vanish with the run, so one run can never
    # poison the kernels another run loads (the price: torch.compile starts cold every run).
    # XDG_CACHE_HOME and HOME stay as they are: the Hugging Face and torch hub caches under them (FA3 from the kernels
    # hub, prepared data) must stay readable, and the sandbox cannot download them again.
    return {
        "TRITON_CACHE_DIR": "/tmp/triton",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor",
        "CUDA_CACHE_PATH": "/tmp/nv-compute-cache",
        "TORCH_EXTENSIONS_DIR": "/tmp/torch-extensions",
        "MPLCONFIGDIR": "/tmp/matplotlib",
        # No network inside: say so, so the hub reads its cache at once instead of trying to connect first.
        "HF_HUB_OFFLINE": "1",
    }
