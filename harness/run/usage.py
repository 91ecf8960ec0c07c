"""HARNESS: a run's memory as the harness measures it (never what train.py prints): the peak resident memory of the
run's process tree from the kernel (/proc and the leader's rusage) and its GPU memory from NVML where there is a driver.
"""

import os
import resource
import sys
import threading

GB = 1024 ** 3                      # bytes in the "GB" of memory_gb (the summary's MB / 1024, as before)
_NVML, _NVML_LOCK = None, threading.Lock()   # None: not tried yet; (): no NVML here; else (pynvml, device handles)


class Peak:
    """The peaks of one run's process tree, in bytes, as sample() and reaped() see them. Counts only what it is shown:
    the runner samples the training run's tree, never the evaluator's."""

    def __init__(self):
        self.tree_rss = 0           # the largest sum of VmRSS over the tree at one sample
        self.process_hwm = 0        # the largest VmHWM of one process of the tree (its own peak, between samples too)
        self.reaped_rss = 0         # the reaped leader's ru_maxrss where it exceeds ours (see reaped), else 0
        self.gpu = None             # the largest sum of NVML's per-process GPU memory over the tree; None: no NVML
        self.samples = 0            # how many samples found the tree (the root still running)
        self._adopted = {}          # (pid, start time) -> whether a child of ours carries the marker (see sample)

    def sample(self, root, marker=None):
        """Add one sample of the process tree rooted at pid root: every process whose chain of parents (in /proc)
        reaches root, plus, where marker (bytes, e.g. b"NAME=value") is given, every child of this process carrying
        that exact entry in its environment and its tree (a run's process that detached itself and was re-parented to
        us as subreaper). Costs one read of /proc/*/stat (a few ms for a few hundred processes) and one NVML query per
        device. Never raises (processes vanish mid-read); a root that is gone adds nothing."""
        try:
            parents = _parents()
            roots = {root} | (self._marked(parents, marker) if marker else set())
            tree = _tree(parents, roots & parents.keys())
            if not tree:
                return
            self.samples += 1
            total = 0
            for pid in tree:
                rss, hwm = _rss_hwm(pid)
                total += rss
                self.process_hwm = max(self.process_hwm, hwm)
            self.tree_rss = max(self.tree_rss, total)
            gpu = gpu_memory(tree)
            if gpu is not None:
                self.gpu = max(self.gpu or 0, gpu)
        except Exception:                           # a measurement never fails a run
            pass

    def reaped(self, rusage):
        """Add the rusage of the reaped leader (os.wait4's): its ru_maxrss is the largest peak of the leader and of the
        descendants it waited for, which catches a child that came and went between samples. But the kernel also
        counts in it the memory of the process that forked the leader (this one) as it was before the exec, so it
        is taken only where it exceeds our own peak (RUSAGE_SELF), which bounds that part."""
        try:
            theirs, ours = int(rusage.ru_maxrss), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            if theirs > ours:
                self.reaped_rss = max(self.reaped_rss, theirs * (1 if sys.platform == "darwin" else 1024))
        except (AttributeError, TypeError, ValueError, OSError):
            pass

    @property
    def rss(self):
        """Peak resident memory of the tree, bytes: the largest of the tree's sum at a sample, one process's own peak
        and the reaped leader's ru_maxrss (0 where none of them was seen). A sum counts pages that processes share
        (a fork's copy-on-write pages) once per process."""
        return max(self.tree_rss, self.process_hwm, self.reaped_rss)

    @property
    def source(self):
        """What memory_gb measures: "gpu" when NVML saw GPU memory of the tree (> 0), else "rss"."""
        return "gpu" if self.gpu else "rss"

    def memory_gb(self):
        """The run's memory in GB (2**30 bytes): its peak GPU memory where NVML measured any, else its peak RSS."""
        return (self.gpu if self.gpu else self.rss) / GB

    def _marked(self, parents, marker):
        """Our children (by parents, {pid: (ppid, start time)}) whose environment holds the entry marker."""
        me, found = os.getpid(), set()
        for pid, (ppid, start) in parents.items():
            if ppid != me:
                continue
            key = (pid, start)
            if key not in self._adopted:
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        self._adopted[key] = marker in f.read().split(b"\0")
                except OSError:
                    continue                        # not readable (yet): asked again next time
            if self._adopted[key]:
                found.add(pid)
        return found


def _parents():
    """{pid: (parent pid, start time)} of every process in /proc ({} where there is no /proc)."""
    found = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()    # the name in () may hold spaces and parentheses
            found[int(name)] = (int(fields[1]), fields[19])
        except (OSError, IndexError, ValueError):
            pass
    return found


def _tree(parents, roots):
    """The pids of roots and of all their descendants, by parents ({pid: (ppid, ...)})."""
    children = {}
    for pid, (ppid, _) in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


def _rss_hwm(pid):
    """(VmRSS, VmHWM) of a process in bytes, (0, 0) when it is gone or has none (a zombie, a kernel thread)."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
                elif line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    break                           # VmRSS comes after VmHWM
    except (OSError, IndexError, ValueError):
        pass
    return rss, hwm


def gpu_devices():
    """The NVML device handles of this machine, () where NVML is not available (no pynvml, no driver, no device: its
    errors mean exactly that). Decided once per process, quietly."""
    global _NVML
    with _NVML_LOCK:
        if _NVML is None:
            _NVML = ()
            try:
                import pynvml
                pynvml.nvmlInit()
                handles = tuple(pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount()))
                if handles:
                    _NVML = (pynvml, handles)
            except Exception:
                pass
        return _NVML[1] if _NVML else ()


def gpu_memory(pids):
    """Bytes of GPU memory NVML reports for the processes pids (an iterable of host pids), summed over every device;
    None where NVML is not available (gpu_devices). A device or process whose memory NVML cannot report (MIG, some
    containers) adds 0. Never raises."""
    if not gpu_devices():
        return None
    pynvml, handles = _NVML
    pids, total = set(pids), 0
    for handle in handles:
        try:
            running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            continue
        for proc in running:
            used = getattr(proc, "usedGpuMemory", None)
            if getattr(proc, "pid", None) in pids and isinstance(used, int):
                total += used
    return total
