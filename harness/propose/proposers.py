"""
HARNESS: who proposes the next edit. One signature for all of them, Proposer.ask(system, messages, train_src, n)
-> Reply: an LLM provider (harness.propose.providers: its calls retried there, its answers priced), a sampler
(harness.propose.search) or the random/grid perturbations (harness.propose.perturb). Never sees git, the ledger or the
training run; never logs or returns an API key.
"""

import dataclasses
import os
from typing import Callable

from harness import console
from harness.errors import SetupError, Stop
from harness.propose.perturb import grid
from harness.propose.providers import PROVIDERS, Provider, Reply, call_with_retries, words

PROPOSERS = (*PROVIDERS, "tpe", "cmaes", "random", "grid", "hybrid")   # --proposer (harness/propose/search.py: samplers)


@dataclasses.dataclass
class Proposer:
    """name: one of PROPOSERS. ask(system, messages, train_src, n) -> Reply: an LLM reads system + messages; a sampler
    or random/grid read train_src and the experiment number n. Set profile (the device class `prepare.py --check`
    reported, so that random/grid perturb the `if PROFILE == ...` branch that runs) and on_retry(retry, problem,
    delay_s) (called before each backoff sleep) once they are known."""
    name: str
    model: str | None
    provider: Provider | None = None        # the LLM's (harness.propose.providers); None: no LLM
    args: object = None
    profile: str | None = None
    on_retry: Callable | None = None
    asked: dict = dataclasses.field(default_factory=dict)  # no LLM: experiment n -> points asked for it
    suggest: Callable | None = None         # a sampler: (train_src, n, attempt) -> answer
    names: set | None = None                # grid: the constants it may move (None: all)

    @property
    def is_llm(self):
        """True for the LLM providers (only they can be asked to fix a crash)."""
        return self.provider is not None

    def ask(self, system, messages, train_src, n):
        """One answer: the LLM's (transient errors retried, see call_with_retries), or a perturbation."""
        if self.provider is None:
            self.asked[n] = attempt = self.asked.get(n, -1) + 1    # a repair or a retry asks for another choice
            if self.suggest is not None:
                return Reply(self.suggest(train_src, n, attempt))
            return Reply(grid(train_src, n, self.profile, attempt, self.names))
        return call_with_retries(self.provider, lambda: self.provider.complete(system, messages),
                                 self.args.retry_base_delay, self.on_retry)

    def check(self):
        """One tiny request (a 1-token answer) before anything is created or trained, so that a dead server, a
        refused key or an unknown model stops the run at once instead of after the baseline. Raises SetupError (exit
        2: nothing changed) when nothing answers there or the answer is a refusal; a transient error (429, 5xx) is
        retried like any call, with a line per retry. A no-op for random/grid."""
        if self.provider is None:
            return
        try:
            call_with_retries(self.provider, self.provider.ping, self.args.retry_base_delay, self.on_retry or (
                lambda retry, problem, delay: console.say(f"LLM check: {problem[:120]}; retry {retry + 1} in "
                                                          f"{delay:.0f}s")), unreachable_stops=True)
        except Stop as e:
            raise SetupError(f"{e} (nothing was created)") from None


def make_proposer(args):
    """The Proposer for --proposer (with --model, --base-url, --seed, --retry-base-delay, --tag from args; args.llm:
    the provider's name, settings.parse). The SDKs' own retries are off: call_with_retries owns them. Raises
    SetupError when an LLM proposer has no key."""
    if args.llm is None and args.proposer != "hybrid":
        return Proposer(args.proposer, None, args=args)
    if args.llm is None:
        raise SetupError(f"--proposer hybrid needs an LLM: set {words('key_env')} (or --base-url for a local "
                         "server); without a key use --proposer tpe or cmaes")
    kind = PROVIDERS[args.llm]
    key = os.environ.get(kind.key_env) or ("unused" if args.base_url else None)  # local servers take any key
    if not key:
        raise SetupError(f"--proposer {args.proposer} needs {kind.key_env} in the environment (or --base-url "
                         "for a local server); without a key use --proposer tpe")
    return Proposer(args.proposer, args.model, kind(key, args.model, args.base_url), args)
