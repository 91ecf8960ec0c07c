"""
HARNESS: the LLM providers behind one protocol, and the registry that names them. A Provider completes a
conversation, pings (the smallest request), classifies any error its SDK raises as retry / fatal / unreachable /
bad reply, and prices a call from PRICES; call_with_retries owns the retry policy for all of them. PROVIDERS maps
each --proposer name to its class: another provider (say, Gemini) is one class here and its entry there. The SDKs
are imported when a provider is made, never before. Never logs or returns an API key.
"""

import dataclasses
import importlib
import itertools
import random
import time
from typing import NamedTuple

from harness.errors import Stop

RETRY_CAP_S = 60.0              # longest sleep between LLM retries
MAX_OUTPUT_TOKENS = 16384
PING = [{"role": "user", "content": "Reply with OK."}]   # Provider.ping's request, answered in one token
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


class Failure(NamedTuple):
    """What a provider makes of an error: kind "retry" (transient: 429, 5xx, a timeout), "unreachable" (nothing
    answers there: retried, except at the start), "fatal" (retrying cannot fix it) or "bad_reply" (an answer not in
    the provider's format); words: the problem, or for "fatal" the whole message with its fix."""
    kind: str
    words: str


class BadReply(Exception):
    """An endpoint answered 200 with something that is not the provider's response format."""


class Provider:
    """The protocol (subclasses set the class attributes and the four methods). name: the --proposer value; key_env:
    the variable holding its key; default_model: --model's default; api: the response format, in words."""
    name = key_env = default_model = api = ""

    def __init__(self, key, model, base_url=None):
        self.model, self.base_url = model, base_url

    @property
    def where(self):
        """The endpoint in words, for messages."""
        return self.base_url or f"the {self.name} API"

    def complete(self, system, messages):
        """One attempt: system prompt + messages -> Reply. Raises the SDK's errors (see classify) or BadReply."""
        raise NotImplementedError

    def ping(self):
        """The smallest request (a 1-token answer): proves the key, the model id and the endpoint. -> Reply("")."""
        raise NotImplementedError

    def classify(self, e):
        """The Failure an exception stands for, or None when it is not this provider's (a bug: it propagates)."""
        return self.bad_reply(e) if isinstance(e, BadReply) else None

    def bad_reply(self, e):
        """The "bad_reply" Failure: the endpoint answered with something that is not the provider's format."""
        what = str(e) if isinstance(e, BadReply) else f"{type(e).__name__}: {e}"
        return Failure("bad_reply", f"{self.where} answered, but not in {self.api} format ({what[:300]}): check "
                                    "--base-url and the key you set")

    def status_failure(self, status, message):
        """The Failure of an HTTP status: 408, 409, 425, 429 and 5xx are retried; 401/403 (the key), 404 (the model or
        the endpoint) and other 4xx are fatal, each with its fix."""
        if status in (408, 409, 425, 429) or status >= 500:
            return Failure("retry", f"HTTP {status}: {message}")
        if status in (401, 403):
            return Failure("fatal", f"{self.where} refused the key (HTTP {status}): check {self.key_env}. {message}")
        if status == 404:
            return Failure("fatal", f"{self.where} does not know model {self.model!r} or the endpoint (HTTP 404): "
                                    f"pass a valid --model (and --base-url). {message}")
        return Failure("fatal", f"{self.where} rejected the request (HTTP {status}): {message}")


class Stainless(Provider):
    """The shared half of the Anthropic and OpenAI SDKs (both generated by Stainless: one client signature, one error
    hierarchy): a subclass names its SDK's module and client class (sdk_name, "module.Client")."""
    sdk_name = ""

    def __init__(self, key, model, base_url=None):
        super().__init__(key, model, base_url)
        module, _, client = self.sdk_name.partition(".")
        self.sdk = importlib.import_module(module)      # imported here: a loop without an LLM never loads an SDK
        self.client = getattr(self.sdk, client)(api_key=key, base_url=base_url, max_retries=0, timeout=600)

    def classify(self, e):
        if isinstance(e, self.sdk.APIConnectionError):
            return Failure("unreachable", f"{type(e).__name__}: {e}")
        if isinstance(e, self.sdk.APIStatusError):
            return self.status_failure(e.status_code, e.message)
        if isinstance(e, (self.sdk.APIError, TypeError, AttributeError, KeyError, ValueError)):
            return self.bad_reply(e)    # a 200 the SDK or complete() cannot read: not JSON, fields of other types
        return super().classify(e)


