"""
HARNESS: the bubblewrap sandbox train.py and the evaluator run in. Owns what a sandboxed process may see, write and
reach (its view: an allow-list), how root is confined inside (no capabilities, an unprivileged uid, a seccomp
filter), the probe that says whether all that holds here, and the scratch environment for tools that write caches.
Only builds argv and env: never starts the training run itself, never kills anything, never touches git or the
ledger.

The view is built up from nothing, never "everything minus a list". A sandboxed process sees:
- the system: the system's own folders of /usr (USR, USR_LOCAL: never /usr whole, where images put applications
  and caches), the /bin, /lib, ... beside it, a short list of /etc files (ETC), the hardware parts of /sys, a minimal
  /dev with its own GPU's device nodes, a /proc of its own PID namespace; a git repository, a data cache or a hub
  cache found inside those system folders is hidden (view.foreign_trees);
- the Python environment (the venv, its base interpreter, their site-packages, library folders), read-only; a
  folder that holds a home directory is never bound whole, only what a prefix or library folder needs (view.narrow);
- what the target declares it reads (prepare.py --frozen-inputs: "train_reads" for train.py, "eval_reads" for the
  evaluator: the GRPO base model's pinned snapshot is one; no other model of the Hugging Face cache), read-only,
  with the evaluator-only files hidden from train.py even inside those;
- train.py: its run directory read-write; the evaluator: its pristine copy (its cwd) and the artifact (the run
  directory, where it starts with train.py: harness.run.evaluator.Warm), read-only;
- a private empty /tmp, /var/tmp and /dev/shm; nothing else: no home directory, no repository, no other copy of
  the data, no host socket, no network.
Root is confined: every capability dropped, uid and gid nobody in a user namespace of its own with no further user
namespaces, and a seccomp filter refusing the calls a training run never needs (SECCOMP_REFUSED). probe() checks
that inside, as whoever runs the harness (root included), before any run counts as sandboxed.

    argv = wrap([python, "train.py"], run_dir=run, expose=train_reads(inputs), hide=evaluator_only)
    subprocess.Popen(argv, cwd=run, env={**os.environ, **scratch_env()}, start_new_session=True)
"""

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.run import view
from harness.run.runner import interpreter

PROTECTIONS = (
    "an allow-list view: the system, the Python environment, the data and models the target declares and the "
    "run's own directory (the evaluator: its pristine copy and the artifact's run directory, read-only); no home, "
    "no repository, no other model, no host sockets",
    "read-only everywhere except the run directory and a private /tmp and /dev/shm",
    "root confined: every capability dropped, uid nobody in its own user namespace, a seccomp filter (no mount, "
    "unshare, setns, ptrace, keyctl, bpf, ...)",
    "no network: own network namespace (no TCP/UDP, no DNS, no abstract unix sockets of the host)",
    "own PID and IPC namespaces: other processes are invisible and unsignalable",
    "only its own GPU's device node",
    "the whole process tree dies with the harness or when its process group is killed",
    "new terminal session: no TIOCSTI keystroke injection into the harness's terminal",
)

# The confinement probe()'s checks, each with the words that name it when it fails. REQUIRED: a sandbox in which root
# keeps a capability, may mount or may write kernel settings is no sandbox (the host's disk, a program run as root).
CONFINEMENT = {
    "capabilities": "every capability dropped (CapEff and the bounding set 0)",
    "mount": "mount(2) refused",
    "uid": "an unprivileged uid (nobody) in a user namespace of its own, with no further user namespaces",
    "seccomp": "a seccomp filter refusing mount, unshare, setns, ptrace, keyctl, bpf and the like (libseccomp)",
    "proc": "kernel settings (/proc/sys) read-only",
}
REQUIRED = ("capabilities", "mount", "proc")

# System calls a training run or an evaluation never needs and an escape does (refused with EPERM): mounting and
# namespaces, tracing other processes, the kernel keyring (root's secrets), eBPF and perf, modules, handles that open
# files by inode (the classic container escape), clocks, swap, reboot, io_uring.
SECCOMP_REFUSED = (
    "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at", "name_to_handle_at", "swapon", "swapoff",
    "reboot", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "acct", "quotactl", "syslog",
    "iopl", "ioperm", "io_uring_setup", "io_uring_enter", "io_uring_register", "lookup_dcookie", "vhangup",
)
# clone() flags that make a namespace (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET): refused
CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)

