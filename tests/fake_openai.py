"""A real local OpenAI-compatible HTTP server for tests: scripted replies, recorded requests.

    with FakeOpenAI() as srv:
        srv.push_proposal({...})              # a 200 chat completion whose content is this JSON
        srv.push(status=429, body={...})       # any status / body / delay
        settings = LLMSettings(model="fake", base_url=srv.base_url, api_key="sk-test")

Each POST to /v1/chat/completions takes the next scripted reply from the queue (an empty queue
answers 500 "no scripted reply", so a test that calls too often fails visibly). Every request is
recorded: path, headers, JSON body. Only the LLM is faked; everything else in the tests is real.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Scripted:
    status: int = 200
    body: Any = None                  # dict/list -> JSON; str -> sent as is
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    reject_schema: bool = False       # answer 400 to a request with response_format json_schema, else serve
    drip_s: float = 0.0               # send the body one byte at a time, this many seconds apart
    drip_headers: bool = False        # with drip_s: the status line and headers one byte at a time instead


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.monotonic)   # when the request came (monotonic seconds)


def completion(content: str, prompt_tokens: int = 100, completion_tokens: int = 50, model: str = "fake",
               finish_reason: str = "stop", usage: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "finish_reason": finish_reason,
                     "message": {"role": "assistant", "content": content}}]}
    if usage:
        out["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens}
    return out


def error_body(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": None, "param": None}}


class FakeOpenAI:
    def __init__(self) -> None:
        self.queue: deque[Scripted] = deque()
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    # --- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    # --- scripting ------------------------------------------------------------------------
    def push(self, status: int = 200, body: Any = None, delay_s: float = 0.0, **kw: Any) -> None:
        with self._lock:
            self.queue.append(Scripted(status, body, delay_s, **kw))

    def push_text(self, content: str, delay_s: float = 0.0, reject_schema: bool = False, **kw: Any) -> None:
        self.push(200, completion(content, **kw), delay_s, reject_schema=reject_schema)

    def push_proposal(self, proposal: dict[str, Any], **kw: Any) -> None:
        self.push_text(json.dumps(proposal), **kw)

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # --- serving --------------------------------------------------------------------------
    def _next(self, body: Any) -> Scripted:
        with self._lock:
            if not self.queue:
                return Scripted(500, error_body("fake server: no scripted reply left", "server_error"))
            head = self.queue[0]
            if head.reject_schema and isinstance(body, dict) and \
                    (body.get("response_format") or {}).get("type") == "json_schema":
                # stays queued: the retry without the schema gets the real reply
                return Scripted(400, error_body("response_format json_schema is not supported"))
            return self.queue.popleft()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:   # keep test output clean
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                with fake._lock:
                    fake.requests.append(Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                s = fake._next(body)
                if s.delay_s:
                    time.sleep(s.delay_s)
                data = s.body if isinstance(s.body, (str, bytes)) else json.dumps(s.body)
                data = data.encode() if isinstance(data, str) else data
                try:
                    if s.drip_headers:   # the reply's head one byte at a time (each read within any read timeout)
                        head = (f"HTTP/1.1 {s.status} OK\r\nContent-Type: application/json\r\n"
                                f"Content-Length: {len(data)}\r\n"
                                + "".join(f"{k}: {v}\r\n" for k, v in s.headers.items()) + "\r\n").encode()
                        for i in range(len(head)):
                            self.wfile.write(head[i:i + 1])
                            self.wfile.flush()
                            time.sleep(s.drip_s)
                        self.wfile.write(data)
                        self.close_connection = True
                        return
                    self.send_response(s.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in s.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    if not s.drip_s:
                        self.wfile.write(data)
                    for i in range(len(data)) if s.drip_s else ():
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(s.drip_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass    # the client gave up (a timeout test)

        return Handler