class Anthropic(Stainless):
    """Anthropic Messages. The system prompt (instructions + frozen files) is the stable prefix, marked for prompt
    caching; input_tokens counts uncached + cache-read + cache-write tokens."""
    name, key_env, default_model, api = "anthropic", "ANTHROPIC_API_KEY", "claude-sonnet-5-5", "an Anthropic Messages"
    sdk_name = "anthropic.Anthropic"

    @staticmethod
    def checked(r):
        """r if it has what a Messages response must have (a content list and usage), else BadReply."""
        if not isinstance(getattr(r, "content", None), list) or getattr(r, "usage", None) is None:
            raise BadReply(f"no content list or usage in {str(r)[:200]!r}")
        return r

    def complete(self, system, messages):
        r = self.checked(self.client.messages.create(
            model=self.model, max_tokens=MAX_OUTPUT_TOKENS, messages=messages,
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]))
        u = r.usage
        read, write = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
        text = "".join(block.text for block in r.content if block.type == "text")
        return Reply(text, u.input_tokens + read + write, u.output_tokens,
                     price(self.model, u.input_tokens, u.output_tokens, read, write))

    def ping(self):
        self.checked(self.client.messages.create(model=self.model, max_tokens=1, messages=PING))
        return Reply("")


class OpenAI(Stainless):
    """OpenAI Chat Completions (also vLLM, ollama, DeepSeek, OpenRouter through --base-url). OpenAI caches long
    prefixes by itself; cached tokens are priced as such."""
    name, key_env, default_model, api = "openai", "OPENAI_API_KEY", "gpt-5.5", "an OpenAI Chat Completions"
    sdk_name = "openai.OpenAI"

    @staticmethod
    def checked(r):
        """r if it has what a Chat Completions response must have (a choice with a message), else BadReply."""
        if not getattr(r, "choices", None) or getattr(r.choices[0], "message", None) is None:
            raise BadReply(f"no choices in {str(r)[:200]!r}")
        return r

    def complete(self, system, messages):
        r = self.checked(self.client.chat.completions.create(
            model=self.model, max_completion_tokens=MAX_OUTPUT_TOKENS,
            messages=[{"role": "system", "content": system}, *messages]))
        u = r.usage
        prompt, completion = (u.prompt_tokens, u.completion_tokens) if u else (0, 0)
        details = getattr(u, "prompt_tokens_details", None)
        cached = (details.cached_tokens or 0) if details else 0
        return Reply(r.choices[0].message.content or "", prompt, completion,
                     price(self.model, prompt - cached, completion, cached, 0))

    def ping(self):
        self.checked(self.client.chat.completions.create(model=self.model, max_completion_tokens=1, messages=PING))
        return Reply("")


PROVIDERS = {p.name: p for p in (Anthropic, OpenAI)}    # --proposer NAME -> its class, in the order keys are looked for
LOCAL = "openai"        # what a --base-url without a key speaks: any OpenAI-compatible server


def detect(environ, base_url=None):
    """The provider a loop without --proposer uses: the first of PROVIDERS whose key is set in environ, LOCAL with a
    base_url, else None."""
    return next((name for name, p in PROVIDERS.items() if environ.get(p.key_env)), LOCAL if base_url else None)


def words(attribute, joiner=" or "):
    """Each registered provider's name, key_env or default model, joined: "anthropic or openai"."""
    return joiner.join(getattr(p, attribute) for p in PROVIDERS.values())


def price_key(model):
    """The PRICES entry of a model id (dated ids like claude-haiku-4-5-20251001 use their base entry), or None."""
    return max((k for k in PRICES if model == k or model.startswith(k + "-")), key=len, default=None)


def price(model, uncached_in, out, cache_read, cache_write):
    """USD for one call from PRICES (per million tokens); 0 for a model the table does not know."""
    key = price_key(model)
    if key is None:
        return 0.0
    p_in, p_out, p_read, p_write = PRICES[key]
    return (uncached_in * p_in + out * p_out + cache_read * p_read + cache_write * p_write) / 1e6


def call_with_retries(provider, call, base_delay, on_retry=None, unreachable_stops=False):
    """call() (one attempt of provider's) until it answers: what provider.classify calls "retry" or "unreachable" is
    retried forever with exponential backoff and jitter (base_delay seconds, doubling, cap RETRY_CAP_S); "fatal" and
    "bad_reply" raise Stop at once, and so does "unreachable" with unreachable_stops (the check at the start); an
    error no provider claims propagates. on_retry(retry, problem, delay_s) runs before each sleep. The Reply's
    seconds include the retries."""
    t0 = time.monotonic()
    for retry in itertools.count():
        try:
            reply = call()
            reply.seconds = time.monotonic() - t0
            return reply
        except Exception as e:          # noqa: BLE001 - each provider says which of its errors are which
            failure = provider.classify(e)
            if failure is None:
                raise
        if failure.kind in ("fatal", "bad_reply"):
            raise Stop(failure.words) from None
        if failure.kind == "unreachable" and unreachable_stops:
            raise Stop(f"cannot reach {provider.where} ({failure.words}): is the server running and the address "
                       "right (--base-url)? Rerun once it answers") from None
        delay = min(RETRY_CAP_S, base_delay * 2 ** retry) * random.uniform(0.5, 1.0)
        if on_retry:
            on_retry(retry, failure.words, delay)
        time.sleep(delay)
