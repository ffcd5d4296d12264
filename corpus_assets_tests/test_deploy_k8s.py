"""The Kubernetes recipe (deploy/k8s/, docs/OPERATIONS.md) hangs together, without Kubernetes.

No cluster here: these checks parse every manifest, hold the invariants the Ray runner needs
(every pod runs the same image with the same config path, data home and Secret), parse the
corpus.yaml snippet with the real config models, and load the Dagster instance the Helm chart
renders into a real ``DagsterInstance`` on the local PostgreSQL.
"""

import importlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from dagster import DagsterInstance

from corpus_assets.core.publication.signing import KEY_ENV
from corpus_assets.core.publication.trust_root import TRUST_ENV, TrustRootError, trust_file
from corpus_assets.core.runtime.config import Storage
from corpus_assets.core.runtime.execution import Execution
from corpus_assets_tests.paths import REPO

K8S = REPO / "deploy" / "k8s"


def _load(name: str) -> Any:
    return yaml.safe_load((K8S / name).read_text())


def _user_code() -> dict[str, Any]:
    (deployment,) = _load("values.yaml")["dagster-user-deployments"]["deployments"]
    return deployment


def _ray_containers() -> list[dict[str, Any]]:
    spec = _load("raycluster.yaml")["spec"]
    pods = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    return [container for pod in pods for container in pod["spec"]["containers"]]


def test_every_manifest_is_yaml() -> None:
    names = sorted(path.name for path in K8S.glob("*.yaml"))
    assert names == ["corpus.yaml", "dagster-instance.yaml", "raycluster.yaml", "values.yaml"]
    for name in names:
        assert isinstance(_load(name), dict), name


def test_helm_values_name_the_code_location_launcher_and_external_postgres() -> None:
    values = _load("values.yaml")
    deployment = _user_code()
    args = deployment["dagsterApiGrpcArgs"]
    module = importlib.import_module(args[args.index("--module-name") + 1])
    assert module.defs.resolve_asset_graph().get_all_asset_keys()  # the real code location
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": True}
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"] == [
        {"name": "corpus-env"}
    ]
    postgres = values["postgresql"]
    assert postgres["enabled"] is False and postgres["postgresqlScheme"] == "postgresql+psycopg2"


def test_ray_pods_run_what_the_dagster_runs_run() -> None:
    """Ray workers reopen the workspace by path with the driver's CORPUS_* environment: the
    image, the env, the Secret and every mount must match the run pods' exactly."""
    deployment = _user_code()
    image = f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    containers = _ray_containers()
    assert len(containers) == 2
    for container in containers:
        assert container["image"] == image
        assert container["env"] == deployment["env"]
        assert container["envFrom"] == [{"secretRef": s} for s in deployment["envSecrets"]]
        assert container["volumeMounts"] == deployment["volumeMounts"]
    spec = _load("raycluster.yaml")["spec"]
    for pod in [spec["headGroupSpec"]["template"], spec["workerGroupSpecs"][0]["template"]]:
        assert pod["spec"]["volumes"] == deployment["volumes"]
    assert spec["rayVersion"] == pytest.importorskip("ray").__version__


def test_corpus_snippet_points_at_the_ray_head_service_and_parses() -> None:
    snippet = _load("corpus.yaml")
    execution = Execution.model_validate(snippet["execution"])  # the real model, strict
    cluster = _load("raycluster.yaml")
    name, namespace = cluster["metadata"]["name"], cluster["metadata"]["namespace"]
    client_port = next(
        port["containerPort"] for port in _ray_containers()[0]["ports"] if port["name"] == "client"
    )
    service = f"{name}-head-svc.{namespace}.svc.cluster.local"
    assert execution.engine == "ray" and execution.address == f"ray://{service}:{client_port}"
    assert execution.startup_timeout_s > Execution().startup_timeout_s  # pods start slowly
    storage = dict(snippet["storage"])
    assert storage["cas_url"].startswith("s3://")
    if "cas_url" not in Storage.model_fields:  # the S3 CAS (branch i14-s3) is not merged here
        del storage["cas_url"]
    Storage.model_validate(storage)
    config_env = {e["name"]: e["value"] for e in _user_code()["env"]}["CORPUS_CONFIG"]
    mounts = {m["name"]: m["mountPath"] for m in _user_code()["volumeMounts"]}
    assert Path(config_env).parent == Path(mounts["corpus-config"])