# /etc: what the dynamic linker, the C library, compilers (torch.compile, Triton) and Python read; no shadow files,
# no ssh host keys, no private TLS keys.
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf", "hosts",
       "host.conf", "gai.conf", "services", "protocols", "localtime", "timezone", "os-release", "debian_version",
       "lsb-release", "mime.types", "fonts", "locale.alias", "ssl/certs", "ssl/openssl.cnf", "ca-certificates.conf",
       "OpenCL", "vulkan", "glvnd", "nvidia")
SYS = ("/sys/devices", "/sys/bus", "/sys/class", "/sys/dev", "/sys/module")   # hardware only (CPU count, GPUs, NUMA)
# /proc entries made read-only on top of the sandbox's own procfs. As root the sandbox's uid maps to uid 0 outside, and
# the kernel lets uid 0 write sysctls without a capability: /proc/sys/kernel/core_pattern set to a program would run
# it as root outside the sandbox at the next crash (found by a hostile test). The rest write only with capabilities.
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs", "mtrr", "pressure", "acpi", "scsi")
# Root-only files the sandbox's uid 0 could still read: physical page maps (side channels), kernel internals, keys.
PROC_MASKED = ("kpageflags", "kpagecount", "kpagecgroup", "kcore", "kmsg", "slabinfo", "timer_list", "sched_debug",
               "pagetypeinfo", "vmallocinfo", "keys", "key-users", "latency_stats")
# ... and /sys folders whose files act when read (zram's hot_add makes a block device) or are virtual devices a run
# never needs.
SYS_HIDDEN = ("/sys/class/zram-control", "/sys/devices/virtual/misc", "/sys/devices/virtual/zram-control")

# Module constants, so that a test can point them at fake trees.
GPU_DEV_ROOT = Path("/dev")
GPU_PROC_ROOT = Path("/proc/driver/nvidia/gpus")
GPU_CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps", "dri")
NOBODY = 65534

# Runs the real bwrap with the seccomp filter on an inherited pipe: bwrap reads the filter only from a file descriptor,
# no file holds it (a file another user could swap), and the argv stays a plain list (no shell).
# argv: FILTER_HEX BWRAP_ARGV..., where "{seccomp}" becomes the pipe's descriptor.
_LAUNCH = ("import os,sys\nr,w=os.pipe()\nos.write(w,bytes.fromhex(sys.argv[1]))\nos.close(w)\n"
           "os.set_inheritable(r,True)\na=[str(r) if x=='{seccomp}' else x for x in sys.argv[2:]]\nos.execv(a[0],a)\n")


def train_reads(inputs):
    """What train.py may read of the target's data: the frozen inputs' "train_reads" (prepare.py --frozen-inputs).
    A target that declares none (an older one) gets the existing absolute paths named by AUTORESEARCH_* variables,
    as before the allow-list; its evaluator-only files stay hidden either way."""
    if inputs and "train_reads" in inputs:
        return [Path(p) for p in inputs["train_reads"]]
    return [Path(v) for k, v in os.environ.items() if k.startswith("AUTORESEARCH_") and os.path.isabs(v)
            and Path(v).exists()]


def eval_reads(inputs):
    """What the separate evaluator may read besides its pristine copy and the artifact: the frozen inputs'
    "eval_reads"; for a target that declares none, the evaluator-only files and train_reads' fallback."""
    if inputs and "eval_reads" in inputs:
        return [Path(p) for p in inputs["eval_reads"]]
    return train_reads(None) + [Path(p) for p in (inputs or {}).get("evaluator_only", [])]


def train_argv(argv, run_dir, inputs, gpu, hide=(), also=()):
    """The sandboxed argv of train.py: the view above with the run dir read-write (and its cwd), the target's
    train_reads and the paths `also` read-only, the evaluator-only files (inputs["evaluator_only"]) and `hide`
    hidden. gpu: see wrap."""
    hidden = [*map(Path, (inputs or {}).get("evaluator_only", [])), *map(Path, hide)]
    return wrap(argv, run_dir=run_dir, expose=[*train_reads(inputs), *map(Path, also)], hide=hidden, gpu=gpu)


def eval_argv(argv, frozen_dir, artifact, inputs, gpu):
    """The sandboxed argv of the separate evaluator: the view above with its pristine copy as its cwd, the target's
    eval_reads and the artifact (or, for an evaluator started before training ends, the run dir it will be written
    in), all read-only; nothing writable."""
    return wrap(argv, run_dir=None, chdir=frozen_dir, expose=[*eval_reads(inputs), Path(frozen_dir), Path(artifact)],
                gpu=gpu)


