"""deploy/k8s/ without a cluster: every object validates against the Kubernetes API's JSON schemas (strict: no
unknown field), and the manifests agree with voicepipe (their settings load, probes on /ready and /health, a grace
period longer than the drain, an autoscaler on a metric voicepipe exports)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml

from voicepipe.config import REPO_ROOT, load_settings
from voicepipe.observability.metrics import Metrics

K8S_DIR = REPO_ROOT / "deploy" / "k8s"
K8S_VERSION = "1.37.0"
MANIFESTS = sorted(K8S_DIR.glob("*.yaml"))
VARIANTS = ("voicepipe.yaml", "gpu.yaml", "vllm.yaml")  # each a Deployment "voicepipe" with its ConfigMap


def objects(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_the_manifests_are_there() -> None:
    assert {p.name for p in MANIFESTS} >= {*VARIANTS, "service.yaml", "hpa.yaml", "store.example.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_object_validates_against_the_kubernetes_schemas(path: Path) -> None:
    for obj in objects(path):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def deployment_of(path: Path, name: str = "voicepipe") -> tuple[dict, dict]:
    """The Deployment ``name`` and its container of the same name."""
    (deployment,) = [o for o in objects(path) if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return deployment, container


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_loads_as_voicepipe_settings_and_drains_within_its_grace_period(variant: str, monkeypatch,
                                                                                      tmp_path: Path) -> None:
    path = K8S_DIR / variant
    deployment, container = deployment_of(path)
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (config_map,) = [o for o in objects(path) if o["kind"] == "ConfigMap"
                     and o["metadata"]["name"] == volume["configMap"]["name"]]
    config_path = Path(env.pop("VOICEPIPE_CONFIG"))
    assert config_path.parent == Path(mount["mountPath"]) and config_path.name in config_map["data"]
    toml_file = tmp_path / "voicepipe.toml"
    toml_file.write_text(config_map["data"][config_path.name])
    for name, value in env.items():  # the literal env values; those from the downward API or a Secret are unset
        if value is not None:
            monkeypatch.setenv(name, value)
    settings = load_settings(toml_file)  # unknown keys or bad values would raise here

    port = container["ports"][0]
    assert port["containerPort"] == settings.server.port and settings.server.host == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": port["name"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": port["name"]}
    assert pod["terminationGracePeriodSeconds"] > settings.server.drain_timeout_s > 0
    assert settings.calls.max_concurrent is not None
    assert {"VOICEPIPE_OBSERVABILITY__STORE_URL", "VOICEPIPE_OBSERVABILITY__REPLICA"} <= {e["name"] for e in
                                                                                         container["env"]}
    if variant == "gpu.yaml":
        assert settings.device.device == "cuda" and container["resources"]["limits"]["nvidia.com/gpu"] == 1
    if variant == "vllm.yaml":
        assert settings.llm.backend == "openai"
        url = urlparse(settings.llm.base_url)
        service = [o for o in objects(path) if o["kind"] == "Service" and o["metadata"]["name"] == url.hostname]
        assert service and service[0]["spec"]["ports"][0]["port"] == url.port
        _, vllm = deployment_of(path, "vllm")
        assert "--enable-prefix-caching" in vllm["args"] and "--enable-prompt-tokens-details" in vllm["args"]
        assert settings.llm.model in vllm["args"]


def test_the_autoscaler_scales_the_deployment_on_a_metric_voicepipe_exports() -> None:
    (hpa,) = [o for o in objects(K8S_DIR / "hpa.yaml") if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "voicepipe"}
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    exported = {family.name for family in Metrics().registry.collect()}
    assert name in exported
    (rules,) = [o for o in objects(K8S_DIR / "hpa.yaml") if o["kind"] == "ConfigMap"]
    (rule,) = yaml.safe_load(rules["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith(name) and rule["name"]["as"] == name
    max_calls = min(tomllib.loads(o["data"]["voicepipe.toml"])["calls"]["max_concurrent"]
                    for v in VARIANTS for o in objects(K8S_DIR / v) if o["kind"] == "ConfigMap")
    assert float(metric["pods"]["target"]["averageValue"]) < max_calls  # scale out before pods refuse calls


def test_the_service_and_the_disruption_budget_select_the_voicepipe_pods() -> None:
    labels = deployment_of(K8S_DIR / "voicepipe.yaml")[0]["spec"]["template"]["metadata"]["labels"]
    for obj in objects(K8S_DIR / "service.yaml"):
        selector = obj["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= labels.items(), obj["kind"]
