"""
HARNESS: who proposes the next edit. One signature for all of them, Proposer.ask(system, messages, train_src, n)
-> Reply: the LLM providers (Anthropic Messages; OpenAI Chat Completions, also any OpenAI-compatible server) with
retries and prices, and the random/grid perturbations (harness.perturb). Owns the SDK clients and the price table.
Never sees git, the ledger or the training run; never logs or returns an API key.
"""

import dataclasses
import itertools
import os
import random
import time
from typing import Callable

from harness import console
from harness.errors import SetupError, Stop
from harness.perturb import grid

LLM_PROVIDERS = ("anthropic", "openai")
PROPOSERS = (*LLM_PROVIDERS, "tpe", "cmaes", "random", "grid", "hybrid")   # --proposer (harness/search.py: samplers)
RETRY_CAP_S = 60.0              # longest sleep between LLM retries
MAX_OUTPUT_TOKENS = 16384
DEFAULT_MODELS = {"anthropic": "claude-sonnet-5-5", "openai": "gpt-5.5"}
KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
# USD per million tokens: (input, output, cached input read, cache write). Published list prices, Nov 2026.
# An unknown model costs 0 (its tokens are still counted).
PRICES = {
    "claude-sonnet-5-5": (2.0, 10.0, 0.20, 2.50),
    "claude-sonnet-5": (2.0, 10.0, 0.20, 2.50),
    "claude-sonnet-4-5": (3.0, 15.0, 0.30, 3.75),
    "claude-haiku-4-5": (1.0, 5.0, 0.10, 1.25),
    "claude-opus-4-5": (5.0, 25.0, 0.50, 6.25),
    "gpt-5.5": (5.0, 30.0, 0.50, 0.0),
    "gpt-5.4": (2.5, 15.0, 0.25, 0.0),
    "gpt-5.4-mini": (0.75, 4.5, 0.075, 0.0),
}