class Tagged:
    """A tag's sandbox (harness.tag.opening makes it when bubblewrap is available): the argv of its train.py and of
    its evaluator, each in its view. inputs() -> what `prepare.py --frozen-inputs` declares (None: not read yet),
    asked at every wrap; hide: the repository and its git dir; env: scratch_env(); kernels: folders train.py reads
    besides what the target declares (the pinned Flash Attention kernel's cache folder: harness.run.flash)."""

    def __init__(self, inputs, hide):
        self.inputs, self.hide, self.env, self.kernels = inputs, list(hide), scratch_env(), []

    def train(self, argv, run_dir, gpu):
        """train_argv of this tag."""
        return train_argv(argv, run_dir, self.inputs(), gpu, hide=self.hide, also=self.kernels)

    def evaluate(self, argv, frozen_dir, artifact, gpu):
        """eval_argv of this tag."""
        return eval_argv(argv, frozen_dir, artifact, self.inputs(), gpu)


def wrap(argv, *, run_dir, expose=(), hide=(), chdir=None, gpu="", scratch_bytes=None, no_fork=False,
         _confine=None):
    """The bwrap argv that runs argv (a list, never a shell string) confined (see the module docstring).

    run_dir: bound read-write (None: nothing is writable but the private /tmp); expose: paths readable (besides
    the system and the environment); hide: directories (emptied) and files (unreadable) inside readable ones, and
    the credential stores; chdir: the cwd inside (default run_dir). Paths are resolved; missing ones are skipped; a
    path reached through a symbolic link is readable under that name too. gpu: the run's CUDA_VISIBLE_DEVICES value
    ("" none, "2" or "GPU-<uuid>": that GPU's device node alone; several: each). scratch_bytes: the size of each
    private tmpfs (/tmp, /var/tmp, /dev/shm; None: the kernel's default, half the memory); no_fork: the seccomp
    filter also refuses fork, vfork and clone (one process, one thread). Raises TypeError for a string argv.
    """
    if isinstance(argv, (str, bytes)):
        raise TypeError("wrap takes argv as a list, never a shell string")
    confine = confinement() if _confine is None else _confine
    run_dir = Path(run_dir).resolve(strict=True) if run_dir is not None else None
    mounts, links = _mounts(run_dir, expose, hide)
    args = ["bwrap", *_namespaces(confine), *_system()]
    if scratch_bytes is not None:       # each private tmpfs sized (bwrap's --size applies to the next --tmpfs)
        for at in reversed([i for i, x in enumerate(args) if x == "--tmpfs" and args[i + 1] in ("/tmp", "/var/tmp")]):
            args[at:at] = ["--size", str(scratch_bytes)]
        args += ["--size", str(scratch_bytes), "--tmpfs", "/dev/shm"]
    hidden_dirs = []
    # Outer paths first, so the more specific path always ends on top: a run dir or a venv inside a hidden repo,
    # a hidden validation file inside a visible data cache.
    for path, kind in sorted(mounts.items(), key=lambda item: len(item[0].parts)):
        if kind == "rw":
            args += ["--bind", str(path), str(path)]
        elif kind == "ro":
            args += ["--ro-bind", str(path), str(path)]
        elif not view.in_system(path) and not any(path.is_relative_to(p) for p, k in mounts.items()
                                              if k != "hide" and p != path):
            continue                                 # inside nothing visible: out of the view already
        elif path.is_dir():
            args += ["--tmpfs", str(path)]
            hidden_dirs.append(path)
        else:
            # bwrap's --ro-bind mounts nodev, so the bound /dev/null cannot even be opened (EACCES).
            args += ["--ro-bind", "/dev/null", str(path)]
    made = []
    for named, real in sorted(links.items(), key=lambda item: len(item[0].parts)):   # e.g. a venv through a link
        if not any(named.is_relative_to(p) for p in [*mounts, *made]):               # outer links cover inner ones
            args += ["--symlink", str(real), str(named)]
            made.append(named)
    args += _gpu_binds(gpu)
    # tmpfs starts writable; made read-only last, once bwrap has created the mount points inside it. --remount-ro
    # is not recursive: what is bound inside stays as it was bound. The root last of all: nothing outside the run
    # dir and the private /tmp is writable.
    for path in hidden_dirs:
        args += ["--remount-ro", str(path)]
    args += ["--remount-ro", "/", "--chdir", str(chdir or run_dir or "/"), "--", *map(str, argv)]
    program = seccomp_filter(no_fork) if confine.get("seccomp", True) else None
    if program is None:
        return args
    at = args.index("--")
    return [sys.executable, "-I", "-S", "-c", _LAUNCH, program.hex(), shutil.which("bwrap") or "bwrap",
            *args[1:at], "--seccomp", "{seccomp}", *args[at:]]


