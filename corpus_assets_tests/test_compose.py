"""docker-compose.yml is a valid Compose file with the deployment's properties, without Docker.

No Docker engine here: the file is validated against the official Compose Specification
schema (vendored, see data/README.md), and the properties a schema cannot see are asserted:
the UI only on the host's loopback, a health-checked database every Dagster service waits
for, no default password (each required from the environment), exactly one daemon, one shared
data volume, and names that agree with deploy/dagster.yaml,
deploy/workspace.yaml, deploy/initdb.sql and deploy/Dockerfile. Each property check also runs
on a broken copy, so a regression fails here.
"""

import copy
import json
import re
from typing import Any

import jsonschema
import pytest
import yaml

from corpus_assets_tests.paths import DATA, REPO

DEPLOY = REPO / "deploy"
SCHEMA = DATA / "compose-spec.json"
DAGSTER_SERVICES = ("code", "webserver", "daemon")


def _compose() -> dict[str, Any]:
    """The file as Compose sees it (YAML anchors and ``<<`` merges resolved)."""
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _schema_errors(compose: dict[str, Any]) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose)]


def _host_ips(ports: list[Any]) -> list[str]:
    """The host address of each published port, short (``IP:HOST:CONTAINER``) or long syntax;
    an entry without one binds every interface and yields ``0.0.0.0``."""
    ips = []
    for port in ports:
        if isinstance(port, dict):
            ips.append(port.get("host_ip", "0.0.0.0"))
            continue
        parts = str(port).rsplit(":", 2)
        ips.append(parts[0] if len(parts) == 3 else "0.0.0.0")
    return ips


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or service.get("entrypoint") or []
    return command.split() if isinstance(command, str) else list(command)


def _flag(command: list[str], *names: str) -> str:
    index = next(i for i, arg in enumerate(command) if arg in names)
    return command[index + 1]


def problems(compose: dict[str, Any]) -> list[str]:
    """What is wrong with a compose document for this deployment (empty: nothing)."""
    found = []
    services = compose["services"]
    if set(services) != {"postgres", *DAGSTER_SERVICES}:
        found.append(f"services are {sorted(services)}")
    health = services["postgres"].get("healthcheck", {})
    if "pg_isready" not in " ".join(_command({"command": health.get("test", [])})):
        found.append("postgres has no pg_isready healthcheck")
    for name, service in services.items():
        exposed = [ip for ip in _host_ips(service.get("ports", [])) if ip != "127.0.0.1"]
        if exposed or (service.get("ports") and name != "webserver"):
            found.append(f"{name} publishes ports beyond the webserver on 127.0.0.1")
        if service.get("network_mode") == "host":
            found.append(f"{name} uses the host network")
    if not services["webserver"].get("ports"):
        found.append("webserver publishes no port")
    for name in DAGSTER_SERVICES:
        service = services[name]
        wait = service.get("depends_on", {}).get("postgres", {})
        if wait.get("condition") != "service_healthy":
            found.append(f"{name} does not wait for a healthy postgres")
        if service["environment"]["CORPUS_HOME"] not in _mount_targets(service):
            found.append(f"{name} does not mount the data volume at CORPUS_HOME")
        if service.get("build", {}).get("dockerfile") != "deploy/Dockerfile":
            found.append(f"{name} is not built from deploy/Dockerfile")
    daemons = [n for n, s in services.items() if _command(s)[:2] == ["dagster-daemon", "run"]]
    replicas = services.get("daemon", {}).get("deploy", {}).get("replicas", 1)
    if daemons != ["daemon"] or replicas != 1:
        found.append(f"daemons: {daemons} x {replicas}, not exactly one")
    return found + default_passwords(compose)


SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN", re.IGNORECASE)
# ``${VAR}`` with a default (``:-``, ``-``) or alternative (``:+``, ``+``), or none at all
UNGUARDED = re.compile(r"\$\{(?P<var>\w+)(?P<op>:?[-+][^}]*)?\}")


def default_passwords(compose: dict[str, Any]) -> list[str]:
    """Secrets the file would supply itself: a password-like variable without ``${VAR:?msg}``
    (Compose then refuses to start until the operator sets it), or a literal value."""
    found = []
    for name, service in compose["services"].items():
        environment = service.get("environment", {})
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) for item in environment)
        for key, value in environment.items():
            text = str(value)
            for use in UNGUARDED.finditer(text):
                if SECRET_NAME.search(use["var"]):
                    found.append(f"{name}: {key} takes ${{{use['var']}}} without ':?'")
            if SECRET_NAME.search(key) and "${" not in text:
                found.append(f"{name}: {key} has a literal value")
    return found


def _mount_targets(service: dict[str, Any]) -> set[str]:
    """Targets of the named-volume mounts (short ``volume:/path`` or long syntax)."""
    targets = set()
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type", "volume") == "volume":
                targets.add(volume["target"])
        elif not volume.startswith((".", "/")):
            targets.add(volume.split(":")[1])
    return targets


