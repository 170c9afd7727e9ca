"""The container deployment (deploy/compose.yml, deploy/Dockerfile, deploy/rabbitmq/) hangs
together and lets no one in where they don't belong.

No Docker engine is needed: the compose file is read as YAML and interpolated the way compose
does it, and checked for what makes the stack start in the right order, stay observable, run
the modules that exist, and run with real secrets: no default credential anywhere, each Ladder
service with its own broker user holding only the permissions it needs, and nothing but the API
published. The broker's permissions are checked by applying RabbitMQ's rules (which permission
each AMQP operation needs, on which name) to the names of shared/topology.py. The RabbitMQ
entrypoint script runs for real, with a stand-in for the image's own entrypoint.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from shared.settings import LadderSettings
from shared.topology import CONSUMERS, Topology
from tests.helpers import dockerfile_instructions

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yml"
DEBUG_FILE = DEPLOY / "compose.debug.yml"
ENV_EXAMPLE = DEPLOY / ".env.example"
DOCKERFILE = DEPLOY / "Dockerfile"
RABBITMQ = DEPLOY / "rabbitmq"
DEFINITIONS = RABBITMQ / "definitions.json"
RABBITMQ_CONF = RABBITMQ / "rabbitmq.conf"
ENTRYPOINT = RABBITMQ / "entrypoint.sh"

INFRA = ("redis", "rabbitmq", "mysql")
# Each long-running Ladder service and the port its /readyz answers on (the settings' defaults).
LADDER_PORTS = {
    "api": LadderSettings.model_fields["api_port"].default,
    "aggregator": LadderSettings.model_fields["aggregator_port"].default,
    "history": LadderSettings.model_fields["history_port"].default,
    "notifier": LadderSettings.model_fields["notifier_port"].default,
}
LADDER = ("migrate", *LADDER_PORTS)

# The servers each Ladder container talks to, and so the only credentials it receives.
USES = {
    "migrate": {"mysql"},
    "api": {"redis", "mysql", "rabbitmq"},
    "aggregator": {"redis", "rabbitmq"},
    "history": {"redis", "mysql", "rabbitmq"},
    "notifier": {"redis", "rabbitmq"},
}
URL_VARIABLE = {
    "redis": "LADDER_REDIS_URL",
    "mysql": "LADDER_MYSQL_URL",
    "rabbitmq": "LADDER_AMQP_URL",
}

# Every secret the stack needs; compose must refuse to run without any of them.
API_SECRETS = ("LADDER_SERVER_KEYS", "LADDER_ADMIN_KEYS", "LADDER_JWT_SECRET")
SECRETS = {
    *API_SECRETS,
    "REDIS_PASSWORD",
    "AMQP_ADMIN_PASSWORD",
    "AMQP_API_PASSWORD",
    "AMQP_AGGREGATOR_PASSWORD",
    "AMQP_HISTORY_PASSWORD",
    "AMQP_NOTIFIER_PASSWORD",
    "LADDER_BROKER_MONITOR_PASSWORD",
    "MYSQL_ROOT_PASSWORD",
    "MYSQL_PASSWORD",
}
# A distinct, URL-safe value for each, 32 bytes or more as prod wants of the JWT secret.
SAMPLE = {name: f"{name.lower().replace('_', '-')}-{'0' * 32}" for name in SECRETS}

BROKER_USERS = {"api": "ladder-api", **{c: f"ladder-{c}" for c in CONSUMERS}}
BROKER_ADMIN = "ladder-admin"
BROKER_MONITOR = "ladder-monitor"
TOPOLOGY = Topology()


# --- interpolation, as compose does it -----------------------------------------------------

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})"
)


class MissingVariable(Exception):
    """What compose reports for a `${VAR:?message}` whose variable is unset or empty."""


def _interpolate(value: str, env: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name, op, arg = m["name"], m["op"], m["arg"] or ""
        found = env.get(name)
        unset = found is None or (found == "" and op is not None and op.startswith(":"))
        if op in (":?", "?") and unset:
            raise MissingVariable(name)
        if op in (":-", "-") and unset:
            return arg
        return found or ""

    return _VAR.sub(one, value)


def _required_variables(text: str) -> set[str]:
    return {m["name"] for m in _VAR.finditer(text) if m["op"] in (":?", "?")}


def _with_defaults(text: str) -> dict[str, str]:
    return {m["name"]: m["arg"] for m in _VAR.finditer(text) if m["op"] in (":-", "-")}


def _strings(node: object) -> list[str]:
    """Every string of a parsed compose file (keys and values, comments gone), which is what
    compose interpolates: extension fields (``x-...``) included."""
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in (*_strings(key), *_strings(value))]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return [node] if isinstance(node, str) else []


# --- reading the files ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as handle:
        document = yaml.safe_load(handle)
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


@pytest.fixture(scope="module")
def definitions() -> dict[str, Any]:
    document = json.loads(DEFINITIONS.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def _environment(service: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, str]:
    """A service's environment as compose hands it over, with ``env`` as the caller's."""
    raw = service.get("environment", {})
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): _interpolate(str(v), SAMPLE if env is None else env) for k, v in raw.items()}


def _argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def _published_container_ports(service: dict[str, Any]) -> dict[int, str]:
    """Container port → host address, for ports published to the host (short or long syntax);
    the address is "" where a port is published on every interface."""
    published: dict[int, str] = {}
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            if entry.get("published") is not None:
                published[int(entry["target"])] = str(entry.get("host_ip", ""))
            continue
        parts = _interpolate(str(entry), {}).split("/")[0].split(":")
        if len(parts) >= 2:
            published[int(parts[-1])] = parts[0] if len(parts) == 3 else ""
    return published


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Target → (source, read-only) of a service's short-syntax volumes."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, target, *mode = str(entry).split(":")
        mounts[target] = (source, "ro" in mode)
    return mounts


def _healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    argv = _argv(test)
    assert argv[0] in ("CMD", "CMD-SHELL"), f"healthcheck test must be CMD or CMD-SHELL: {argv}"
    return argv


# --- the services, their order and their health --------------------------------------------


def test_every_service_is_defined(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == set(INFRA) | set(LADDER)


def test_ladder_services_share_one_image_built_from_the_dockerfile(
    services: dict[str, dict[str, Any]],
) -> None:
    images = set()
    for name in LADDER:
        service = services[name]
        build = service.get("build")
        assert isinstance(build, dict), f"{name} must build the Ladder image"
        context = (DEPLOY / build["context"]).resolve()
        assert context == ROOT, f"{name}: the build context must be the repository root"
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE
        images.add(service.get("image"))
    assert len(images) == 1, f"the Ladder services must share one image name: {images}"


def test_ladder_services_run_modules_that_exist(services: dict[str, dict[str, Any]]) -> None:
    for name in LADDER:
        argv = _argv(services[name]["command"])
        assert argv[:2] == ["python", "-m"], f"{name}: {argv}"
        module = argv[2]
        parts = module.split(".")
        assert parts[0] == "services" and len(parts) >= 2, f"{name}: {module}"
        package = ROOT / "services" / parts[1]
        assert (package / "__init__.py").is_file(), f"{name}: {package} is not a package"
    expected = {name: f"services.{name}" for name in LADDER_PORTS}
    expected["migrate"] = "services.history.migrate"
    assert {name: _argv(services[name]["command"])[2] for name in LADDER} == expected


def test_every_service_but_migrate_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if name == "migrate":
            assert "healthcheck" not in service
            continue
        assert "healthcheck" in service, f"{name} has no healthcheck"
        assert service["healthcheck"].get("disable") is not True
        _healthcheck_argv(service)


def test_ladder_healthchecks_probe_readyz_on_their_own_port(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, port in LADDER_PORTS.items():
        argv = _healthcheck_argv(services[name])
        probe = " ".join(argv[1:])
        # The slim image has no curl: the probe is Python's own urllib.
        assert argv[1] == "python" or probe.startswith("python "), f"{name}: {probe}"
        assert f"http://127.0.0.1:{port}/readyz" in probe, f"{name}: {probe}"


def test_infra_healthchecks_ask_the_server_itself(services: dict[str, dict[str, Any]]) -> None:
    redis = " ".join(_healthcheck_argv(services["redis"])[1:])
    assert "redis-cli" in redis and "ping" in redis
    # The listeners open only after the definitions are imported: connectable means the users
    # and the topology exist.
    assert _healthcheck_argv(services["rabbitmq"])[1:] == [
        "rabbitmq-diagnostics",
        "-q",
        "check_port_connectivity",
    ]
    mysql = " ".join(_healthcheck_argv(services["mysql"])[1:])
    assert "healthcheck.sh" in mysql or "mysqladmin" in mysql or "mariadb-admin" in mysql


def test_dependencies_wait_for_health_or_completion(services: dict[str, dict[str, Any]]) -> None:
    expected = {
        "migrate": {"mysql"},
        "api": {"redis", "rabbitmq", "migrate"},
        "aggregator": {"redis", "rabbitmq"},
        "history": {"redis", "rabbitmq", "mysql", "migrate"},
        "notifier": {"redis", "rabbitmq"},
    }
    for name, needed in expected.items():
        depends_on = services[name].get("depends_on")
        assert isinstance(depends_on, dict), f"{name}: depends_on must name conditions"
        assert needed <= set(depends_on), f"{name} must wait for {needed - set(depends_on)}"
        for dependency, spec in depends_on.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            want = (
                "service_completed_successfully" if dependency == "migrate" else "service_healthy"
            )
            assert isinstance(spec, dict) and spec.get("condition") == want, (
                f"{name} -> {dependency}: condition must be {want}"
            )
            if want == "service_healthy":
                assert "healthcheck" in services[dependency]


def test_migrate_runs_once(services: dict[str, dict[str, Any]]) -> None:
    assert services["migrate"].get("restart") == "no"
    assert "ports" not in services["migrate"]


def test_redis_keeps_an_append_only_file(services: dict[str, dict[str, Any]]) -> None:
    redis = services["redis"]
    assert _interpolate(redis["image"], {}).startswith("redis:7.")
    argv = _argv(redis["command"])
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] == "everysec"


def test_stateful_services_keep_their_data_in_named_volumes(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    targets = {"redis": "/data", "rabbitmq": "/var/lib/rabbitmq", "mysql": "/var/lib/mysql"}
    for name, target in targets.items():
        mounts = _mounts(services[name])
        assert target in mounts, f"{name} must keep {target} in a volume"
        assert mounts[target][0] in compose["volumes"], f"{name}: {mounts[target][0]} undeclared"


def test_api_is_published_and_listens_beyond_loopback(services: dict[str, dict[str, Any]]) -> None:
    api = services["api"]
    assert 8000 in _published_container_ports(api)
    env = _environment(api)
    assert env["LADDER_API_HOST"] == "0.0.0.0"
    assert env.get("LADDER_API_PORT", "8000") == "8000"


def test_consumers_ops_endpoints_listen_beyond_loopback(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in CONSUMERS:
        assert _environment(services[name])["LADDER_OPS_HOST"] == "0.0.0.0", name


# --- secrets: prod, nothing defaulted, nothing missing -------------------------------------


def test_the_stack_requires_every_secret_and_defaults_none(compose: dict[str, Any]) -> None:
    text = "\n".join(_strings(compose))
    assert _required_variables(text) == SECRETS
    defaulted = set(_with_defaults(text)) & SECRETS
    assert not defaulted, f"secrets with a default value: {sorted(defaulted)}"
    for variable in API_SECRETS:
        assert _required_variables(compose["x-ladder-env"][variable]) == {variable}


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_run_without_each_secret(compose: dict[str, Any], missing: str) -> None:
    """As `docker compose` interpolates the whole file first, a missing or empty secret stops
    every command, whichever service uses it."""
    strings = _strings(compose)
    for string in strings:
        _interpolate(string, SAMPLE)
    for caller in ({k: v for k, v in SAMPLE.items() if k != missing}, {**SAMPLE, missing: ""}):
        with pytest.raises(MissingVariable) as refused:
            for string in strings:
                _interpolate(string, caller)
        assert str(refused.value) == missing


def test_ladder_services_run_in_prod_with_the_three_credentials(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in LADDER:
        raw = services[name]["environment"]
        assert raw["LADDER_ENV"] == "prod", f"{name} must run with LADDER_ENV=prod"
        env = _environment(services[name])
        for variable in API_SECRETS:
            assert env[variable] == SAMPLE[variable], f"{name} does not receive {variable}"


def test_each_ladder_service_loads_prod_settings_from_its_environment(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What compose hands each service is what its settings accept in prod."""
    for name in LADDER:
        with monkeypatch.context() as patch:
            for key in [k for k in os.environ if k.startswith("LADDER_")]:
                patch.delenv(key)
            for key, value in _environment(services[name]).items():
                patch.setenv(key, value)
            settings = LadderSettings(_env_file=None)
        assert settings.env == "prod", name
        assert settings.effective_server_keys == {SAMPLE["LADDER_SERVER_KEYS"]}, name
        assert settings.effective_admin_keys == {SAMPLE["LADDER_ADMIN_KEYS"]}, name
        assert settings.effective_jwt_secret == SAMPLE["LADDER_JWT_SECRET"], name
        assert settings.uses_dev_defaults == [], name


