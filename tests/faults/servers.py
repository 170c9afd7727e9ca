"""Private Redis, RabbitMQ and MariaDB servers for the fault tests, each on ports of its own.

The fault tests stop, kill and restart the servers Ladder depends on. They must never touch the
machine's own servers (the ones `make up` and the rest of the suite use), so each set of tests
runs its own: every process is started here, in a session of its own, with its data under one
temporary directory, and :meth:`PrivateServers.remove` kills every process of those sessions and
deletes the directory, whatever state the test left them in.

- **Redis**: ``redis-server`` in the foreground, no persistence (``--save "" --appendonly no``):
  the cache is a projection of MySQL, so a restart starts it empty, as in production.
- **RabbitMQ**: a node of its own (``ladder-fault-<hex>@localhost``) started with the package's
  own ``rabbitmq-server`` script in the foreground, with its own AMQP port, distribution port,
  Erlang port mapper (``epmd`` on a port of its own, so the machine's epmd is never used, let
  alone left started), config file, env file, enabled-plugins file (no plugins), mnesia and log
  directories, and ``HOME`` (so the Erlang cookie it creates is its own). Stopped with
  ``rabbitmqctl -n <node> stop``; started again on the same ports and the same mnesia directory,
  so durable quorum queues and their messages survive, as they would on a real restart.
- **MariaDB**: a data directory of its own made by ``mariadb-install-db``, ``mariadbd
  --no-defaults --user=mysql`` (as root; as anyone else, as that user) on its own port and unix
  socket; on the first start the test user, ``root@127.0.0.1`` with an empty password (what
  Ladder's URLs use), is created over the socket, where the OS user running the tests is
  MariaDB's root by ``unix_socket`` authentication. Grants stay on: no
  ``--skip-grant-tables``.

Ports come from :func:`tests.stack.free_port`, which sees a port free only when it looks. A first
start whose server finds one of its ports taken since (it exits saying so) is tried again on
new ports; later starts keep theirs, which the tests' clients already hold
(``tests/faults/test_servers.py``).

Paths are kept short on purpose (``/tmp/lf-<hex>``): unix socket paths are limited to about 100
characters, and ``mariadbd`` runs as ``mysql``, which must be able to reach its directories
(pytest's ``tmp_path`` lives in a directory only root can enter).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import getpass
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import redis

from tests.stack import free_port, run, wait_for

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
HOST = "127.0.0.1"
# Short on purpose: a unix socket path must stay under about 100 characters.
BASE = Path("/tmp")
PREFIX = "lf-"
# MariaDB refuses to run as root: as root it is started as mysql (--user=mysql), otherwise it
# simply runs as whoever runs the tests.
MYSQL_OS_USER = "mysql" if os.geteuid() == 0 else getpass.getuser()

# What each server writes to its log when a port it was given is taken: Redis and MariaDB the
# system's message, RabbitMQ (Erlang) the error's atom.
PORT_TAKEN_SIGNS = ("Address already in use", "eaddrinuse")
PORT_ATTEMPTS = 4


class PortTaken(RuntimeError):
    """A server exited while starting because one of its ports was taken."""


# Every server of this process, so that an interpreter ending without its fixtures' teardown
# (an interrupted run) still leaves nothing running.
_LIVE: set[PrivateServer] = set()


def _session_pids(sid: int) -> list[int]:
    """Every live process of session ``sid`` (the servers are started with ``setsid``, so this
    is the server and every child it started, whatever process group they moved to)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        # A zombie is dead already; whoever its parent is now reaps it.
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


