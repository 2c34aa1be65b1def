"""A loopback stand-in for an OpenAI-compatible chat endpoint: fixed latency, scripted JSON, a call log.

For tests and benchmarks that must exercise the real HTTP path
(``openai-compatible:NAME`` models through ``langchain_openai.ChatOpenAI``)
without a model: ``/v1/chat/completions`` waits ``latency_s`` seconds, then
answers a structured request (``response_format`` JSON schema, or a bound
tool) with JSON for its schema — ``MemoryUpdate`` gets one fact and one
insight taken from the chunk, any other schema a small valid instance — and a
plain request with a short text. Every answered call is logged (start, end,
schema, thread, and a ``tagger``'s label of the request); ``hold_at`` makes the N-th call (1-based) and every later one
wait until :meth:`OpenAIStandin.release` (then answered) or
:meth:`OpenAIStandin.abandon` (never answered, not logged), so that a test can
kill its client in the middle of a call.

>>> with OpenAIStandin(latency_s=0.0) as server:
...     server.base_url.startswith("http://127.0.0.1:")
True
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langchain_core.messages import HumanMessage

from dualmem.testing import _echo_memory, minimal_instance

Script = Callable[[str | None, dict[str, Any] | None, list[dict[str, Any]]], Any]


def default_script(name: str | None, schema: dict[str, Any] | None, messages: list[dict[str, Any]]) -> Any:
    """Return the answer to one request: JSON (a dict) for a schema, else text."""
    last = str(messages[-1].get("content") or "") if messages else ""
    if name == "MemoryUpdate":
        return _echo_memory([HumanMessage(content=last)], "MemoryUpdate")
    if schema is not None:
        return minimal_instance(schema)
    return f"(scripted reply) {last[-120:]}"


class OpenAIStandin:
    """Serve ``/v1/chat/completions`` on 127.0.0.1 with a fixed latency and scripted answers (see the module docstring)."""

    def __init__(self, latency_s: float = 0.3, script: Script = default_script, hold_at: int | None = None,
                 tagger: Callable[[dict[str, Any]], str | None] | None = None) -> None:
        self.latency_s, self.script, self.hold_at, self.tagger = latency_s, script, hold_at, tagger
        self.calls: list[dict[str, Any]] = []  # answered calls
        self.received = 0
        self._lock = threading.Lock()
        self._held = threading.Event()
        self._release = threading.Event()
        self._abandoned = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """Return the OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> OpenAIStandin:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (a held call is released first)."""
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OpenAIStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_held(self, timeout: float = 60.0) -> bool:
        """Block until the ``hold_at``-th call arrives; return whether it did."""
        return self._held.wait(timeout)

    def release(self) -> None:
        """Let a held call (and every later one) be answered."""
        self._release.set()

    def abandon(self) -> None:
        """Drop held calls (and every later one) without answering or logging them."""
        self._abandoned = True
        self._release.set()

    def answer(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Return the chat-completion payload for one request body (after the latency); None when abandoned."""
        with self._lock:
            self.received += 1
            number = self.received
        if self.hold_at is not None and number >= self.hold_at:
            self._held.set()
            self._release.wait()
            if self._abandoned:
                return None
        started = time.perf_counter()
        time.sleep(self.latency_s)
        name, schema, tool = _requested_schema(body)
        value = self.script(name, schema, body.get("messages") or [])
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if tool and isinstance(value, dict):
            message["tool_calls"] = [{"id": f"call_{number}", "type": "function",
                                      "function": {"name": tool, "arguments": json.dumps(value)}}]
        else:
            message["content"] = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        with self._lock:
            self.calls.append({"n": number, "start": started, "end": time.perf_counter(), "schema": name,
                               "thread": threading.get_ident(), "prompt": _last_text(body)[:300],
                               "tag": self.tagger(body) if self.tagger else None})
        return {"id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "standin"),
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                return

            def _send(self, code: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                self._send(200, {"object": "list", "data": [{"id": "standin", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                payload = standin.answer(body)
                if payload is None:  # abandoned: the client was killed while this call was held
                    self.close_connection = True
                    return
                try:
                    self._send(200, payload)
                except (BrokenPipeError, ConnectionResetError):  # the client went away
                    return

        return Handler


def _requested_schema(body: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """Return (schema name, JSON schema, tool name) a request asks for, or Nones for plain text."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        return spec.get("name"), spec.get("schema"), None
    tools = body.get("tools") or []
    if tools:
        fn = tools[0].get("function") or {}
        return fn.get("name"), fn.get("parameters"), fn.get("name")
    return None, None, None


def _last_text(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    content = messages[-1].get("content") if messages else ""
    return content if isinstance(content, str) else json.dumps(content)
