"""
Test helper for agent.py: a loopback HTTP server on 127.0.0.1 that speaks the Anthropic Messages API
(POST /v1/messages) and the OpenAI Chat Completions API (POST /v1/chat/completions) well enough for the real
SDKs, pointed at it through base_url, to parse its answers.

    with ScriptedLLM(["DESCRIPTION: ...", 429, "DESCRIPTION: ..."]) as llm:
        agent.main([..., "--base-url", llm.anthropic_url])     # or llm.openai_url
        llm.requests                                         # every request body, in order

Each request takes the next script item: a string is answered as the assistant's text; an int is answered as
that HTTP error status in the provider's error format; a callable is called with the request's messages (a list of
{"role", "content"}, the system prompt aside) and its result answered as above (a scripted LLM that reads its
prompt); a dict or bytes is sent as the 200's body as it is. When the script runs out, the server answers 400.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

INPUT_TOKENS, OUTPUT_TOKENS = 1000, 100      # usage reported for every answer


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up before the answer is written (the SDK gave up, agent.py stopped) is not an error of the
    server's: no traceback on stderr, where the tests read agent.py's own messages."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ScriptedLLM:
    """Scripted answers over real HTTP. `delay` seconds are slept before each answer (simulated latency)."""

    def __init__(self, script, delay=0.0, ping=None):
        self.script = list(script)
        self.delay = delay
        self.ping = ping                     # None: answer agent.py's 1-token check with "OK"; else a script item
        self.pings = []                      # the checks, apart from the scripted requests
        self.requests = []                   # (path, parsed JSON body, headers)
        self.times = []                      # time.time() when each scripted request arrived
        self.lock = threading.Lock()
        self.server = QuietServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def anthropic_url(self):
        """base_url for anthropic.Anthropic."""
        return f"http://127.0.0.1:{self.server.server_port}"

    @property
    def openai_url(self):
        """base_url for openai.OpenAI."""
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def _next(self, path, body, headers):
        with self.lock:
            if body.get("max_tokens") == 1 or body.get("max_completion_tokens") == 1:   # Proposer.check
                self.pings.append((path, body, headers))
                return self.ping if self.ping is not None else "OK"
            self.requests.append((path, body, headers))
            self.times.append(time.time())
            return self.script.pop(0) if self.script else None

    def _handler(self):
        llm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):    # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                anthropic = self.path.startswith("/v1/messages")
                item = llm._next(self.path, body, dict(self.headers))
                if callable(item):
                    item = item([m for m in body["messages"] if m["role"] != "system"])
                time.sleep(llm.delay)
                if item is None:
                    self._send(400, error_body(anthropic, 400, "script exhausted"))
                elif isinstance(item, int):
                    self._send(item, error_body(anthropic, item, f"scripted status {item}"))
                elif isinstance(item, (dict, bytes)):   # a 200 with exactly this body (a server of another kind)
                    self._send(200, item)
                elif anthropic:
                    self._send(200, {
                        "id": "msg_test", "type": "message", "role": "assistant", "model": body["model"],
                        "content": [{"type": "text", "text": item}], "stop_reason": "end_turn",
                        "stop_sequence": None,
                        "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
                                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
                else:
                    self._send(200, {
                        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": item}}],
                        "usage": {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                                  "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}})

            def _send(self, status, payload):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def error_body(anthropic, status, message):
    """An error payload shaped like each provider's."""
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}