def _mounts(run_dir, expose, hide):
    """What wrap binds, as ({path: "ro" | "rw" | "hide"}, {a name reached through a link: the path it names}): the
    foreign trees hidden, the environment and `expose` readable (each narrowed: view.narrow), `hide` and the
    credentials hidden, run_dir (resolved, or None) writable; the later kind wins for one path."""
    mounts, links = {}, {}
    hidden = [Path(p).resolve() for p in (*hide, *view.credential_paths())]
    known = view.homes()
    # a foreign tree first, so that what the target declares inside it (its own data cache) is readable again
    for kind, paths in (("hide", view.foreign_trees()), ("ro", [*view.environment(known), *expose]), ("hide", hidden),
                        ("rw", [run_dir] if run_dir else [])):
        for given in paths:
            path = Path(given).resolve()
            if not path.exists() or path == Path("/") or kind == "ro" and (view.in_system(path) and not any(
                    path.is_relative_to(h) for h in [*hidden, *view.foreign_trees()]) or view.holds_system(path)):
                continue                             # /usr/local/cuda, LD_LIBRARY_PATH in /usr, CUDA_HOME=/usr,
                #                                      a venv of the system's Python (prefix /usr): there already
            named = Path(os.path.abspath(Path(given).expanduser()))
            for part in view.narrow(path, known=known) if kind == "ro" else [path]:     # never a home directory whole
                mounts[part] = kind                  # the later kind wins: hidden over readable, the run dir over all
                if kind == "ro" and named != path and not view.in_system(named):
                    links[named / part.relative_to(path)] = part
    return mounts, links


def _namespaces(confine):
    """The namespace and confinement flags: everything unshared, capabilities dropped, uid nobody where the user
    namespace works (confine: probe()'s findings; {} while probing)."""
    args = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox",
            "--die-with-parent",         # SIGKILL to the sandbox when bwrap or the harness that started it dies
            "--new-session",             # setsid: the sandbox cannot push keystrokes into the harness's tty (TIOCSTI)
            "--cap-drop", "ALL"]         # as root bwrap keeps every capability otherwise
    if confine.get("userns", True):
        args += ["--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    return args


def _system():
    """The system part of the view: view.system_view(), ETC, SYS, /dev, /proc, private /tmp."""
    args = []
    for path, link in view.system_view():
        args += ["--symlink", link, str(path)] if link is not None else ["--ro-bind", str(path), str(path)]
    for name in ETC:
        path = Path("/etc") / name
        if path.is_symlink():                   # os-release -> ../usr/lib/os-release: the link, not the host's file
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.exists():
            args += ["--ro-bind", str(path), str(path)]
    args += [arg for name in SYS if Path(name).exists() for arg in ("--ro-bind", name, name)]
    args += ["--dev", "/dev",                    # a fresh minimal /dev with its own tmpfs /dev/shm
             "--proc", "/proc"]                  # a procfs of the new PID namespace: only the sandbox's own processes
    args += [a for name in PROC_READONLY if os.path.exists(f"/proc/{name}") for a in ("--ro-bind", *[f"/proc/{name}"] * 2)]
    args += [a for name in PROC_MASKED if os.path.exists(f"/proc/{name}") for a in ("--ro-bind", "/dev/null", f"/proc/{name}")]
    args += [a for path in SYS_HIDDEN if os.path.isdir(path) for a in ("--tmpfs", path, "--remount-ro", path)]
    return args + ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]


