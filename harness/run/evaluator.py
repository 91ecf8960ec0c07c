"""
HARNESS: the frozen prepare.py's processes around a run, for harness.run.runner: the separate evaluator (Cold starts
`prepare.py --evaluate ARTIFACT` once the artifact exists; Warm starts with train.py, does prepare.py's imports while
it trains and is told the artifact when it is there) and Waiting, the process both a warm evaluator and a warm speed
probe (harness.run.conditions.Probe.start) are: the start-up off the critical path (issue 40 part 2).
"""

import subprocess
import tempfile

from harness.run import processes


# A waiting prepare.py's program (a constant: nothing of a run's is in it). argv: prepare.py's path, then prepare.py's
# arguments. With sys.argv as `python prepare.py ARGS` has it, it imports the modules of prepare.py's leading imports
# (those before its first other statement, which may set what an import reads), in their order, and then, after
# torch, for an evaluation, what torch.export.load imports on first use; an import that fails or exits is left for
# prepare.py to meet again. Then it waits for a line (told to go: the artifact is there and checked, or the run ended)
# and runs prepare.py as `python prepare.py` would (its folder first on sys.path, as __main__). An end of input
# without a line (the harness gone) exits at once.
WARM_PROGRAM = """
import ast, importlib, runpy, sys
path = sys.argv[1]
sys.argv = [path, *sys.argv[2:]]
sys.path[0] = path.rsplit("/", 1)[0]
names = []
for i, node in enumerate(ast.parse(open(path, "rb").read()).body):
    if isinstance(node, ast.Import):
        names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names.append(node.module)
    elif not (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
        break
if "torch" in names and "--evaluate" in sys.argv:
    names += ["torch.export.pt2_archive._package", "torch._export.serde.serialize"]
for name in names:
    try:
        importlib.import_module(name)
    except (Exception, SystemExit):
        pass
if not sys.stdin.readline().endswith("\\n"):
    sys.exit(0)
runpy.run_path(path, run_name="__main__")
"""


class Cold:
    """The separate evaluator started once the artifact exists: `python prepare.py --evaluate ARTIFACT` through
    ev.wrap, right after the pristine copy is made (ev.setup) (ev: a runner.Evaluation; env: the run's environment;
    python: the interpreter's path)."""

    def __init__(self, ev, env, python):
        self.ev, self.env, self.python = ev, env, python

    def evaluate(self, limit, log_path, on_tick):
        """Run it for at most limit seconds (ticking), its output appended to log_path. Returns (returncode or None,
        timed_out)."""
        ev = self.ev
        ev.setup()
        rc, _, timed_out = processes.run_process(
            ev.wrap([self.python, str(ev.prepare_dir / "prepare.py"), "--evaluate", str(ev.artifact)]),
            ev.prepare_dir, log_path, self.env, limit, lambda pgid: None, on_tick, append=True)
        return rc, timed_out


class Warm:
    """The separate evaluator started with train.py (ev.warm_wrap: its view holds the run dir read-only, where the
    artifact will be; env, python: as Cold's): the pristine copy is made first (ev.setup), then a Waiting
    `prepare.py --evaluate ARTIFACT`, so the evaluation after training pays no start-up (about 4 s of torch and
    torch.export imports on a CPU). evaluate() tells it the artifact is there and waits; close() kills it if it still
    waits (train.py failed, Ctrl-C)."""

    def __init__(self, ev, env, python):
        ev.setup()
        self.waiting = Waiting(ev.warm_wrap, python, ev.prepare_dir, ["--evaluate", str(ev.artifact)], env)

    def evaluate(self, limit, log_path, on_tick):
        """Tell it the artifact is there, wait at most limit seconds (ticking), append its output to log_path.
        Returns (returncode or None, timed_out)."""
        try:
            return self.waiting.finish(limit, on_tick)
        finally:
            with open(log_path, "ab") as log:
                log.write(self.waiting.output())

    def close(self):
        """Kill it unless it was waited for (Waiting.close)."""
        self.waiting.close()


class Waiting:
    """`python prepare.py ARGS` (prepare_dir's, through wrap: the evaluator's sandbox) started now as WARM_PROGRAM: it
    does prepare.py's imports and waits until finish() tells it to go. Its output goes to an unnamed file (stderr
    to a second one with errors_apart, else with stdout); a harness that dies closes its input, and it exits. Raises
    OSError when it cannot start."""

    def __init__(self, wrap, python, prepare_dir, args, env, errors_apart=False):
        self.ours = processes.children()
        self.out = tempfile.TemporaryFile()
        self.err = tempfile.TemporaryFile() if errors_apart else None
        argv = wrap([python, "-c", WARM_PROGRAM, str(prepare_dir / "prepare.py"), *args])
        try:
            self.proc, self.token = processes.start(argv, env, cwd=prepare_dir, stdin=subprocess.PIPE,
                                                    stdout=self.out, stderr=self.err or subprocess.STDOUT)
        except OSError:
            self.out.close()
            if self.err:
                self.err.close()
            raise

    def finish(self, limit, on_tick=lambda elapsed: None):
        """Tell it to go and wait at most limit seconds (ticking); killed with its strays on timeout or any
        exception. Returns (returncode or None, timed_out)."""
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except OSError:                     # it died before it was told: its output and exit code say why
            pass
        rc, _, timed_out = processes.watch(self.proc, self.token, self.ours, self.out, limit, on_tick=on_tick)
        return rc, timed_out

    def output(self, errors=False):
        """Its output so far (bytes): stdout (and stderr unless errors_apart), or with errors, its stderr apart."""
        f = self.err if errors else self.out
        f.seek(0)
        return f.read()

    def close(self):
        """Kill it, and its strays, unless it was waited for (finish(), also when interrupted); its output file
        goes."""
        if self.proc.returncode is None:
            processes.kill_group(self.proc.pid, self.proc)
            processes.kill_strays(self.ours, self.token)
        self.out.close()
        if self.err:
            self.err.close()
