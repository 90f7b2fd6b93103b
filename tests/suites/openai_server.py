"""A tiny OpenAI-compatible HTTP server on 127.0.0.1 for tests: real sockets, scripted answers."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator


@contextmanager
def openai_server(answer: Callable[[str], str]) -> Iterator[tuple[str, list[dict]]]:
    """Serve /v1/completions and /v1/chat/completions; yields (base_url, requests seen)."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body})
            if self.path.endswith("/chat/completions"):
                text = answer(body["messages"][-1]["content"])
                choices = [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": text}}]
            else:
                prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
                choices = [{"index": i, "text": answer(p), "finish_reason": "stop"}
                           for i, p in enumerate(prompts)]
            data = json.dumps({"id": "x", "object": "text_completion", "model": body.get("model"),
                               "choices": choices,
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                         "total_tokens": 2}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()
