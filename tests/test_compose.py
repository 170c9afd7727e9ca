"""The container deployment (deploy/compose.yml, deploy/Dockerfile) hangs together.

No Docker engine is needed: the compose file is read as YAML and checked for what makes the
stack start in the right order, stay observable and run the modules that exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from shared.settings import LadderSettings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"

INFRA = ("redis", "rabbitmq", "mysql")
# Each long-running Ladder service and the port its /readyz answers on (the settings' defaults).
LADDER_PORTS = {
    "api": LadderSettings.model_fields["api_port"].default,
    "aggregator": LadderSettings.model_fields["aggregator_port"].default,
    "history": LadderSettings.model_fields["history_port"].default,
    "notifier": LadderSettings.model_fields["notifier_port"].default,
}
LADDER = ("migrate", *LADDER_PORTS)
CONSUMERS = ("aggregator", "history", "notifier")

_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


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


def _interpolate(value: str) -> str:
    """What compose makes of ``${VAR:-default}`` when the caller sets nothing."""
    return _VAR.sub(lambda m: m.group("default") or "", value)


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): _interpolate(str(v)) for k, v in env.items()}


def _argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def _published_container_ports(service: dict[str, Any]) -> set[int]:
    """Container ports published to the host, from short ("[ip:]host:container") or long syntax."""
    published = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            if entry.get("published") is not None:
                published.add(int(entry["target"]))
            continue
        parts = str(entry).split("/")[0].split(":")
        if len(parts) >= 2:
            published.add(int(parts[-1]))
    return published


def _healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    argv = _argv(test)
    assert argv[0] in ("CMD", "CMD-SHELL"), f"healthcheck test must be CMD or CMD-SHELL: {argv}"
    return argv


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
    assert _healthcheck_argv(services["rabbitmq"])[1:] == ["rabbitmq-diagnostics", "-q", "ping"]
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
    assert redis["image"].startswith("redis:7.")
    argv = _argv(redis["command"])
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] == "everysec"


def test_stateful_services_keep_their_data_in_named_volumes(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    targets = {"redis": "/data", "rabbitmq": "/var/lib/rabbitmq", "mysql": "/var/lib/mysql"}
    for name, target in targets.items():
        mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in services[name]["volumes"]}
        assert target in mounts, f"{name} must keep {target} in a volume"
        assert mounts[target] in compose["volumes"], f"{name}: {mounts[target]} is not declared"


def test_rabbitmq_serves_its_management_ui(services: dict[str, dict[str, Any]]) -> None:
    rabbitmq = services["rabbitmq"]
    assert "management" in rabbitmq["image"]
    assert 15672 in _published_container_ports(rabbitmq)
    # The node name follows the host name; it must not change when the container is recreated.
    assert rabbitmq.get("hostname")


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


def test_ladder_services_reach_the_infrastructure_by_service_name(
    services: dict[str, dict[str, Any]],
) -> None:
    rabbitmq_env = _environment(services["rabbitmq"])
    mysql_env = _environment(services["mysql"])
    root_password = mysql_env.get("MARIADB_ROOT_PASSWORD", mysql_env.get("MYSQL_ROOT_PASSWORD"))
    for name in LADDER:
        env = _environment(services[name])
        redis = urlsplit(env["LADDER_REDIS_URL"])
        assert (redis.scheme, redis.hostname) == ("redis", "redis"), name
        amqp = urlsplit(env["LADDER_AMQP_URL"])
        assert amqp.hostname == "rabbitmq", name
        # guest may only connect from localhost: the services use the user the broker creates.
        assert amqp.username == rabbitmq_env["RABBITMQ_DEFAULT_USER"] != "guest", name
        assert amqp.password == rabbitmq_env["RABBITMQ_DEFAULT_PASS"], name
        mysql = urlsplit(env["LADDER_MYSQL_URL"])
        assert (mysql.scheme, mysql.hostname, mysql.path) == ("mysql+asyncmy", "mysql", "/ladder")
        assert mysql.username == "root", name
        if root_password is None:
            assert mysql_env.get("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD") in ("1", "yes", "true")
            assert not mysql.password, name
        else:
            assert (mysql.password or "") == root_password, name


def test_secrets_come_from_the_callers_environment(compose: dict[str, Any]) -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    for variable in ("LADDER_SERVER_KEYS", "LADDER_ADMIN_KEYS", "LADDER_JWT_SECRET"):
        assert re.search(rf"{variable}: \$\{{{variable}:-[^}}]*\}}", text), variable
    for name in LADDER:
        env = compose["services"][name]["environment"]
        for variable in ("LADDER_SERVER_KEYS", "LADDER_ADMIN_KEYS", "LADDER_JWT_SECRET"):
            assert variable in env, f"{name} does not receive {variable}"
        # The services read exactly what is set: LADDER_ENV is never left empty.
        assert _environment(compose["services"][name])["LADDER_ENV"] in ("dev", "prod")


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def test_dockerfile_runs_as_a_non_root_user() -> None:
    assert DOCKERFILE.is_file()
    instructions = _dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    users = [arguments for keyword, arguments in instructions if keyword == "USER"]
    assert users, "the Dockerfile sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"the image runs as {users[-1]}"
    # Nothing after the final USER switches back.
    last_user = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "USER")
    assert all(keyword != "USER" for keyword, _ in instructions[last_user + 1 :])


def test_dockerfile_installs_the_project_and_defaults_to_a_service() -> None:
    instructions = _dockerfile_instructions()
    copied = " ".join(arguments for keyword, arguments in instructions if keyword == "COPY")
    for needed in ("pyproject.toml", "shared", "services"):
        assert needed in copied, f"the image does not copy {needed}"
    runs = " ".join(arguments for keyword, arguments in instructions if keyword == "RUN")
    assert re.search(r"pip install (\S+ )*\.(\s|$)", runs), "the project is not pip-installed"
    cmd = [arguments for keyword, arguments in instructions if keyword == "CMD"]
    assert cmd and "services." in cmd[-1]