@dataclasses.dataclass(frozen=True)
class Spend:
    """What asking the proposer cost: tokens in and out, USD (at PRICES, per million tokens) and seconds waited on
    it (retries included). Sums with +, differences with -; share(k) is one of k ideas' part of one answer."""
    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0
    llm_seconds: float = 0.0

    def __add__(self, other):
        return Spend(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def __sub__(self, other):
        return Spend(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def share(self, k):
        """This spend split evenly over k ideas (k >= 1)."""
        return Spend(*(v / k for v in dataclasses.astuple(self)))


@dataclasses.dataclass
class Reply:
    """One proposer answer with its accounting (tokens, USD, seconds including retries)."""
    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0

    @property
    def spend(self):
        """Its accounting as a Spend."""
        return Spend(self.input_tokens, self.output_tokens, self.cost_usd, self.seconds)


@dataclasses.dataclass
class Proposer:
    """name: anthropic | openai | random | grid. ask(system, messages, train_src, n) -> Reply: an LLM reads system +
    messages; random/grid read train_src and the experiment number n. Set profile (the device class `prepare.py
    --check` reported, so that random/grid perturb the `if PROFILE == ...` branch that runs) and on_retry(retry,
    problem, delay_s) (called before each backoff sleep) once they are known."""
    name: str
    model: str | None
    call: Callable | None = None            # the LLM provider: (system, messages) -> Reply, one attempt
    args: object = None
    profile: str | None = None
    on_retry: Callable | None = None
    ping: Callable | None = None            # the LLM provider's smallest request: () -> Reply, one attempt
    asked: dict = dataclasses.field(default_factory=dict)  # no LLM: experiment n -> points asked for it
    suggest: Callable | None = None         # a sampler: (train_src, n, attempt) -> answer
    names: set | None = None                # grid: the constants it may move (None: all)

    @property
    def is_llm(self):
        """True for the LLM providers (only they can be asked to fix a crash)."""
        return self.call is not None

    def ask(self, system, messages, train_src, n):
        """One answer: the LLM's (transient errors retried, see call_with_retries), or a perturbation."""
        if self.call is None:
            self.asked[n] = attempt = self.asked.get(n, -1) + 1    # a repair or a retry asks for another choice
            if self.suggest is not None:
                return Reply(self.suggest(train_src, n, attempt))
            return Reply(grid(train_src, n, self.profile, attempt, self.names))
        return call_with_retries(self.call, system, messages, self.args, self.on_retry)

    def check(self):
        """One tiny request (a 1-token answer) before anything is created or trained, so that a dead server, a
        refused key or an unknown model stops the run at once instead of after the baseline. Raises SetupError (exit
        2: nothing changed) when nothing answers there or the answer is a refusal; a transient error (429, 5xx) is
        retried like any call, with a line per retry. A no-op for random/grid."""
        if self.ping is None:
            return
        try:
            call_with_retries(lambda system, messages: self.ping(), "", [], self.args, self.on_retry or (
                lambda retry, problem, delay: console.say(f"LLM check: {problem[:120]}; retry {retry + 1} in "
                                                          f"{delay:.0f}s")), unreachable_stops=True)
        except Stop as e:
            raise SetupError(f"{e} (nothing was created)") from None


def make_proposer(args):
    """The Proposer for --proposer (with --model, --base-url, --seed, --retry-base-delay, --tag from args).
    The SDKs' own retries are off (max_retries=0): call_with_retries owns them. Raises SetupError when an LLM
    proposer has no key."""
    if args.llm is None and args.proposer != "hybrid":
        return Proposer(args.proposer, None, args=args)
    if args.llm is None:
        raise SetupError("--proposer hybrid needs an LLM: set ANTHROPIC_API_KEY or OPENAI_API_KEY (or --base-url for "
                         "a local server); without a key use --proposer tpe or cmaes")
    key = os.environ.get(KEY_ENV[args.llm]) or ("unused" if args.base_url else None)  # local servers take any key
    if not key:
        raise SetupError(f"--proposer {args.proposer} needs {KEY_ENV[args.llm]} in the environment (or --base-url "
                         "for a local server); without a key use --proposer tpe")
    # The SDKs are imported only here: the random and grid proposers (and a GPU box without them) never load them.
    if args.llm == "anthropic":
        import anthropic
        client = anthropic.Anthropic(api_key=key, base_url=args.base_url, max_retries=0, timeout=600)
        return Proposer(args.proposer, args.model, lambda system, messages: ask_anthropic(
            client, args.model, system, messages), args, ping=lambda: ping_anthropic(client, args.model))
    import openai
    client = openai.OpenAI(api_key=key, base_url=args.base_url, max_retries=0, timeout=600)
    return Proposer(args.proposer, args.model, lambda system, messages: ask_openai(
        client, args.model, system, messages), args, ping=lambda: ping_openai(client, args.model))


def ask_anthropic(client, model, system, messages):
    """Anthropic Messages API. The system prompt (instructions + frozen files) is the stable prefix, marked for
    prompt caching; input_tokens counts uncached + cache-read + cache-write tokens."""
    r = anthropic_response(client.messages.create(
        model=model, max_tokens=MAX_OUTPUT_TOKENS, messages=messages,
        system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]))
    u = r.usage
    read, write = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
    text = "".join(block.text for block in r.content if block.type == "text")
    return Reply(text, u.input_tokens + read + write, u.output_tokens,
                 price(model, u.input_tokens, u.output_tokens, read, write))


def ask_openai(client, model, system, messages):
    """OpenAI Chat Completions (also vLLM, ollama, DeepSeek, OpenRouter through --base-url). OpenAI caches long
    prefixes by itself; cached tokens are priced as such."""
    r = openai_response(client.chat.completions.create(model=model, max_completion_tokens=MAX_OUTPUT_TOKENS,
                                                       messages=[{"role": "system", "content": system}, *messages]))
    u = r.usage
    prompt, completion = (u.prompt_tokens, u.completion_tokens) if u else (0, 0)
    details = getattr(u, "prompt_tokens_details", None)
    cached = (details.cached_tokens or 0) if details else 0
    return Reply(r.choices[0].message.content or "", prompt, completion, price(model, prompt - cached, completion,
                                                                             cached, 0))


PING = [{"role": "user", "content": "Reply with OK."}]   # Proposer.check's request, answered in one token


class BadReply(Exception):
    """An endpoint answered 200 with something that is not a Messages / Chat Completions response."""


def anthropic_response(r):
    """r if it has what a Messages response must have (a content list and usage), else BadReply."""
    if not isinstance(getattr(r, "content", None), list) or getattr(r, "usage", None) is None:
        raise BadReply(f"no content list or usage in {str(r)[:200]!r}")
    return r


def openai_response(r):
    """r if it has what a Chat Completions response must have (at least one choice with a message), else BadReply."""
    if not getattr(r, "choices", None) or getattr(r.choices[0], "message", None) is None:
        raise BadReply(f"no choices in {str(r)[:200]!r}")
    return r


def ping_anthropic(client, model):
    """The smallest Messages request: proves the key, the model id and the endpoint. Returns an empty Reply."""
    anthropic_response(client.messages.create(model=model, max_tokens=1, messages=PING))
    return Reply("")


def ping_openai(client, model):
    """The smallest Chat Completions request: proves the key, the model id and the endpoint. Returns an empty Reply."""
    openai_response(client.chat.completions.create(model=model, max_completion_tokens=1, messages=PING))
    return Reply("")


def price_key(model):
    """The PRICES entry of a model id (dated ids like claude-haiku-4-5-20251001 use their base entry), or None."""
    return max((k for k in PRICES if model == k or model.startswith(k + "-")), key=len, default=None)


def price(model, uncached_in, out, cache_read, cache_write):
    """USD for one call from PRICES; 0 for a model the table does not know."""
    key = price_key(model)
    if key is None:
        return 0.0
    p_in, p_out, p_read, p_write = PRICES[key]
    return (uncached_in * p_in + out * p_out + cache_read * p_read + cache_write * p_write) / 1e6


def call_with_retries(call, system, messages, args, on_retry=None, unreachable_stops=False):
    """call(system, messages) until it answers: transient errors (429, 5xx, overloaded, timeouts, dropped
    connections) are retried forever with exponential backoff and jitter (base args.retry_base_delay, cap
    RETRY_CAP_S). Authentication errors, unknown models and other rejected requests raise Stop at once, and so does
    an endpoint nothing answers at with unreachable_stops (the check at the start).
    The Reply's seconds include the retries."""
    import anthropic
    import openai
    t0 = time.monotonic()
    for retry in itertools.count():
        try:
            reply = call(system, messages)
            reply.seconds = time.monotonic() - t0
            return reply
        except (anthropic.APIConnectionError, openai.APIConnectionError) as e:
            problem = f"{type(e).__name__}: {e}"
            if unreachable_stops:
                raise Stop(f"cannot reach {args.base_url or f'the {args.llm} API'} ({problem}): is the server "
                           "running and the address right (--base-url)? Rerun once it answers") from None
        except BadReply as e:
            where = args.base_url or f"the {args.llm} API"
            api = "an Anthropic Messages" if args.llm == "anthropic" else "an OpenAI Chat Completions"
            raise Stop(f"{where} answered, but not in {api} format ({e}): check --base-url and the key you "
                       "set") from None
        except (anthropic.APIStatusError, openai.APIStatusError) as e:
            if e.status_code not in (408, 409, 425, 429) and e.status_code < 500:
                raise Stop(fatal_llm_message(args, e)) from None
            problem = f"HTTP {e.status_code}: {e.message}"
        delay = min(RETRY_CAP_S, args.retry_base_delay * 2 ** retry) * random.uniform(0.5, 1.0)
        if on_retry:
            on_retry(retry, problem, delay)
        time.sleep(delay)


def fatal_llm_message(args, e):
    """A clear message for an LLM error that retrying cannot fix."""
    where = args.base_url or f"the {args.llm} API"
    if e.status_code in (401, 403):
        return f"{where} refused the key (HTTP {e.status_code}): check {KEY_ENV[args.llm]}. {e.message}"
    if e.status_code == 404:
        return (f"{where} does not know model {args.model!r} or the endpoint (HTTP 404): pass a valid --model "
                f"(and --base-url). {e.message}")
    return f"{where} rejected the request (HTTP {e.status_code}): {e.message}"
