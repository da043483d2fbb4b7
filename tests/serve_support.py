"""Live servers for the serve tests (tests/serve): uvicorn on a free loopback port in a thread, every wait bounded."""
import socket
import threading
import time


class LiveServer:
    """An app served by uvicorn on 127.0.0.1 (a port the OS picks) in a daemon thread."""

    def __init__(self, app):
        import uvicorn
        self.app = app
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker(self):
        return self.app.state.worker

    def client(self, key: str = "none", **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=60, **kw)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


def start(runner, **config) -> LiveServer:
    from tinychat.serve.app import create_app
    from tinychat.serve.config import ServeConfig
    return LiveServer(create_app(runner, ServeConfig(**config)))


def runner_for(model_dir, **kw):
    """A ChatRunner on the model folder (fp32: the reference path, as `--quant none`)."""
    from tinychat.loading import load_runtime
    from tinychat.serve.runtime import ChatRunner
    return ChatRunner(load_runtime(model_dir, "none"), "none", "cpu", **kw)
