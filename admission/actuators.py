"""Actuators: what carries out an autoscaling decision for one pool of task servers.

Exceptions::

    ActuatorError        scaling could not be carried out; the message says why
                         (kubernetes ApiException / urllib3 errors, aiohttp errors,
                         a task server that never announced itself, ...)

Bad arguments (a negative replica count, an unknown workload kind) raise ValueError.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    import kubernetes.client

log = logging.getLogger(__name__)


class ActuatorError(Exception):
    """Scaling could not be carried out; the message says why."""


class Actuator(ABC):
    """Changes the number of task servers of one pool."""

    name: str
    """A label for logs and metrics."""
    self_retiring: bool = False
    """Whether its servers can leave by themselves (an idle server exiting); where they
    cannot (a StatefulSet restarts the pod), Swayam's scale-in goes through scale_to."""

    @abstractmethod
    async def replicas(self) -> int:
        """The current replica count."""

    @abstractmethod
    async def scale_to(self, replicas: int) -> int:
        """Ask for `replicas` task servers; returns the count now in effect."""

    @abstractmethod
    async def close(self) -> None:
        """Release resources."""


def _check_replicas(replicas: int) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be an integer >= 0, got {replicas!r}")


# --------------------------------------------------------------------------- local


@dataclass
class _LocalServer:
    """A task-server process this actuator started."""

    n: int
    server_id: str
    address: str
    proc: asyncio.subprocess.Process
    drain: asyncio.Task[None]