def test_compose_file_validates_against_the_compose_spec() -> None:
    compose = _compose()
    assert _schema_errors(compose) == []
    broken = copy.deepcopy(compose)
    broken["services"]["postgres"]["healthcheck"]["interval"] = ["5s"]
    broken["services"]["webserver"]["portz"] = ["3000:3000"]
    errors = _schema_errors(broken)  # the validator is live: wrong types and keys fail
    assert any("healthcheck" in e for e in errors) and any("portz" in e for e in errors)


def test_deployment_properties_hold() -> None:
    assert problems(_compose()) == []


def test_no_default_password_ships() -> None:
    """Every password in the file comes from the operator's environment, required with a
    message: ``${POSTGRES_PASSWORD:?...}`` (docs/OPERATIONS.md: how to set it)."""
    text = (REPO / "docker-compose.yml").read_text()
    uses = re.findall(r"\$\{(POSTGRES_PASSWORD)(:\?[^}]+)?\}", text)
    assert uses and all(op.startswith(":?") and len(op) > 10 for _, op in uses), uses
    assert default_passwords(_compose()) == []


@pytest.mark.parametrize(
    ("service", "key", "value", "problem"),
    [
        ("webserver", "ports", ["3000:3000"], "webserver publishes ports"),
        ("webserver", "ports", ["0.0.0.0:3000:3000"], "webserver publishes ports"),
        ("webserver", "ports", [{"target": 3000, "published": 3000}], "webserver publishes"),
        ("code", "ports", ["127.0.0.1:4000:4000"], "code publishes ports"),
        ("postgres", "healthcheck", None, "no pg_isready healthcheck"),
        ("daemon", "depends_on", {"postgres": {"condition": "service_started"}}, "daemon does"),
        ("code", "volumes", [], "code does not mount the data volume"),
        ("daemon", "deploy", {"replicas": 2}, "not exactly one"),
        ("postgres", "environment", {"POSTGRES_PASSWORD": "${POSTGRES_PASSWORD:-corpus}"}, "':?'"),
        ("postgres", "environment", {"POSTGRES_PASSWORD": "${POSTGRES_PASSWORD}"}, "':?'"),
        ("postgres", "environment", {"POSTGRES_PASSWORD": "corpus"}, "a literal value"),
        ("code", "environment", {"CORPUS_HOME": "/d", "X": "pg://u:${PG_PASSWORD-x}@h"}, "':?'"),
    ],
)
def test_a_broken_property_is_caught(service: str, key: str, value: Any, problem: str) -> None:
    compose = _compose()
    if value is None:
        del compose["services"][service][key]
    else:
        compose["services"][service][key] = value
    assert any(problem in found for found in problems(compose)), problems(compose)


def test_services_agree_with_the_deploy_files() -> None:
    """Commands, the workspace, the instance's env vars, the databases and the image line up."""
    services = _compose()["services"]
    code = _command(services["code"])
    assert code[:3] == ["dagster", "code-server", "start"]
    assert _flag(code, "-m", "--module-name") == "corpus_assets.definitions"
    assert _flag(code, "-h", "--host") == "0.0.0.0"
    (location,) = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())["load_from"]
    grpc = location["grpc_server"]
    assert (grpc["host"], grpc["port"]) == ("code", int(_flag(code, "-p", "--port")))
    assert grpc["location_name"] == _flag(code, "--location-name")
    for name in ("webserver", "daemon"):
        assert _flag(_command(services[name]), "-w", "--workspace").endswith(
            "/deploy/workspace.yaml"
        )
    web = _command(services["webserver"])
    published = services["webserver"]["ports"][0].rsplit(":", 1)[1]
    assert web[0] == "dagster-webserver" and _flag(web, "-p", "--port") == published

    instance_env = set(re.findall(r"env: (\w+)", (DEPLOY / "dagster.yaml").read_text()))
    databases = set(re.findall(r"CREATE DATABASE (\w+);", (DEPLOY / "initdb.sql").read_text()))
    health = " ".join(services["postgres"]["healthcheck"]["test"])
    assert _flag(health.split(), "-d") in databases
    for name in DAGSTER_SERVICES:
        env = services[name]["environment"]
        assert instance_env <= set(env), f"{name} lacks {instance_env - set(env)}"
        assert env["DAGSTER_PG_HOST"] == "postgres" and env["DAGSTER_PG_DB"] in databases
        catalog = env["CORPUS_CATALOG_URL"]
        assert catalog.startswith("postgresql+psycopg2://") and "@postgres:5432/" in catalog
        assert catalog.rsplit("/", 1)[1] in databases - {env["DAGSTER_PG_DB"]}  # its own db
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "uv sync --frozen" in dockerfile and re.search(r"uv==\d+\.\d+\.\d+", dockerfile)
    assert 'cp deploy/dagster.yaml "${DAGSTER_HOME}/dagster.yaml"' in dockerfile
    assert f"DAGSTER_HOME={env['DAGSTER_HOME']}" in dockerfile
    assert re.fullmatch(r"postgres:\d+\.\d+-\w+", services["postgres"]["image"])  # pinned