def gpu_nodes(gpu):
    """(device node names, the CUDA_VISIBLE_DEVICES value to set inside or None) for the run's gpu (see wrap): the
    NVIDIA control nodes and the node of each GPU named, found through the driver's /proc/driver/nvidia/gpus
    (indices count in PCI bus order, as nvidia-smi does; a GPU-<uuid> is matched by its UUID). Inside, the GPUs are
    named by UUID, so that CUDA finds them whatever it numbers. Where the driver's table cannot be read, every
    NVIDIA node (as before, with CUDA_VISIBLE_DEVICES alone choosing)."""
    present = sorted(GPU_DEV_ROOT.glob("nvidia*")) + [GPU_DEV_ROOT / "dri"]
    gpus = [p for p in present if p.name[len("nvidia"):].isdigit()]
    if not str(gpu).strip() or not gpus:
        return [], None
    table = []
    for info in sorted(GPU_PROC_ROOT.glob("*/information")):
        try:
            fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
            table.append((fields["Device Minor"].strip(), fields["GPU UUID"].strip()))
        except (OSError, KeyError):
            table = []
            break
    control = [p.name for p in present if p.name in GPU_CONTROL or p.name.startswith("nvidia-caps")]
    wanted = [w.strip() for w in str(gpu).split(",") if w.strip()]
    chosen = [row for w in wanted for i, row in enumerate(table) if w == str(i) or w == row[1]]
    if not table or len(chosen) != len(wanted):
        return [p.name for p in present if p.exists()], None
    return control + [f"nvidia{minor}" for minor, _ in chosen], ",".join(uuid for _, uuid in chosen)


def run_gpu(env):
    """The GPU a run may use, as a CUDA_VISIBLE_DEVICES value: its device's (env, from --devices: "" for a CPU
    worker), else the first GPU this process may use (its own CUDA_VISIBLE_DEVICES), else GPU 0. One run, one GPU:
    training on all of a machine's GPUs would buy compute the budget does not count."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return str(env["CUDA_VISIBLE_DEVICES"])
    return (os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") or ["0"])[0]


def _gpu_binds(gpu):
    """--dev-bind for the run's GPU device nodes (gpu_nodes), at their /dev names, and the UUID inside."""
    names, visible = gpu_nodes(gpu)
    args = [a for name in names if (GPU_DEV_ROOT / name).exists()
            for a in ("--dev-bind", str(GPU_DEV_ROOT / name), f"/dev/{name}")]
    return args + (["--setenv", "CUDA_VISIBLE_DEVICES", visible] if visible else [])


@functools.cache
def seccomp_filter(no_fork=False):
    """The compiled seccomp filter (BPF bytes for this machine's architecture: libseccomp resolves the names; a few
    hundred bytes) refusing SECCOMP_REFUSED with EPERM, clone() asking for a new namespace, and clone3 with ENOSYS
    (its flags lie in memory a filter cannot read; the C library then falls back to clone); with no_fork, fork, vfork
    and clone as well. None where libseccomp or pyseccomp is missing. Made once a process per kind; wrap hands it to
    bwrap through a pipe."""
    try:
        import errno
        import pyseccomp as sc
        rules = sc.SyscallFilter(defaction=sc.ALLOW)
        for name in SECCOMP_REFUSED:
            try:
                rules.add_rule(sc.ERRNO(errno.EPERM), name)
            except (ValueError, RuntimeError, OSError):
                pass                            # a call this architecture does not have
        for flag in CLONE_NEW:
            rules.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        rules.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for name in ("fork", "vfork", "clone") if no_fork else ():
            try:
                rules.add_rule(sc.ERRNO(errno.EPERM), name)
            except (ValueError, RuntimeError, OSError):
                pass
        with tempfile.TemporaryFile() as out:
            rules.export_bpf(out)
            out.seek(0)
            return out.read()
    except Exception:                           # no libseccomp (OSError / RuntimeError from ctypes), no pyseccomp
        return None


# What the probe runs inside: the confinement as the process sees it, as JSON.
_PROBE = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
found = {"capabilities": int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0,
         "mount": libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) != 0,
         "seccomp": status.get("Seccomp", "0").strip() == "2"}
found["uid"] = os.getuid() != 0 and os.getgid() != 0 and libc.unshare(0x10000000) != 0
def writable(path):
    try:
        os.close(os.open(path, os.O_WRONLY))      # opened, never written
        return True
    except OSError:
        return False
