"""
Tests of the LLM provider protocol (harness/propose/providers.py) with a third provider registered only here: its own SDK
error classes are classified by the provider itself, so its 429 is retried and its 401 stops with the fix, never a
traceback; the registry drives key detection and make_proposer. The Anthropic and OpenAI providers run against the
loopback server in tests/test_agent.py and tests/test_faults.py.
"""

import types

import pytest

from harness.propose import providers
from harness.errors import SetupError, Stop
from harness.propose.proposers import make_proposer
from harness.propose.providers import Failure, Provider, Reply, call_with_retries
from llm_server import ScriptedLLM


class EchoError(Exception):
    """The third SDK's own error class: neither anthropic's nor openai's."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class Echo(Provider):
    name, key_env, default_model, api = "echo", "ECHO_API_KEY", "echo-1", "an Echo"

    def __init__(self, key, model, base_url=None):
        super().__init__(key, model, base_url)
        self.key = key

    def complete(self, system, messages):
        return Reply(messages[-1]["content"], 3, 1)

    def ping(self):
        return Reply("")

    def classify(self, e):
        if isinstance(e, ConnectionError):
            return Failure("unreachable", f"ConnectionError: {e}")
        if isinstance(e, EchoError):
            return self.status_failure(e.status, e.message)
        return super().classify(e)


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setitem(providers.PROVIDERS, "echo", Echo)
    return Echo("k", "echo-1")


def failing(*errors):
    """A call that raises each of errors in turn, then answers "done"."""
    left = list(errors)

    def call():
        if left:
            raise left.pop(0)
        return Reply("done", 10, 2)
    return call


def test_a_third_providers_429_and_5xx_are_retried_by_its_own_classification(echo):
    retries = []
    reply = call_with_retries(echo, failing(EchoError(429, "slow down"), EchoError(503, "busy")), 0.0,
                              on_retry=lambda retry, problem, delay: retries.append((retry, problem, delay)))
    assert reply.text == "done" and reply.input_tokens == 10 and reply.seconds >= 0
    assert retries == [(0, "HTTP 429: slow down", 0.0), (1, "HTTP 503: busy", 0.0)]


@pytest.mark.parametrize("status,words", [
    (401, "the echo API refused the key (HTTP 401): check ECHO_API_KEY. bad key"),
    (404, "the echo API does not know model 'echo-1' or the endpoint (HTTP 404): pass a valid --model (and "
          "--base-url). bad key"),
    (400, "the echo API rejected the request (HTTP 400): bad key")])
def test_a_third_providers_rejection_stops_at_once_with_the_fix(echo, status, words):
    with pytest.raises(Stop) as stop:
        call_with_retries(echo, failing(EchoError(status, "bad key")), 0.0)
    assert str(stop.value) == words


def test_unreachable_is_retried_in_the_loop_and_stops_at_the_start(echo):
    assert call_with_retries(echo, failing(ConnectionError("refused")), 0.0).text == "done"
    echo.base_url = "http://127.0.0.1:9/v1"
    with pytest.raises(Stop, match=r"^cannot reach http://127.0.0.1:9/v1 \(ConnectionError: refused\): is the server "
                                   r"running and the address right \(--base-url\)\? Rerun once it answers$"):
        call_with_retries(echo, failing(ConnectionError("refused")), 0.0, unreachable_stops=True)


def test_a_bad_reply_stops_naming_the_format_and_an_unclaimed_error_is_a_bug_that_propagates(echo):
    with pytest.raises(Stop, match=r"^the echo API answered, but not in an Echo format \(no choices\): check "):
        call_with_retries(echo, failing(providers.BadReply("no choices")), 0.0)
    with pytest.raises(ZeroDivisionError):
        call_with_retries(echo, failing(ZeroDivisionError("a bug")), 0.0)


def test_the_registry_decides_which_key_is_used(echo):
    assert providers.detect({"OPENAI_API_KEY": "x"}) == "openai"
    assert providers.detect({"OPENAI_API_KEY": "x", "ANTHROPIC_API_KEY": "y"}) == "anthropic"
    assert providers.detect({"ECHO_API_KEY": "z"}) == "echo"
    assert providers.detect({}, "http://127.0.0.1:8000/v1") == "openai"
    assert providers.detect({}) is None
    assert providers.words("key_env") == "ANTHROPIC_API_KEY or OPENAI_API_KEY or ECHO_API_KEY"


def test_make_proposer_builds_a_registered_provider_and_asks_it(echo, monkeypatch):
    args = types.SimpleNamespace(proposer="echo", llm="echo", model="echo-1", base_url=None, retry_base_delay=0.0)
    monkeypatch.delenv("ECHO_API_KEY", raising=False)
    with pytest.raises(SetupError, match="^--proposer echo needs ECHO_API_KEY in the environment"):
        make_proposer(args)
    monkeypatch.setenv("ECHO_API_KEY", "secret")
    proposer = make_proposer(args)
    assert proposer.is_llm and isinstance(proposer.provider, Echo) and proposer.provider.key == "secret"
    reply = proposer.ask("system", [{"role": "user", "content": "hello"}], "", 1)
    assert (reply.text, reply.spend.input_tokens, reply.spend.output_tokens) == ("hello", 3, 1)
    proposer.check()                    # the ping answers: no exception


USAGE = {"input_tokens": 1, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


@pytest.mark.parametrize("provider,body", [
    ("anthropic", {"id": "m", "type": "message", "role": "assistant", "model": "m", "content": [{"type": "text"}],
                   "usage": USAGE}),                                              # a text block without its text
    ("anthropic", {"id": "m", "type": "message", "role": "assistant", "model": "m",
                   "content": [{"type": "text", "text": "hi"}], "usage": {**USAGE, "input_tokens": "1"}}),
    ("anthropic", b"<html>a proxy's login page</html>"),
    ("openai", {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                "usage": {"prompt_tokens": "x", "completion_tokens": 1, "total_tokens": 1}}),
    ("openai", b"not json at all")])
def test_a_malformed_200_from_the_endpoint_stops_with_the_format_not_a_traceback(provider, body):
    """From the hostile review: a 200 the SDK or complete() cannot read raised TypeError or JSONDecodeError, which no
    provider claimed, so the loop ended in a traceback. It is a bad reply now: Stop naming the endpoint and the
    format."""
    with ScriptedLLM([body]) as llm:
        made = providers.PROVIDERS[provider]("k", "m", llm.anthropic_url if provider == "anthropic" else llm.openai_url)
        with pytest.raises(Stop) as stop:
            call_with_retries(made, lambda: made.complete("system", [{"role": "user", "content": "hi"}]), 0.0)
    assert str(stop.value).startswith(f"{made.base_url} answered, but not in {made.api} format (")
    assert str(stop.value).endswith("): check --base-url and the key you set")