class LocalActuator(Actuator):
    """Starts and stops local task-server processes and (de)registers them with the gateway."""

    self_retiring = True
    """Its servers may exit by themselves (--idle-exit-s: Swayam's passive scale-in); it
    notices and deregisters them."""

    def __init__(
        self,
        *,
        gateway_url: str,
        spawn: Callable[[str, int | None], Sequence[str]],
        pool: str = "default",
        id_prefix: str = "auto",
        slots: int = 1,
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 10.0,
        http_timeout_s: float = 10.0,
        token: str | None = None,
        metrics_port_base: int | None = None,
    ) -> None:
        """`spawn(server_id, metrics_port)` is the command line of one task server (the
        gateway passes ``taskserver.spawn.taskserver_argv`` with its options: this package
        imports nothing of ours)."""
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots!r}")
        if start_timeout_s <= 0 or stop_timeout_s <= 0 or http_timeout_s <= 0:
            raise ValueError(
                "timeouts must be > 0, got "
                f"start_timeout_s={start_timeout_s!r} stop_timeout_s={stop_timeout_s!r} "
                f"http_timeout_s={http_timeout_s!r}"
            )
        self.name = f"local:{pool}"
        self.gateway_url = gateway_url.rstrip("/")
        self.spawn = spawn
        self.pool = pool
        self.id_prefix = id_prefix
        self.slots = slots
        # server n serves /metrics on metrics_port_base + n - 1 (None: no metrics port)
        self.metrics_port_base = metrics_port_base
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.http_timeout_s = http_timeout_s
        # The gateway's registration token, sent as a Bearer credential (None: none).
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._servers: list[_LocalServer] = []  # oldest first (by n)
        self._next_n = 1
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def pids(self) -> dict[str, int]:
        """Server id -> PID of every process this actuator runs, oldest first."""
        return {s.server_id: s.proc.pid for s in self._servers}

    async def replicas(self) -> int:
        """Task-server processes started here that are still running; one that exited on
        its own (an idle server retiring, Swayam's passive scale-in) is deregistered and
        forgotten first, so the gateway does not keep it as a server that is down."""
        async with self._lock:
            if not self._closed:
                await self._reap()
        return sum(1 for s in self._servers if s.proc.returncode is None)

    async def scale_to(self, replicas: int) -> int:
        """Start or stop processes until `replicas` run; returns the count now running."""
        _check_replicas(replicas)
        async with self._lock:
            if self._closed:
                raise ActuatorError(f"{self.name}: actuator is closed")
            await self._reap()
            current = len(self._servers)
            if replicas > current:
                await self._scale_up(replicas - current)
            elif replicas < current:
                await self._scale_down(current - replicas)
            return len(self._servers)

    async def close(self) -> None:
        """Deregister and stop every process this actuator started."""
        async with self._lock:
            self._closed = True
            servers = list(self._servers)
            # Best effort: the gateway may already be gone at shutdown.
            await asyncio.gather(
                *(self._deregister(s.server_id) for s in servers), return_exceptions=True
            )
            await asyncio.gather(*(self._stop(s) for s in servers))
            if self._session is not None:
                await self._session.close()
                self._session = None

    # -- scaling

    async def _scale_up(self, count: int) -> None:
        numbers = list(range(self._next_n, self._next_n + count))
        self._next_n += count
        # Each start adds its server to self._servers itself, so one that succeeds
        # while a sibling fails (or the call is cancelled) is still stopped by close().
        results = await asyncio.gather(*(self._start(n) for n in numbers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise ActuatorError(
                f"{self.name}: started {count - len(errors)} of {count} task servers: {errors[0]}"
            ) from errors[0]

    async def _scale_down(self, count: int) -> None:
        victims = sorted(self._servers, key=lambda s: s.n, reverse=True)[:count]
        # Deregister first so the gateway routes no new task to a server about to stop.
        results = await asyncio.gather(
            *(self._deregister(s.server_id) for s in victims), return_exceptions=True
        )
        gone = [s for s, r in zip(victims, results, strict=True) if r is None]
        await asyncio.gather(*(self._stop(s) for s in gone))
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # The servers still registered keep running: stopping them would fail
            # the tasks the gateway still sends them.
            raise ActuatorError(
                f"{self.name}: stopped {len(gone)} of {count} task servers: {errors[0]}"
            ) from errors[0]

    async def _reap(self) -> None:
        """Forget processes that exited on their own (crash, idle self-decommission)."""
        dead = [s for s in self._servers if s.proc.returncode is not None]
        for s in dead:
            # Status 0: it retired itself (idle); anything else: it failed.
            log.log(
                logging.INFO if s.proc.returncode == 0 else logging.WARNING,
                "%s: task server %s exited on its own (status %s)",
                self.name,
                s.server_id,
                s.proc.returncode,
            )
            # A dead server left registered would stay "down" in the pool.
            with contextlib.suppress(ActuatorError):
                await self._deregister(s.server_id)
            await self._stop(s)

    # -- one process

    async def _start(self, n: int) -> None:
        server_id = f"{self.id_prefix}-{n}"
        metrics = None if self.metrics_port_base is None else self.metrics_port_base + n - 1
        argv = list(self.spawn(server_id, metrics))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        except OSError as exc:
            raise ActuatorError(f"{server_id}: cannot start a task server: {exc}") from exc
        registered = False
        try:
            address = await self._read_announcement(server_id, proc, deadline)
            await self._register(server_id, address)
            registered = True
            await self._wait_up(server_id, deadline)
        except BaseException:
            # Never leave an orphan: whatever went wrong (or cancelled us), the
            # process goes, and so does its registration.
            if registered:
                with contextlib.suppress(ActuatorError):
                    await asyncio.shield(self._deregister(server_id))
            await asyncio.shield(self._kill(proc))
            raise
        assert proc.stdout is not None
        drain = asyncio.create_task(_drain(proc.stdout), name=f"drain-{server_id}")
        self._servers.append(_LocalServer(n, server_id, address, proc, drain))
        self._servers.sort(key=lambda s: s.n)
        log.info(
            "%s: started task server %s at %s (pid %d)", self.name, server_id, address, proc.pid
        )

    async def _read_announcement(
        self, server_id: str, proc: asyncio.subprocess.Process, deadline: float
    ) -> str:
        assert proc.stdout is not None
        timeout_s = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
        except TimeoutError:
            raise ActuatorError(
                f"{server_id}: task server did not announce itself within {self.start_timeout_s} s"
            ) from None
        if not line:
            status = await proc.wait()
            raise ActuatorError(
                f"{server_id}: task server exited with status {status} before listening"
            )
        try:
            info = json.loads(line)
            address = str(info["address"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ActuatorError(f"{server_id}: unexpected announcement {line!r}") from exc
        if info.get("server_id") != server_id:
            raise ActuatorError(
                f"{server_id}: task server announced id {info.get('server_id')!r} instead"
            )
        return address

    async def _stop(self, server: _LocalServer) -> None:
        await self._kill(server.proc, graceful=True)
        # stdout hits EOF once the process is gone; the drain task then ends on its own.
        try:
            await asyncio.wait_for(server.drain, self.stop_timeout_s)
        except TimeoutError:
            log.warning("%s: stdout of %s still open after exit", self.name, server.server_id)
        with contextlib.suppress(ValueError):
            self._servers.remove(server)
        log.info("%s: stopped task server %s", self.name, server.server_id)

    async def _kill(self, proc: asyncio.subprocess.Process, *, graceful: bool = False) -> None:
        """SIGTERM (if graceful) then SIGKILL after stop_timeout_s; always reaps."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
            except TimeoutError:
                log.warning("%s: pid %d ignored SIGTERM; killing it", self.name, proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if not graceful and proc.stdout is not None:
            # Read to EOF so the pipe transport closes without a ResourceWarning.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.stdout.read(), self.stop_timeout_s)

    # -- gateway API

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.http_timeout_s), headers=self._auth
            )
        return self._session

    async def _gateway(
        self, what: str, method: str, path: str, ok: Callable[[int], bool], body: Any = None
    ) -> Any:
        url = self.gateway_url + path
        try:
            async with self._http().request(method, url, json=body) as resp:
                text = await resp.text()
                if not ok(resp.status):
                    raise ActuatorError(f"{what}: gateway answered HTTP {resp.status}: {text}")
                return json.loads(text) if text else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ActuatorError(f"{what}: {method} {url} failed: {exc!r}") from exc

    async def _register(self, server_id: str, address: str) -> None:
        body = {"id": server_id, "address": address, "pool": self.pool, "slots": self.slots}
        await self._gateway(
            f"{server_id}: registration", "POST", "/v1/servers", lambda s: s in (200, 201), body
        )

    async def _deregister(self, server_id: str) -> None:
        # 404: not registered (any more), which is what we want.
        await self._gateway(
            f"{server_id}: deregistration",
            "DELETE",
            # The gateway stops routing to it at once and lets its tasks finish first.
            f"/v1/servers/{server_id}?drain_s={self.stop_timeout_s:g}",
            lambda s: s < 300 or s == 404,
        )

    async def _wait_up(self, server_id: str, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        state = None
        while True:
            listing = await self._gateway(
                f"{server_id}: listing", "GET", "/v1/servers", lambda s: s == 200
            )
            servers = listing.get("servers", []) if isinstance(listing, dict) else []
            view = next((s for s in servers if s.get("id") == server_id), None)
            state = view and view.get("state")
            if state == "up":
                return
            if loop.time() >= deadline:
                raise ActuatorError(
                    f"{server_id}: not up at the gateway within {self.start_timeout_s} s "
                    f"(state {state!r})"
                )
            await asyncio.sleep(0.05)


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read a child's stdout to EOF so it can never block on a full pipe."""
    while await stream.read(65536):
        pass


# ---------------------------------------------------------------------- kubernetes

_KINDS = {"Deployment": "deployment", "StatefulSet": "stateful_set"}


class KubernetesActuator(Actuator):
    """Patches the replica count of a Deployment or StatefulSet via the official k8s client."""

    def __init__(
        self,
        *,
        name: str,
        namespace: str = "default",
        kind: str = "Deployment",
        api_client: kubernetes.client.ApiClient | None = None,
        in_cluster: bool | None = None,
        kubeconfig: str | None = None,
        request_timeout_s: float = 30.0,
    ) -> None:
        if kind not in _KINDS:
            raise ValueError(f"kind must be 'Deployment' or 'StatefulSet', got {kind!r}")
        if not name:
            raise ValueError(f"name must be a workload name, got {name!r}")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s!r}")
        # Imported here: kubernetes is an optional dependency (the k8s extra).
        import kubernetes.client
        import kubernetes.config

        self.name = name
        self.namespace = namespace
        self.kind = kind
        self.request_timeout_s = request_timeout_s
        self._owns_client = api_client is None
        if api_client is None:
            if in_cluster is None:
                in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ
            try:
                if in_cluster:
                    cfg = kubernetes.client.Configuration()
                    kubernetes.config.load_incluster_config(client_configuration=cfg)
                    api_client = kubernetes.client.ApiClient(cfg)
                else:
                    api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
            except kubernetes.config.ConfigException as exc:
                where = "in-cluster" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
                raise ActuatorError(f"cannot load the Kubernetes {where} config: {exc}") from exc
        self._api_client = api_client
        apps = kubernetes.client.AppsV1Api(api_client)
        self._read = getattr(apps, f"read_namespaced_{_KINDS[kind]}_scale")
        self._patch = getattr(apps, f"patch_namespaced_{_KINDS[kind]}_scale")

    async def replicas(self) -> int:
        """The desired replica count (spec.replicas of the scale subresource)."""
        # spec, not status: the count the controller is converging to, as the HPA uses.
        scale = await self._call("read", self._read, self.name, self.namespace)
        return int(scale.spec.replicas or 0)

    async def scale_to(self, replicas: int) -> int:
        """Patch spec.replicas of the scale subresource; returns the value now in effect."""
        _check_replicas(replicas)
        body = {"spec": {"replicas": replicas}}
        scale = await self._call("patch", self._patch, self.name, self.namespace, body)
        # The API server omits replicas when it is 0 (omitempty).
        return int(scale.spec.replicas or 0)

    async def close(self) -> None:
        """Close the API client if this actuator built it (a passed-in one is the caller's)."""
        if self._owns_client:
            await asyncio.to_thread(self._api_client.close)

    async def _call(self, verb: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking client call in a thread; translate its errors."""
        import urllib3.exceptions
        from kubernetes.client.exceptions import ApiException

        what = f"{verb} {self.kind} {self.namespace}/{self.name} scale"
        try:
            return await asyncio.to_thread(fn, *args, _request_timeout=self.request_timeout_s)
        except ApiException as exc:
            raise ActuatorError(
                f"{what}: HTTP {exc.status} {exc.reason}: {_status_message(exc.body)}"
            ) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise ActuatorError(f"{what}: cannot reach the Kubernetes API server: {exc}") from exc


def _status_message(body: Any) -> str:
    """The message of a Kubernetes Status object, else the raw body."""
    if not body:
        return "(no body)"
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return str(body)[:500]