found["proc"] = not any(writable(p) for p in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches"))
print(json.dumps(found))
"""


def _attempt(confine):
    """Run the probe inside bwrap with these confinement settings: (findings {check: bool} or None, error text)."""
    try:
        argv = wrap([interpreter(), "-I", "-S", "-c", _PROBE], run_dir=None, _confine=confine)
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"bwrap could not run: {e}"
    if result.returncode != 0:
        return None, f"bwrap fails here (exit {result.returncode}): {result.stderr.strip()[-500:] or 'no message'}"
    try:
        return json.loads(result.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, f"the confinement probe printed no findings: {result.stdout[-300:]!r}"


@functools.cache
def _probed():
    """(confinement settings that work here, findings, reason the sandbox is unusable or None); run once."""
    if sys.platform != "linux":
        return {}, {}, f"bubblewrap needs Linux namespaces (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return {}, {}, "bubblewrap is not installed (no bwrap on PATH; apt install bubblewrap)"
    errors = []
    for confine in ({"userns": True, "seccomp": True}, {"userns": False, "seccomp": True}):
        found, error = _attempt(confine)
        if found is not None:
            failed = [CONFINEMENT[k] for k in REQUIRED if not found.get(k)]
            if failed:
                return confine, found, ("the sandbox does not confine root here: " + "; ".join(failed)
                                        + " failed inside bwrap")
            return confine, found, None
        errors.append(error)
    # The usual cause is namespaces being unavailable (kernel.unprivileged_userns_clone=0, an AppArmor restriction,
    # a container without CAP_SYS_ADMIN); bwrap's own words say which.
    return {}, {}, errors[-1]


def probe():
    """None when the sandbox works and confines here (bwrap runs; inside, no capability is left and mount(2) is
    refused), else the reason it cannot be used. Run once a process (cached)."""
    return _probed()[2]


def confinement():
    """The confinement settings wrap uses ({"userns": bool, "seccomp": bool}): the user namespace only where it
    works here."""
    confine, found, _ = _probed()
    return {**confine, "seccomp": bool(found.get("seccomp", True))} if confine else {"userns": True, "seccomp": True}


def missing():
    """The protections of CONFINEMENT that do not hold here although the sandbox is usable (say, no user namespace
    as root, or no libseccomp): their words, for --sandbox auto to list and --sandbox bwrap to refuse."""
    _, found, reason = _probed()
    return [] if reason else [CONFINEMENT[k] for k in CONFINEMENT if not found.get(k)]


# What the view check runs inside: which of the files named in argv[1] (a JSON list) it can open and read a byte of.
_READS = r"""
import json, sys
found = []
for path in json.loads(sys.argv[1]):
    try:
        with open(path, "rb") as f:
            if f.read(1):
                found.append(path)
    except OSError:
        pass
print(json.dumps(found))
"""
SAMPLE = 64     # files of a folder the view check tries (the first found, outermost first)


def samples(path, skip=()):
    """The files of `path` the view check tries: the path itself when it is a file; for a folder, up to SAMPLE of
    the non-empty files found walking it outermost first, leaving out the folders of `skip` (what the view shows
    on purpose inside it: the venv inside a repository, the run dir)."""
    path = Path(path)
    if path.is_file():
        return [path]
    found, skip = [], [Path(p).resolve() for p in skip]
    for top, dirs, files in os.walk(path, onerror=lambda e: None):
        here = Path(top)
        dirs[:] = sorted(d for d in dirs if (here / d).resolve() not in skip)
        found += [here / f for f in sorted(files) if (here / f).is_file() and (here / f).stat().st_size]
        if len(found) >= SAMPLE:
            break
    return found[:SAMPLE]


def readable_inside(argv_of, paths, skip=()):
    """The files of `paths` (samples()) that a process started through argv_of (argv -> the sandboxed argv) can read:
    [] when the view hides them all. Raises RuntimeError when the check itself cannot run (bwrap failed)."""
    files = sorted({str(f) for p in paths if Path(p).exists() for f in samples(p, skip)})
    if not files:
        return []
    done = subprocess.run(argv_of([interpreter(), "-I", "-S", "-c", _READS, json.dumps(files)]), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, **scratch_env()})
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"the view check did not run (exit {done.returncode}): {done.stderr.strip()[-300:]}")


def scratch_env():
    """Env vars to add for a sandboxed run (cache dirs inside the private /tmp)."""
    # Compilers' caches must be writable; in the private /tmp they are, and vanish with the run, so one run can never
    # poison the kernels another run loads (the price: torch.compile starts cold every run).
    # HOME stays as it is: the Hugging Face hub cache under it (the GRPO base model, FA3 from the kernels hub) must
    # be found where it is (its models are in the view), and the sandbox cannot download them again.
    return {
        "TRITON_CACHE_DIR": "/tmp/triton",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor",
        "CUDA_CACHE_PATH": "/tmp/nv-compute-cache",
        "TORCH_EXTENSIONS_DIR": "/tmp/torch-extensions",
        "MPLCONFIGDIR": "/tmp/matplotlib",
        # No network inside: say so, so the hub reads its cache at once instead of trying to connect first.
        "HF_HUB_OFFLINE": "1",
    }
