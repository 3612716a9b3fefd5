"""Running the hub: uvicorn serving the app.

In the foreground (``tether hub serve``) or on a background thread (tests, embedding in ``tether up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator

import uvicorn

from tether.hub.app import create_app
from tether.hub.config import HubConfig
from tether.hub.db.engine import Database
from tether.hub.db.migrate import ensure_current
from tether.hub.secrets_file import gitlab_secret
from tether.tool.secrets import load_base64_secret

log = logging.getLogger(__name__)


class HubStartError(RuntimeError):
    """The hub could not start; the message says why."""


async def prepare_database(config: HubConfig) -> None:
    """Migrate (``auto_migrate``) or check the schema before serving, so problems surface as a clear error.

    Raises:
        tether.hub.db.migrate.SchemaNotCurrent, sqlalchemy.exc.SQLAlchemyError, OSError.
    """
    if config.database.url is None:
        config.data_dir.expanduser().mkdir(parents=True, exist_ok=True)
    db = Database(config.database_url)
    try:
        await ensure_current(db.engine, config.database.auto_migrate)
    finally:
        await db.close()


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling.

    uvicorn re-raises SIGTERM after shutting down, so a clean stop would exit with status -15;
    :meth:`HubServer.serve` installs handlers that just ask the server to finish.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Leave signals alone."""
        yield


class HubServer:
    """One hub HTTP server.

    Args:
        config: the configuration; ``listen`` is where it binds.
    """

    def __init__(self, config: HubConfig) -> None:
        self.config = config
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _uvicorn(self) -> uvicorn.Server:
        if self.config.kas.api_address is not None:  # fail here, with the file's name, not in the app's lifespan
            load_base64_secret(self.config.kas_secret_file)
        app = create_app(self.config, gitlab_secret(self.config))
        host, port = self.config.listen_host_port()
        proxies = list(self.config.security.trusted_proxies)
        settings = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="on",
            server_header=False,
            # uvicorn believes X-Forwarded-For from 127.0.0.1 by default: only configured proxies (issue 27).
            proxy_headers=bool(proxies),
            forwarded_allow_ips=proxies or [],
        )
        return _Uvicorn(settings)

    async def serve(self) -> None:
        """Serve until stopped (SIGINT/SIGTERM in the main thread, or :meth:`stop`).

        Raises:
            HubStartError: the listener or the app's start-up failed.
            tether.tool.secrets.SecretError, tether.hub.db.migrate.SchemaNotCurrent: configuration problems.
        """
        await prepare_database(self.config)
        self._server = server = self._uvicorn()
        loop = asyncio.get_running_loop()
        in_main_thread = threading.current_thread() is threading.main_thread()
        if in_main_thread:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        try:
            await server.serve()
        except SystemExit as exc:  # uvicorn exits the process when it cannot bind
            raise HubStartError(f"the hub could not start on {self.config.listen} (see the log above)") from exc
        finally:
            if in_main_thread:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        if not server.started:
            raise HubStartError(f"the hub could not start on {self.config.listen} (see the log above)")

    @property
    def started(self) -> bool:
        """True once the listener accepts connections."""
        return self._server is not None and self._server.started

    def start_in_thread(self, timeout_s: float = 30.0) -> None:
        """Serve on a daemon thread with its own event loop; return once it accepts connections.

        Raises:
            HubStartError: it did not start within ``timeout_s`` seconds, or failed (the cause is chained).
        """

        def run() -> None:
            try:
                asyncio.run(self.serve())
            except BaseException as exc:  # reported to the starting thread
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"hub-{self.config.listen}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.started:
            if self._error is not None or not self._thread.is_alive():
                raise HubStartError(
                    f"the hub on {self.config.listen} failed to start: {self._error!r}"
                ) from self._error
            if time.monotonic() > deadline:
                self.stop()
                raise HubStartError(f"the hub on {self.config.listen} did not start within {timeout_s}s")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the server to finish its requests and stop; wait for the thread if it runs on one."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.join(timeout_s)