def test_dagster_instance_loads_on_postgres(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instance the chart renders (deploy/k8s/dagster-instance.yaml) matches values.yaml,
    and Dagster loads it: its schema, and its three PostgreSQL storages on a real server (only
    the connection fields are swapped for the local test database)."""
    instance_yaml = _load("dagster-instance.yaml")
    values = _load("values.yaml")
    postgres = values["postgresql"]
    connection = instance_yaml["run_storage"]["config"]["postgres_db"]
    assert connection == {
        "username": postgres["postgresqlUsername"],
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "hostname": postgres["postgresqlHost"],
        "db_name": postgres["postgresqlDatabase"],
        "port": postgres["service"]["port"],
        "params": postgres["postgresqlParams"],
        "scheme": postgres["postgresqlScheme"],
    }
    for storage in ("event_log_storage", "schedule_storage"):
        assert instance_yaml[storage]["config"]["postgres_db"] == connection
    launcher = instance_yaml["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    k8s_launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert launcher["config"]["env_secrets"] == [s["name"] for s in k8s_launcher["envSecrets"]]
    assert launcher["config"]["image_pull_policy"] == k8s_launcher["imagePullPolicy"]
    assert launcher["config"]["load_incluster_config"] is k8s_launcher["loadInclusterConfig"]
    assert launcher["config"]["job_namespace"] == _load("raycluster.yaml")["metadata"]["namespace"]
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert (
        instance_yaml["run_coordinator"]["config"]["max_concurrent_runs"]
        == queued["maxConcurrentRuns"]
    )

    url = urlsplit(postgres_url)
    connection.update(hostname=url.hostname, port=url.port, username=url.username)
    connection["db_name"] = url.path.lstrip("/")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml))
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "")  # trust auth on the local server
    instance = DagsterInstance.from_config(str(home))
    try:
        storages = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        assert [type(s).__name__ for s in storages] == [
            "PostgresRunStorage",
            "PostgresEventLogStorage",
            "PostgresScheduleStorage",
        ]
        assert instance.get_runs() == []  # the tables exist on the server
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    finally:
        instance.dispose()


SECRET_KEY = re.compile(r"password|passwd|secret|token", re.IGNORECASE)
LOCALHOST = ("127.0.0.1", "localhost")


def exposure_problems(manifests: dict[str, Any]) -> list[str]:
    """What the recipe would ship open: a password with a value in a manifest (a Secret the
    operator creates is the only source), a chart told to generate its password Secret from
    such a value, or a Ray dashboard (jobs API: runs any code) on other than loopback."""
    found = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                names_a_secret = str(key).lower().endswith(("secret", "secretname", "_secret"))
                literal = isinstance(value, str | int) and value != ""
                if SECRET_KEY.search(str(key)) and literal and not names_a_secret:
                    found.append(f"{where}.{key} has a literal value")
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}[{i}]")

    for name, manifest in manifests.items():
        walk(manifest, name)
    if manifests["values.yaml"].get("generatePostgresqlPasswordSecret") is not False:
        found.append("values.yaml: the chart would generate the password Secret from values")
    head = manifests["raycluster.yaml"]["spec"]["headGroupSpec"]
    if head["rayStartParams"].get("dashboard-host") not in LOCALHOST:
        found.append("raycluster.yaml: the Ray dashboard binds beyond loopback")
    return found


def _manifests() -> dict[str, Any]:
    return {path.name: _load(path.name) for path in sorted(K8S.glob("*.yaml"))}


def test_no_default_password_and_a_loopback_ray_dashboard() -> None:
    manifests = _manifests()
    assert exposure_problems(manifests) == []
    for container in _ray_containers():  # nothing publishes the dashboard's port either
        assert 8265 not in [port["containerPort"] for port in container.get("ports", [])]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda m: m["values.yaml"]["postgresql"].update(postgresqlPassword="x"), "literal"),
        (lambda m: m["values.yaml"].update(generatePostgresqlPasswordSecret=True), "generate"),
        (lambda m: m["values.yaml"].pop("generatePostgresqlPasswordSecret"), "generate"),
        (
            lambda m: m["raycluster.yaml"]["spec"]["headGroupSpec"]["rayStartParams"].update(
                {"dashboard-host": "0.0.0.0"}
            ),
            "dashboard binds",
        ),
        (
            lambda m: m["raycluster.yaml"]["spec"]["headGroupSpec"]["rayStartParams"].pop(
                "dashboard-host"
            ),
            "dashboard binds",
        ),
    ],
)
def test_a_default_password_or_open_dashboard_is_caught(edit: Any, problem: str) -> None:
    manifests = _manifests()
    edit(manifests)
    assert any(problem in found for found in exposure_problems(manifests))


def _mount_of(path: str) -> dict[str, Any]:
    """The volume mount of the user-code pods that holds ``path``."""
    mounts = _user_code()["volumeMounts"]
    (mount,) = [m for m in mounts if path.startswith(m["mountPath"].rstrip("/") + "/")]
    return mount


def test_trust_root_and_signing_key_outlive_every_pod_outside_the_data_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the S3 CAS the home may be a per-pod emptyDir: a key pair made there would differ in
    every run pod (each new key refused by the alias pin), and a trust file there would vanish
    or be writable by whoever writes the home. Both come from volumes of their own."""
    env = {item["name"]: item["value"] for item in _user_code()["env"]}
    volumes = {volume["name"]: volume for volume in _user_code()["volumes"]}
    home = Path(env["CORPUS_HOME"])
    trust, key = env[TRUST_ENV], env[KEY_ENV]
    for path in (trust, key):
        assert not Path(path).is_relative_to(home), path
    trust_mount, key_mount = _mount_of(trust), _mount_of(key)
    assert trust_mount["name"] != key_mount["name"] != "corpus-home"
    assert "persistentVolumeClaim" in volumes[trust_mount["name"]]
    assert not trust_mount.get("readOnly")  # a build records its signing key on first use
    assert key_mount.get("readOnly") and "secret" in volumes[key_mount["name"]]
    monkeypatch.setenv(TRUST_ENV, trust)  # the real resolution accepts the recipe's placement
    assert trust_file(home) == Path(trust)
    monkeypatch.setenv(TRUST_ENV, str(home / "trust.json"))
    with pytest.raises(TrustRootError, match="inside the data home"):
        trust_file(home)