def test_the_api_container_runs_the_api_workers_it_is_given(
    services: dict[str, dict[str, Any]],
) -> None:
    """The API scales inside its container (docs/operations.md): LADDER_API_WORKERS from the
    caller's environment or deploy/.env reaches it, and without one it runs the default."""
    given = _environment(services["api"], {**SAMPLE, "LADDER_API_WORKERS": "4"})
    assert given["LADDER_API_WORKERS"] == "4"
    default = LadderSettings.model_fields["api_workers"].default
    assert _environment(services["api"])["LADDER_API_WORKERS"] == str(default)


def test_the_env_example_lists_every_secret_and_fills_in_none() -> None:
    """Copied as it is, deploy/.env.example must not start a stack with known secrets."""
    assigned = dict(
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    )
    assert set(assigned) == SECRETS
    assert all(value == "" for value in assigned.values()), assigned


# --- who reaches what ----------------------------------------------------------------------


def test_only_the_api_is_published_by_default(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if name == "api":
            assert set(_published_container_ports(service)) == {8000}
        else:
            assert not service.get("ports"), f"{name} must not be published to the host"


def test_the_management_ui_listens_inside_and_the_debug_override_publishes_it_on_loopback(
    services: dict[str, dict[str, Any]],
) -> None:
    rabbitmq = services["rabbitmq"]
    assert "management" in _interpolate(rabbitmq["image"], {})
    # The UI is there for containers of the stack, not for the host.
    assert "15672" in [str(port) for port in rabbitmq.get("expose", [])]
    assert 15672 not in _published_container_ports(rabbitmq)
    # The node name follows the host name; it must not change when the container is recreated.
    assert rabbitmq.get("hostname")

    debug = yaml.safe_load(DEBUG_FILE.read_text(encoding="utf-8"))
    assert set(debug["services"]) == {"rabbitmq"}, "the override publishes the UI and no more"
    assert set(debug["services"]["rabbitmq"]) == {"ports"}
    assert _published_container_ports(debug["services"]["rabbitmq"]) == {15672: "127.0.0.1"}
    assert f"-f deploy/{COMPOSE_FILE.name} -f deploy/{DEBUG_FILE.name}" in DEBUG_FILE.read_text(
        encoding="utf-8"
    )


def test_each_ladder_service_gets_only_the_servers_it_uses(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, uses in USES.items():
        env = _environment(services[name])
        received = {server for server, variable in URL_VARIABLE.items() if variable in env}
        assert received == uses, f"{name} gets credentials for {sorted(received)}"
        for server in uses:
            url = urlsplit(env[URL_VARIABLE[server]])
            assert url.hostname == server, f"{name} must reach {server} by its service name"


def test_redis_requires_a_password_and_the_healthcheck_gives_it(
    services: dict[str, dict[str, Any]],
) -> None:
    redis = services["redis"]
    argv = _argv(redis["command"])
    assert "--requirepass" in argv
    raw_password = argv[argv.index("--requirepass") + 1]
    assert _required_variables(raw_password) == {"REDIS_PASSWORD"}
    # redis-cli reads REDISCLI_AUTH: the healthcheck logs in (and without it, redis-cli's ping
    # answers NOAUTH, which has no PONG).
    env = _environment(redis)
    assert env["REDISCLI_AUTH"] == SAMPLE["REDIS_PASSWORD"]
    probe = _healthcheck_argv(redis)
    assert probe[0] == "CMD-SHELL" and "grep -q PONG" in probe[1], probe
    assert " -a " not in probe[1], "a password on the command line shows in the process list"
    for name in (n for n, uses in USES.items() if "redis" in uses):
        url = urlsplit(_environment(services[name])["LADDER_REDIS_URL"])
        assert (url.scheme, url.hostname, url.path) == ("redis", "redis", "/0"), name
        assert url.password == SAMPLE["REDIS_PASSWORD"], f"{name} must log in to Redis"


def test_mysql_has_a_root_password_and_a_ladder_user_for_the_services(
    services: dict[str, dict[str, Any]],
) -> None:
    raw = services["mysql"]["environment"]
    env = _environment(services["mysql"])
    assert _required_variables(raw["MARIADB_ROOT_PASSWORD"]) == {"MYSQL_ROOT_PASSWORD"}
    assert not {"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD", "MYSQL_ALLOW_EMPTY_PASSWORD"} & set(env)
    # root from inside the container only; the network sees the services' user alone.
    assert env["MARIADB_ROOT_HOST"] == "localhost"
    # The image grants MARIADB_USER every privilege on MARIADB_DATABASE and nothing else.
    assert (env["MARIADB_USER"], env["MARIADB_DATABASE"]) == ("ladder", "ladder")
    assert _required_variables(raw["MARIADB_PASSWORD"]) == {"MYSQL_PASSWORD"}
    assert env["MARIADB_PASSWORD"] != env["MARIADB_ROOT_PASSWORD"]
    for name in (n for n, uses in USES.items() if "mysql" in uses):
        url = urlsplit(_environment(services[name])["LADDER_MYSQL_URL"])
        assert (url.scheme, url.hostname, url.path) == ("mysql+asyncmy", "mysql", "/ladder")
        assert (url.username, url.password) == ("ladder", SAMPLE["MYSQL_PASSWORD"]), name


# --- the broker: no guest, a user per service, least privilege -----------------------------


def _password_variable(user: dict[str, Any]) -> str:
    match = re.fullmatch(r"\$\{([A-Z][A-Z0-9_]*)\}", user["password_hash"])
    assert match, f"{user['name']}: password_hash must be a ${{VARIABLE}} placeholder"
    return match[1]


def test_the_broker_loads_definitions_and_has_no_default_user(
    services: dict[str, dict[str, Any]], definitions: dict[str, Any]
) -> None:
    rabbitmq = services["rabbitmq"]
    env = _environment(rabbitmq)
    # A default user would be created on a blank node; with definitions to load, none is.
    assert not {"RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS"} & set(env)
    conf = dict(
        (part.strip() for part in line.split("=", 1))
        for line in RABBITMQ_CONF.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    loaded = conf["load_definitions"]
    assert not {"default_user", "default_pass"} & set(conf)
    mounts = _mounts(rabbitmq)
    assert mounts["/etc/rabbitmq/rabbitmq.conf"] == ("./rabbitmq/rabbitmq.conf", True)
    # The entrypoint renders the template into the file rabbitmq.conf loads, then hands over
    # to the image's entrypoint with the image's command.
    script = ENTRYPOINT.read_text(encoding="utf-8")
    template = re.search(r"TEMPLATE=\$\{LADDER_DEFINITIONS_TEMPLATE:-([^}]+)\}", script)
    output = re.search(r"OUT=\$\{LADDER_DEFINITIONS_OUT:-([^}]+)\}", script)
    assert template and output
    assert output[1] == loaded == "/etc/rabbitmq/definitions.json"
    assert mounts[template[1]] == ("./rabbitmq/definitions.json", True)
    entrypoint = _argv(rabbitmq["entrypoint"])
    assert entrypoint[0] == "bash" and mounts[entrypoint[1]] == ("./rabbitmq/entrypoint.sh", True)
    assert _argv(rabbitmq["command"]) == ["rabbitmq-server"]
    assert 'exec docker-entrypoint.sh "$@"' in script
    # Without a default vhost either, the definitions bring their own.
    assert definitions["vhosts"] == [{"name": "/"}]
    assert "guest" not in {user["name"] for user in definitions["users"]}


def test_each_broker_user_has_a_hashed_password_from_a_required_secret(
    services: dict[str, dict[str, Any]], definitions: dict[str, Any]
) -> None:
    users = {user["name"]: user for user in definitions["users"]}
    assert set(users) == {BROKER_ADMIN, BROKER_MONITOR, *BROKER_USERS.values()}
    tagged = {BROKER_ADMIN: ["administrator"], BROKER_MONITOR: ["monitoring"]}
    raw = services["rabbitmq"]["environment"]
    variables = set()
    for name, user in users.items():
        assert user["hashing_algorithm"] == "rabbit_password_hashing_sha256", name
        assert "password" not in user, f"{name}: a plain password in the definitions"
        variable = _password_variable(user)
        assert _required_variables(str(raw[variable])) == {variable}, name
        variables.add(variable)
        tags = user["tags"] if isinstance(user["tags"], list) else user["tags"].split(",")
        assert tags == tagged.get(name, []), name
    assert len(variables) == len(users), "every broker user has a password of its own"


def test_each_ladder_service_logs_in_as_its_own_broker_user(
    services: dict[str, dict[str, Any]], definitions: dict[str, Any]
) -> None:
    passwords = {user["name"]: _password_variable(user) for user in definitions["users"]}
    seen = set()
    for name in (n for n, uses in USES.items() if "rabbitmq" in uses):
        url = urlsplit(_environment(services[name])["LADDER_AMQP_URL"])
        assert (url.scheme, url.hostname, url.port) == ("amqp", "rabbitmq", 5672), name
        assert url.username == BROKER_USERS[name], f"{name} logs in as {url.username}"
        assert url.password == SAMPLE[passwords[BROKER_USERS[name]]], name
        seen.add(url.username)
    assert seen == set(BROKER_USERS.values())


class Permissions:
    """A user's permissions on the vhost, matched as RabbitMQ matches them: a regular expression
    searched in the resource's name, exchanges and queues alike; "" means "^$"; the default
    exchange is named amq.default."""

    def __init__(self, entry: dict[str, str]) -> None:
        self.patterns = {kind: entry[kind] for kind in ("configure", "write", "read")}

    def allows(self, kind: str, name: str) -> bool:
        pattern = self.patterns[kind] or "^$"
        return re.search(pattern, name or "amq.default") is not None


@pytest.fixture(scope="module")
def permissions(definitions: dict[str, Any]) -> dict[str, Permissions]:
    entries = definitions["permissions"]
    assert all(entry["vhost"] == "/" for entry in entries)
    found = {entry["user"]: Permissions(entry) for entry in entries}
    assert len(found) == len(entries) == len(definitions["users"])
    return found


def _declare_needs(topology: Topology) -> list[tuple[str, str]]:
    """(permission, name) that ``Topology.declare()`` needs when the topology exists already:
    exchange.declare and queue.declare need configure on their name; queue.bind needs write on
    the queue and read on the exchange. (Creating a queue with a dead-letter exchange would
    also need read on the queue and write on the default exchange; the definitions create
    the queues, so the services never do.)"""
    needs = [("configure", topology.scores_exchange), ("configure", topology.periods_exchange)]
    for consumer in CONSUMERS:
        needs += [
            ("configure", topology.dead_queue(consumer)),
            ("configure", topology.queue(consumer)),
            ("write", topology.queue(consumer)),
            ("read", topology.scores_exchange),
        ]
    return needs


def test_every_ladder_user_may_declare_the_topology(permissions: dict[str, Permissions]) -> None:
    # Every service calls the same idempotent declare(), so each needs these rights.
    for user in BROKER_USERS.values():
        for kind, name in _declare_needs(TOPOLOGY):
            assert permissions[user].allows(kind, name), f"{user} may not {kind} {name}"


def test_only_the_api_publishes_to_the_exchange(permissions: dict[str, Permissions]) -> None:
    assert permissions["ladder-api"].allows("write", TOPOLOGY.scores_exchange)
    for consumer in CONSUMERS:
        user = BROKER_USERS[consumer]
        assert not permissions[user].allows("write", TOPOLOGY.scores_exchange), user


def test_only_the_aggregator_publishes_closed_periods(permissions: dict[str, Permissions]) -> None:
    """The aggregator's period relay publishes period.closed messages (a found bug: without
    the periods exchange in their permissions, no consumer could start in containers)."""
    for user in BROKER_USERS.values():
        allowed = permissions[user].allows("write", TOPOLOGY.periods_exchange)
        assert allowed is (user == BROKER_USERS["aggregator"]), user


def test_each_consumer_reads_its_own_queue_and_no_other(
    permissions: dict[str, Permissions],
) -> None:
    for user, granted in permissions.items():
        if user == BROKER_ADMIN:
            continue
        for consumer in CONSUMERS:
            own = user == BROKER_USERS.get(consumer)
            assert granted.allows("read", TOPOLOGY.queue(consumer)) is own, (user, consumer)
            # Dead letters are for operators: nobody but the admin consumes them.
            assert not granted.allows("read", TOPOLOGY.dead_queue(consumer)), (user, consumer)


def test_no_ladder_user_reaches_beyond_the_topology(permissions: dict[str, Permissions]) -> None:
    outside = [
        "",  # the default exchange: publishing there reaches any queue by its name
        "amq.topic",
        "other",
        f"{TOPOLOGY.scores_exchange}.extra",
        f"{TOPOLOGY.queue('history')}.extra",
        f"x{TOPOLOGY.scores_exchange}",
        f"{TOPOLOGY.scores_exchange}x",
    ]
    for user in BROKER_USERS.values():
        for kind in ("configure", "write", "read"):
            for name in outside:
                assert not permissions[user].allows(kind, name), f"{user} may {kind} {name!r}"
    admin = permissions[BROKER_ADMIN]
    assert all(admin.allows(kind, "anything") for kind in ("configure", "write", "read"))


def test_the_definitions_declare_the_topology_the_services_declare(
    services: dict[str, dict[str, Any]], definitions: dict[str, Any]
) -> None:
    """The services' declare() must find exactly what the definitions made, or the broker
    refuses it (different arguments) or the services would need rights to create queues."""
    for name in LADDER:
        env = _environment(services[name])
        assert "LADDER_BROKER_PREFIX" not in env and "LADDER_DELIVERY_LIMIT" not in env, name
    defaults = LadderSettings.model_fields
    topology = Topology(
        prefix=defaults["broker_prefix"].default,
        delivery_limit=defaults["delivery_limit"].default,
    )
    assert topology == TOPOLOGY
    assert all(
        item["vhost"] == "/"
        for key in ("exchanges", "queues", "bindings")
        for item in definitions[key]
    )
    assert definitions["exchanges"] == [
        {
            "name": name,
            "vhost": "/",
            "type": "fanout",
            "durable": True,
            "auto_delete": False,
            "internal": False,
            "arguments": {},
        }
        for name in (topology.scores_exchange, topology.periods_exchange)
    ]
    queues = {queue["name"]: queue for queue in definitions["queues"]}
    expected: dict[str, Any] = {}
    for consumer in CONSUMERS:
        expected[topology.queue(consumer)] = dict(topology.queue_arguments(consumer))
        expected[topology.dead_queue(consumer)] = {"x-queue-type": "quorum"}
    assert {name: queue["arguments"] for name, queue in queues.items()} == expected
    assert all(q["durable"] and not q["auto_delete"] for q in queues.values())
    # aio-pika binds with the queue's name as the routing key.
    bindings = {
        (b["source"], b["destination"], b["destination_type"], b["routing_key"])
        for b in definitions["bindings"]
    }
    assert bindings == {
        (topology.scores_exchange, topology.queue(c), "queue", topology.queue(c)) for c in CONSUMERS
    }


needs_tools = pytest.mark.skipif(
    not (shutil.which("bash") and shutil.which("openssl") and shutil.which("base64")),
    reason="the RabbitMQ entrypoint needs bash, openssl and base64",
)


def _run_entrypoint(tmp_path: Path, passwords: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The entrypoint with the image's own entrypoint replaced by a stand-in that records its
    arguments and whatever AMQP_* variables it was left with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "docker-entrypoint.sh"
    stand_in.write_text(
        "#!/usr/bin/env bash\n"
        'printf "%s\\n" "$*" > "$0.args"\n'
        'env | grep "^AMQP_" > "$0.env" || true\n',
        encoding="utf-8",
    )
    stand_in.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "LADDER_DEFINITIONS_TEMPLATE": str(DEFINITIONS),
        "LADDER_DEFINITIONS_OUT": str(tmp_path / "definitions.json"),
        **passwords,
    }
    return subprocess.run(
        ["bash", str(ENTRYPOINT), "rabbitmq-server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@needs_tools
def test_the_entrypoint_writes_salted_sha256_hashes_and_starts_the_broker(
    tmp_path: Path, definitions: dict[str, Any]
) -> None:
    passwords = {
        _password_variable(user): SAMPLE["AMQP_API_PASSWORD"] + user["name"]
        for user in definitions["users"]
    }
    done = _run_entrypoint(tmp_path, passwords)
    assert done.returncode == 0, done.stderr
    rendered_path = tmp_path / "definitions.json"
    assert stat.S_IMODE(rendered_path.stat().st_mode) == 0o600
    text = rendered_path.read_text(encoding="utf-8")
    assert not any(password in text for password in passwords.values())
    rendered = json.loads(text)
    # Everything but the hashes is the template's.
    for key in ("vhosts", "permissions", "exchanges", "queues", "bindings"):
        assert rendered[key] == definitions[key], key
    for user in rendered["users"]:
        template = next(u for u in definitions["users"] if u["name"] == user["name"])
        password = passwords[_password_variable(template)]
        # rabbit_password_hashing_sha256: base64(salt + sha256(salt + password)), 4-byte salt.
        raw = base64.b64decode(user["password_hash"], validate=True)
        salt, digest = raw[:4], raw[4:]
        assert digest == hashlib.sha256(salt + password.encode()).digest(), user["name"]
    stand_in = tmp_path / "bin" / "docker-entrypoint.sh"
    assert (tmp_path / "bin" / "docker-entrypoint.sh.args").read_text() == "rabbitmq-server\n"
    # The broker does not inherit the plain passwords.
    assert Path(f"{stand_in}.env").read_text() == ""


@needs_tools
def test_the_entrypoint_refuses_a_missing_password(
    tmp_path: Path, definitions: dict[str, Any]
) -> None:
    variables = sorted(_password_variable(user) for user in definitions["users"])
    for missing in variables:
        passwords = {v: SAMPLE["AMQP_API_PASSWORD"] for v in variables if v != missing}
        done = _run_entrypoint(tmp_path, passwords)
        assert done.returncode != 0
        assert missing in done.stderr
        assert not (tmp_path / "definitions.json").exists()
        assert not (tmp_path / "bin" / "docker-entrypoint.sh.args").exists()


# --- the image -----------------------------------------------------------------------------


def test_dockerfile_runs_as_a_non_root_user() -> None:
    assert DOCKERFILE.is_file()
    instructions = dockerfile_instructions(DOCKERFILE)
    # The base is a build argument whose default is the official image.
    assert instructions[0] == ("ARG", "LADDER_PYTHON_IMAGE=python:3.11-slim")
    assert instructions[1] == ("FROM", "${LADDER_PYTHON_IMAGE}")
    users = [arguments for keyword, arguments in instructions if keyword == "USER"]
    assert users, "the Dockerfile sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"the image runs as {users[-1]}"
    # Nothing after the final USER switches back.
    last_user = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "USER")
    assert all(keyword != "USER" for keyword, _ in instructions[last_user + 1 :])


def test_dockerfile_installs_the_project_and_defaults_to_a_service() -> None:
    instructions = dockerfile_instructions(DOCKERFILE)
    copies = [arguments for keyword, arguments in instructions if keyword == "COPY"]
    # `COPY . ./` copies what the build context holds: what .dockerignore lets in.
    allowed = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    copied = " ".join(copies) + (" ".join(allowed) if ". ./" in copies else "")
    for needed in ("pyproject.toml", "shared", "services"):
        assert needed in copied, f"the image does not copy {needed}"
    runs = " ".join(arguments for keyword, arguments in instructions if keyword == "RUN")
    assert re.search(r"pip install (\S+ )*\.(\s|$)", runs), "the project is not pip-installed"
    cmd = [arguments for keyword, arguments in instructions if keyword == "CMD"]
    assert cmd and "services." in cmd[-1]