class PrivateServer:
    """One server process in a session of its own, with start, stop, restart and kill."""

    name = "server"
    start_timeout = 60.0
    stop_timeout = 60.0

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.choose_ports()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.timings: list[tuple[str, float]] = []

    # -- what each server defines -----------------------------------------------------------
    def choose_ports(self) -> None:
        """Pick the server's ports. Called again, before a new attempt, when the first start
        finds one taken: :func:`free_port` only saw it free, and anyone may bind it since."""
        self.port = free_port()

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def ready(self) -> bool:
        raise NotImplementedError

    def prepare(self) -> None:
        """Before the first start (a data directory)."""

    def after_first_start(self) -> None:
        """Once, after the first start (accounts)."""

    def request_stop(self) -> None:
        """Ask the server to shut down gracefully."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGTERM)

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log_path(self) -> Path:
        """Where the process's output goes."""
        return self.root / f"{self.name}.out"

    @property
    def error_log_path(self) -> Path:
        """Where the server writes why it could not start."""
        return self.log_path

    def log_tail(self, chars: int = 3000) -> str:
        path = self.log_path
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def start(self) -> None:
        """Start the server and wait until it answers. A first start that finds a port taken
        tries again on new ports (a few times); a later start keeps its ports, which the tests'
        clients already hold, and fails."""
        if self.running:
            return
        started = time.monotonic()
        if self.starts == 0:
            self.prepare()
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._launch()
                break
            except PortTaken:
                if self.starts > 0 or attempt == PORT_ATTEMPTS - 1:
                    raise
                self._reap()
                self.choose_ports()
                self.ports_chosen()
        if self.starts == 0:
            self.after_first_start()
        self.starts += 1
        self.timings.append(("start", time.monotonic() - started))

    def ports_chosen(self) -> None:
        """After :meth:`choose_ports` picked new ports for another attempt: rewrite whatever
        :meth:`prepare` wrote that names them."""

    def _launch(self) -> None:
        """One attempt: start the process and wait until it answers."""
        _LIVE.add(self)
        errors = self.error_log_path
        errors_from = errors.stat().st_size if errors.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=self.environment(),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # For sweep_stale(), should this interpreter die without its teardown.
        (self.root / "session").write_text(str(self.process.pid))

        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                message = (
                    f"{self.name} exited with {self.process.returncode} while starting:\n"
                    f"{self.log_tail()}"
                )
                this_attempt = ""
                if errors.exists():
                    with errors.open("rb") as log:
                        log.seek(errors_from)
                        this_attempt = log.read().decode(errors="replace")
                if any(sign in this_attempt for sign in PORT_TAKEN_SIGNS):
                    raise PortTaken(message)
                raise RuntimeError(message)
            return self.ready()

        try:
            wait_for(f"{self.name} did not answer", up, self.start_timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log_tail()}") from None

    def stop(self) -> None:
        """A graceful stop; the data stays for the next :meth:`start`."""
        if not self.running:
            return
        started = time.monotonic()
        self.request_stop()
        assert self.process is not None
        try:
            self.process.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"{self.name} did not stop in {self.stop_timeout} s") from None
        self._reap()
        self.timings.append(("stop", time.monotonic() - started))

    def kill(self) -> None:
        """SIGKILL to every process of the server's session: a crash, not a shutdown."""
        if self.process is None:
            return
        self._reap(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _reap(self, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to whatever of the session is left, and wait for it to go."""
        if self.process is None:
            return
        sid = self.process.pid
        end = time.monotonic() + 10
        while pids := _session_pids(sid):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
            if self.process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(0.1)
            else:
                time.sleep(0.05)
            if time.monotonic() > end:
                raise RuntimeError(f"{self.name}: processes {pids} would not go")

    def remove(self) -> None:
        """Kill everything the server started and delete its directory."""
        try:
            self.kill()
        finally:
            _LIVE.discard(self)
            shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis(PrivateServer):
    name = "redis"
    start_timeout = 20.0

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.root),
            "--daemonize",
            "no",
        ]

    def ready(self) -> bool:
        try:
            with redis.Redis(host=HOST, port=self.port, socket_timeout=1) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False


class PrivateRabbitMQ(PrivateServer):
    name = "rabbitmq"
    start_timeout = 90.0

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.node = f"ladder-fault-{uuid.uuid4().hex[:8]}@localhost"
        self.epmd_port = free_port()
        self.epmd: subprocess.Popen[bytes] | None = None

    def choose_ports(self) -> None:
        # epmd has its own start and check (_start_epmd); these two are the node's.
        self.port = free_port()
        self.dist_port = free_port()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/"

    def environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RABBITMQ_", "ERL_")) and k != "NODENAME"
        }
        r = self.root
        env.update(
            HOME=str(r / "home"),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS=HOST,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(r / "mnesia"),
            RABBITMQ_LOG_BASE=str(r / "log"),
            RABBITMQ_CONFIG_FILE=str(r / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(r / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(r / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(r / "enabled_plugins"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS=HOST,
        )
        return env

    def prepare(self) -> None:
        r = self.root
        for sub in ("home", "mnesia", "log"):
            (r / sub).mkdir(exist_ok=True)
        # The machine's /etc/rabbitmq/* name another node and listen on 5672: none of it here.
        (r / "rabbitmq-env.conf").write_text("")
        (r / "enabled_plugins").write_text("[].\n")
        self.ports_chosen()

    def ports_chosen(self) -> None:
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = {HOST}:{self.port}\n"
            "loopback_users.guest = true\n"
            "disk_free_limit.absolute = 10MB\n"
        )

    def command(self) -> list[str]:
        return [str(RABBITMQ_BIN / "rabbitmq-server")]

    def start(self) -> None:
        self._start_epmd()
        super().start()

    def _start_epmd(self) -> None:
        if self.epmd is not None and self.epmd.poll() is None:
            return
        self.epmd = subprocess.Popen(
            ["epmd", "-port", str(self.epmd_port), "-address", HOST],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        (self.root / "epmd.session").write_text(str(self.epmd.pid))

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex((HOST, self.epmd_port)) == 0

        wait_for("epmd did not listen", listening, 10)

    def ready(self) -> bool:
        """AMQP answers: the protocol header gets a method frame (type 1) back. The listener
        opens late in the boot, after the queues are recovered."""
        try:
            with socket.create_connection((HOST, self.port), timeout=1) as s:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                return s.recv(1) == b"\x01"
        except OSError:
            return False

    def ctl(self, *args: str, timeout: float = 60) -> str:
        done = run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, *args],
            env=self.environment(),
            cwd=self.root,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stdout}\n{done.stderr}")
        return done.stdout

    def request_stop(self) -> None:
        try:
            self.ctl("stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            # The node does not answer its CLI: the script's own graceful path (SIGTERM).
            super().request_stop()

    def remove(self) -> None:
        try:
            super().remove()
        finally:
            if self.epmd is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.epmd.kill()
                self.epmd.wait(10)


class PrivateMariaDB(PrivateServer):
    name = "mariadb"
    start_timeout = 60.0
    stop_timeout = 90.0

    @property
    def server_url(self) -> str:
        """The server, no database: root with an empty password over TCP, as Ladder connects."""
        return f"mysql+asyncmy://root@{HOST}:{self.port}"

    def url(self, database: str) -> str:
        return f"{self.server_url}/{database}"

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def rundir(self) -> Path:
        return self.root / "run"

    @property
    def socket_path(self) -> Path:
        return self.rundir / "mysqld.sock"

    def prepare(self) -> None:
        owner = pwd.getpwnam(MYSQL_OS_USER)
        self.rundir.mkdir(exist_ok=True)
        os.chown(self.rundir, owner.pw_uid, owner.pw_gid)
        done = run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--user={MYSQL_OS_USER}",
                f"--datadir={self.datadir}",
                "--skip-test-db",
                # root@localhost, and an account of the OS user running the tests, both by
                # unix_socket: whoever runs this is MariaDB's root over the socket.
                "--auth-root-authentication-method=socket",
                f"--auth-root-socket-user={getpass.getuser()}",
            ],
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed:\n{done.stdout}\n{done.stderr}")

    def command(self) -> list[str]:
        return [
            "mariadbd",
            "--no-defaults",
            f"--user={MYSQL_OS_USER}",
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            f"--bind-address={HOST}",
            f"--socket={self.socket_path}",
            f"--pid-file={self.rundir / 'mysqld.pid'}",
            f"--log-error={self.rundir / 'error.log'}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M",
            "--max-connections=500",
        ]

    @property
    def error_log_path(self) -> Path:
        return self.rundir / "error.log"

    def log_tail(self, chars: int = 3000) -> str:
        path = self.error_log_path
        return path.read_text(errors="replace")[-chars:] if path.exists() else super().log_tail()

    def client(
        self, program: str, *args: str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """A MariaDB client program over the unix socket, as the OS user running the tests
        (MariaDB's root, by unix_socket authentication)."""
        return run(
            [
                program,
                "--no-defaults",
                f"--socket={self.socket_path}",
                f"-u{getpass.getuser()}",
                *args,
            ],
            timeout=timeout,
        )

    def sql(self, statement: str) -> str:
        done = self.client("mariadb", "--batch", "--skip-column-names", "-e", statement)
        if done.returncode != 0:
            raise RuntimeError(f"mariadb: {statement}: {done.stderr}")
        return done.stdout

    def ready(self) -> bool:
        return (
            self.client("mariadb-admin", "--connect-timeout=1", "ping", timeout=10).returncode == 0
        )

    def after_first_start(self) -> None:
        self.sql(
            f"CREATE USER IF NOT EXISTS 'root'@'{HOST}' IDENTIFIED BY '';"
            f" GRANT ALL PRIVILEGES ON *.* TO 'root'@'{HOST}' WITH GRANT OPTION;"
        )


class PrivateServers:
    """A Redis, a RabbitMQ node and a MariaDB of their own, under one temporary directory."""

    def __init__(self) -> None:
        sweep_stale()
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=BASE))
        # mariadbd runs as mysql and must pass through here to its own directories.
        self.root.chmod(0o755)
        (self.root / "owner").write_text(str(os.getpid()))
        self.redis = PrivateRedis(self.root / "redis")
        self.rabbitmq = PrivateRabbitMQ(self.root / "rabbitmq")
        self.mariadb = PrivateMariaDB(self.root / "mariadb")

    @property
    def all(self) -> tuple[PrivateServer, ...]:
        return (self.redis, self.rabbitmq, self.mariadb)

    def start(self) -> float:
        """Start all three at once (RabbitMQ takes longest); seconds it took."""
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(self.all)) as pool:
            for future in [pool.submit(s.start) for s in self.all]:
                future.result()
        return time.monotonic() - started

    def ensure_running(self) -> None:
        """Whatever a previous test left stopped is started again."""
        for server in self.all:
            if not server.running:
                server.start()

    def remove(self) -> None:
        errors = []
        for server in self.all:
            try:
                server.remove()
            except Exception as exc:
                errors.append(exc)
        shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            raise errors[0]


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def sweep_stale() -> None:
    """Remove what a run that died without its teardown (killed outright) left behind: every
    ``/tmp/lf-*`` whose owning interpreter is gone, and the processes of its sessions, those
    that still work under that directory (a recycled pid's session is someone else's)."""
    for root in BASE.glob(f"{PREFIX}*"):
        owner = root / "owner"
        try:
            if _alive(int(owner.read_text())):
                continue
        except (OSError, ValueError):
            continue
        for marker in root.glob("*/*session"):
            with contextlib.suppress(OSError, ValueError):
                sid = int(marker.read_text())
                for pid in _session_pids(sid):
                    with contextlib.suppress(OSError):
                        if Path(f"/proc/{pid}/cwd").resolve().is_relative_to(root):
                            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@atexit.register
def _remove_leftovers() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.remove()
