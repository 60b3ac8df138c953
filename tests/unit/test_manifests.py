"""Deployment files are checked the way their consumers would check them, without a cluster.

* configs/kuberay/*.yaml (RayService manifests): the whole object against the RayService
  CRD's openAPIV3Schema (from ../shared/kuberay, never copied into the repo), with unknown
  fields refused as `kubectl apply` (strict field validation) refuses them; then
  serveConfigV2 against Ray Serve's own ServeDeploySchema (plus a check for unknown keys,
  which Serve's pydantic models silently drop); then every application is built from its
  `args` exactly as the Serve controller would build it: app.rayserve.builder.config_from_args,
  build_from_config, and Serve's graph builder. Building binds deployments only: no Ray
  cluster is started (a fixture turns Ray's auto-init off and checks) and no engine loads.
* configs/*.yaml: app configs load with load_config; Serve config files (those with
  `applications`) validate and build like serveConfigV2.
* The shapes the docs promise: GPU engines ask one GPU and fit a GPU pod, the head has
  num-cpus "0", probes on every Ray container, API keys only from a Secret, no Service
  beyond ClusterIP, inline configs equal to the config files they copy.
* Negative cases: a misspelled key in the inline config, a bad field in the spec, an
  unknown key in serveConfigV2 and an override of a deployment that does not exist all fail.

Not checked here: the CRD's CEL rules (x-kubernetes-validations), and anything the
operator or Ray only find out at run time (images, scheduling, model downloads).
Building uses two private Ray Serve pieces, as the controller does (the graph builder and
DeploymentConfig); ray[serve] is pinned in pyproject.toml.
"""

from __future__ import annotations

import copy
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from jsonschema import Draft7Validator
from pydantic import BaseModel
from ray.serve._private.build_app import BuiltApplication
from ray.serve._private.build_app import build_app as serve_build_app
from ray.serve._private.config import DeploymentConfig
from ray.serve.schema import ServeDeploySchema

from app.cli.local_cluster import INGRESS_RESOURCE
from app.config.app_config import AppConfig, load_config
from app.config.common import ConfigError
from app.rayserve.builder import (
    INGRESS_NAME,
    build_from_config,
    colocated,
    config_from_args,
    engine_deployment_name,
    ingress_deployment_name,
)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
CRD_PATH = REPO.parent / "shared" / "kuberay" / "ray.io_rayservices.yaml"
MANIFESTS = sorted((CONFIGS / "kuberay").glob("*.yaml"))
# Which config file each manifest's inline config copies.
INLINE_CONFIG_SOURCE = {"rayservice-gpu.yaml": "gpu.yaml", "rayservice-cpu.yaml": "cpu.yaml"}
SERVE_PORT = 8000
BUILDER_IMPORT_PATH = "app.rayserve.builder:build_app"
# Deployment options Serve applies to the replica config rather than the deployment config.
REPLICA_OPTIONS = ("ray_actor_options", "placement_group_bundles", "placement_group_strategy", "max_replicas_per_node",
                   "placement_group_bundle_label_selector", "placement_group_fallback_strategy")


# -- loading -----------------------------------------------------------------------------


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _manifest(name: str) -> dict:
    return _load(CONFIGS / "kuberay" / name)


def _ray_containers(manifest: dict) -> list[tuple[str, dict, dict]]:
    """(group name, group spec, Ray container) for the head and every worker group; the Ray container is the first."""
    cluster = manifest["spec"]["rayClusterConfig"]
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
    return [(name, group, group["template"]["spec"]["containers"][0]) for name, group in groups]


def _quantity(value: Any) -> float:
    """A Kubernetes quantity as a number: '500m' -> 0.5, '4' -> 4, 2 -> 2 (only what CPU/GPU counts need)."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _ray_resources(group: dict, container: dict) -> dict[str, float]:
    """What Ray advertises for a pod of this group: rayStartParams first, else the container limits (as KubeRay
    does)."""
    params = group.get("rayStartParams") or {}
    limits = (container.get("resources") or {}).get("limits") or {}
    cpus = params.get("num-cpus", limits.get("cpu", 0))
    gpus = params.get("num-gpus", limits.get("nvidia.com/gpu", 0))
    return {"CPU": _quantity(cpus), "GPU": _quantity(gpus)}


# -- the CRD -----------------------------------------------------------------------------


def _to_jsonschema(node: Any) -> Any:
    """A Kubernetes structural schema as JSON Schema draft 7.

    x-kubernetes-int-or-string becomes int-or-string (a pattern binds the string only);
    nullable adds null; objects with properties refuse unknown keys unless they preserve
    them (what strict field validation does); other x-kubernetes-* keys are dropped.
    """
    if isinstance(node, list):
        return [_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: _to_jsonschema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not"):
            out[key] = _to_jsonschema(value)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        string = {"type": "string"}
        if "pattern" in out:
            string["pattern"] = out.pop("pattern")
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, string]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    open_ended = node.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and "additionalProperties" not in out and not open_ended:
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def crd_validator() -> Draft7Validator:
    if not CRD_PATH.exists():
        pytest.skip(f"the RayService CRD is not at {CRD_PATH} (it lives in ../shared/kuberay next to the repository)")
    crd = _load(CRD_PATH)
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == "RayService"
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _to_jsonschema(version["schema"]["openAPIV3Schema"])
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def crd_errors(validator: Draft7Validator, manifest: dict) -> list[str]:
    errors = []
    if manifest.get("apiVersion") != "ray.io/v1":
        errors.append(f"apiVersion: {manifest.get('apiVersion')!r}, expected 'ray.io/v1'")
    if manifest.get("kind") != "RayService":
        errors.append(f"kind: {manifest.get('kind')!r}, expected 'RayService'")
    name = (manifest.get("metadata") or {}).get("name", "")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", name):
        errors.append(f"metadata.name: {name!r} is not a short DNS label (it prefixes the Services' names)")
    for err in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        errors.append(f"{where}: {err.message}")
    return errors


# -- Ray Serve configs ---------------------------------------------------------------------


def _model_classes(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation admits: X, Optional[X], Union[dict, X], List[X]."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in _model_classes(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def unknown_keys(data: Any, model: type[BaseModel], where: str = "") -> list[str]:
    """Keys pydantic would silently ignore (Serve's schemas allow extras), recursively."""
    if not isinstance(data, dict):
        return []
    fields = {f.alias or name: f for name, f in model.model_fields.items()} | dict(model.model_fields)
    found = []
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            found.append(f"{path}: not a {model.__name__} key")
            continue
        for sub in _model_classes(fields[key].annotation):
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                found += unknown_keys(item, sub, f"{path}[{i}]" if isinstance(value, list) else path)
    return found


def parse_serve_config(data: Any) -> ServeDeploySchema:
    problems = unknown_keys(data, ServeDeploySchema)
    assert not problems, "unknown keys in the Serve config:\n  " + "\n  ".join(problems)
    return ServeDeploySchema.model_validate(data)


def build_application(app_schema) -> tuple[AppConfig, BuiltApplication]:
    """What the Serve controller's build task does with one application, short of deploying it."""
    assert app_schema.import_path == BUILDER_IMPORT_PATH, f"{app_schema.name}: import_path {app_schema.import_path!r}"
    config = config_from_args(app_schema.args)
    built = serve_build_app(build_from_config(config), name=app_schema.name)
    built.validate_single_fastapi_ingress()
    assert built.ingress_deployment_name == ingress_deployment_name(config)
    deployments = {d.name: d for d in built.deployments}
    # Overrides in the config file, applied as Serve applies them (application_state.override_deployment_info).
    for override in app_schema.model_dump(exclude_unset=True).get("deployments", []):
        name = override.pop("name")
        assert name in deployments, \
            f"{app_schema.name}: override for deployment {name!r}, which does not exist; have {sorted(deployments)}"
        for replica_option in REPLICA_OPTIONS:  # these go to the replica config, not the deployment config
            override.pop(replica_option, None)
        options = deployments[name]._deployment_config.model_dump()
        options.update(override)
        DeploymentConfig(**options)
    return config, built


@pytest.fixture(autouse=True)
def no_ray_cluster(monkeypatch):
    """Nothing here may start Ray: building an application binds deployments only."""
    from ray._private import auto_init_hook

    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", False)
    was_up = ray.is_initialized()
    yield
    assert ray.is_initialized() == was_up, "a test started Ray"


def _engine_deployments(config: AppConfig, built: BuiltApplication) -> dict[str, Any]:
    by_name = {d.name: d for d in built.deployments}
    return {m.id: by_name[engine_deployment_name(m.id)] for m in config.models}


def _max_replicas(app_schema, deployment) -> int:
    """The most replicas a deployment may run: autoscaling's max_replicas where the Serve config's override or the
    service's config (`deployment.autoscaling`) sets it."""
    for override in app_schema.model_dump(exclude_unset=True).get("deployments", []):
        if override["name"] == deployment.name and override.get("autoscaling_config"):
            return override["autoscaling_config"]["max_replicas"]
        if override["name"] == deployment.name and override.get("num_replicas"):
            return override["num_replicas"]
    scaling = deployment._deployment_config.autoscaling_config
    return scaling.max_replicas if scaling is not None else deployment.num_replicas


def _replica_count_aside(config: AppConfig) -> AppConfig:
    """`config` with every model's replica count (num_replicas, autoscaling) at its default."""
    def aside(m):
        return m.model_copy(update={"deployment": m.deployment.model_copy(update={"num_replicas": 1,
                                                                                   "autoscaling": None})})
    return config.model_copy(update={"models": tuple(aside(m) for m in config.models)})


# -- RayService manifests ------------------------------------------------------------------


def test_manifests_exist():
    assert {m.name for m in MANIFESTS} >= set(INLINE_CONFIG_SOURCE), MANIFESTS


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_the_crd(path, crd_validator):
    errors = crd_errors(crd_validator, _load(path))
    assert not errors, f"{path.name} does not match the RayService CRD:\n  " + "\n  ".join(errors)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_serve_config_builds(path):
    manifest = _load(path)
    serve_config = parse_serve_config(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    assert serve_config.http_options.host == "0.0.0.0", "inside a pod the proxy must listen on the pod's address"
    assert serve_config.http_options.port == SERVE_PORT
    assert [a.route_prefix for a in serve_config.applications] == ["/"]
    for app_schema in serve_config.applications:
        config, built = build_application(app_schema)
        assert path.name in INLINE_CONFIG_SOURCE, f"say which configs/*.yaml {path.name} copies in INLINE_CONFIG_SOURCE"
        source = CONFIGS / INLINE_CONFIG_SOURCE[path.name]
        # The intended differences: on a cluster the ingress tier holds the connections (retries across replicas),
        # and each manifest chooses its replica count (fixed, or autoscaling bounds).
        local = load_config(source)
        expected = local.model_copy(update={"service": local.service.model_copy(update={"colocate_ingress": False})})
        assert _replica_count_aside(config) == _replica_count_aside(expected), \
            f"{path.name}: the inline config drifted from {source.name}; make them equal again (but colocate_ingress " \
            "and the replica count)"
        assert not colocated(config)
        # Every engine replica (and the ingress) fits in some pod, and the groups' upper bounds hold the most
        # replicas asked for.
        groups = [(_ray_resources(group, container), group.get("maxReplicas", 1))
                  for _, group, container in _ray_containers(manifest)]
        for deployment in built.deployments:
            options = deployment.ray_actor_options
            need = {"CPU": options.get("num_cpus", 1), "GPU": options.get("num_gpus", 0)}
            slots = [min((have[r] // need[r]) if need[r] else math.inf for r in need) for have, _ in groups]
            assert any(s >= 1 for s in slots), f"{path.name}: a {deployment.name} replica needs {need}; no pod has that"
            if deployment.name != INGRESS_NAME:  # a separate ingress (several models) has one replica
                capacity = sum(s * most for s, (_, most) in zip(slots, groups, strict=True) if s != math.inf)
                wanted = _max_replicas(app_schema, deployment)
                assert capacity >= wanted, \
                    f"{path.name}: {deployment.name} may run {wanted} replicas; the worker groups hold {capacity}"


def test_gpu_manifest_shape():
    manifest = _manifest("rayservice-gpu.yaml")
    cluster = manifest["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    head_container = head["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in str(head_container.get("resources", {})), "the head needs no GPU"
    assert cluster["enableInTreeAutoscaling"] is True
    gpu_groups = [g for g in cluster["workerGroupSpecs"]
                  if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]]
    assert gpu_groups, "no worker group asks for nvidia.com/gpu"
    for group in gpu_groups:
        resources = group["template"]["spec"]["containers"][0]["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == 1 and resources["requests"]["nvidia.com/gpu"] == 1
        assert 1 <= group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
    serve_config = parse_serve_config(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    for app_schema in serve_config.applications:
        config, built = build_application(app_schema)
        for model_id, deployment in _engine_deployments(config, built).items():
            assert deployment.ray_actor_options["num_gpus"] == 1, model_id
            assert config.model(model_id).engine.tensor_parallel_size == 1
        ingress = next(d for d in built.deployments if d.name == ingress_deployment_name(config))
        if colocated(config):  # the engine replicas answer HTTP themselves
            assert ingress.ray_actor_options["num_gpus"] == 1
        else:
            assert ingress.ray_actor_options.get("num_gpus", 0) == 0


def test_cpu_manifest_runs_the_default_model_on_cpu_workers():
    manifest = _manifest("rayservice-cpu.yaml")
    assert manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert "nvidia.com/gpu" not in str(manifest["spec"]["rayClusterConfig"])
    serve_config = parse_serve_config(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    for app_schema in serve_config.applications:
        config, built = build_application(app_schema)
        assert [m.source for m in config.models] == ["default"]
        assert all(d.ray_actor_options.get("num_gpus", 0) == 0 for d in built.deployments)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_keeps_ray_private_and_pods_healthy(path):
    manifest = _load(path)
    spec = manifest["spec"]
    cluster = spec["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    # Nothing but the cluster may reach the dashboard, GCS or Ray client ports.
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert not head.get("enableIngress", False)
    assert (spec.get("serveService") or {}).get("spec", {}).get("type", "ClusterIP") == "ClusterIP"
    assert ((head.get("headService") or {}).get("spec") or {}).get("type", "ClusterIP") == "ClusterIP"
    assert (cluster.get("authOptions") or {}).get("mode") == "token"
    # The Ray version the operator is told is the one the image installs.
    pin = re.search(r'"ray\[serve\]==([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert pin and cluster["rayVersion"] == pin.group(1) == ray.__version__
    images = set()
    for name, group, container in _ray_containers(manifest):
        images.add(container["image"])
        pod = group["template"]["spec"]
        assert (pod.get("securityContext") or {}).get("runAsNonRoot") is True, f"{name}: pods must run as non-root"
        assert container.get("readinessProbe") and container.get("livenessProbe"), \
            f"{name}: readiness and liveness probes"
        assert {"name": "serve", "containerPort": SERVE_PORT} in [
            {k: p.get(k) for k in ("name", "containerPort")} for p in container.get("ports", [])
        ], f"{name}: KubeRay finds the Serve port by the name 'serve'"
        env = {e["name"]: e for e in container.get("env", [])}
        assert "APP_API_KEYS" in env, f"{name}: the ingress may run on any node; every node needs the keys"
        keys = env["APP_API_KEYS"]
        assert "value" not in keys and keys["valueFrom"]["secretKeyRef"], f"{name}: keys only from a Secret"
    assert len(images) == 1, f"every node must run the same image (same Ray, Python and app code): {images}"
    suffix = "-gpu" if "nvidia.com/gpu" in str(cluster) else "-cpu"
    assert images.pop().endswith(suffix)


# -- negative cases: broken manifests must fail --------------------------------------------


def _break_spec(manifest: dict, how: str) -> dict:
    broken = copy.deepcopy(manifest)
    cluster = broken["spec"]["rayClusterConfig"]
    worker = cluster["workerGroupSpecs"][0]
    if how == "misspelled-field":
        worker["maxReplica"] = worker.pop("maxReplicas")
    elif how == "int-rayStartParam":
        cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    elif how == "string-replicas":
        worker["minReplicas"] = "1"
    elif how == "bad-enum":
        cluster["autoscalerOptions"]["upscalingMode"] = "Fast"
    elif how == "missing-template":
        del cluster["headGroupSpec"]["template"]
    elif how == "misspelled-container-field":
        worker["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    elif how == "bad-quantity":
        worker["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "8 GB"
    return broken


@pytest.mark.parametrize("how, expected", [
    ("misspelled-field", "'maxReplica' was unexpected"),
    ("int-rayStartParam", "rayStartParams.num-cpus: 0 is not of type 'string'"),
    ("string-replicas", "minReplicas: '1' is not of type 'integer'"),
    ("bad-enum", "upscalingMode: 'Fast' is not one of"),
    ("missing-template", "'template' is a required property"),
    ("misspelled-container-field", "'imagePullPolicyy' was unexpected"),
    ("bad-quantity", "limits.memory: '8 GB' is not valid"),
])
def test_broken_spec_fails_the_crd(how, expected, crd_validator):
    manifest = _manifest("rayservice-gpu.yaml")
    assert not crd_errors(crd_validator, manifest)
    errors = crd_errors(crd_validator, _break_spec(manifest, how))
    assert any(expected in e for e in errors), errors


def _serve_config(name: str) -> dict:
    return yaml.safe_load(_manifest(name)["spec"]["serveConfigV2"])


def test_misspelled_inline_config_key_fails():
    data = _serve_config("rayservice-gpu.yaml")
    engine = data["applications"][0]["args"]["config"]["models"][0]["engine"]
    engine["max_model_length"] = engine.pop("max_model_len")
    app_schema = parse_serve_config(data).applications[0]  # Serve cannot see into args
    with pytest.raises(ConfigError, match=r"models\.0\.engine\.max_model_length: unknown key"):
        build_application(app_schema)


def test_unknown_serve_config_key_fails():
    data = _serve_config("rayservice-cpu.yaml")
    data["applications"][0]["route_prefx"] = "/v2"
    ServeDeploySchema.model_validate(data)  # Serve alone would drop the key without a word
    with pytest.raises(AssertionError, match="route_prefx"):
        parse_serve_config(data)
    data = _serve_config("rayservice-gpu.yaml")
    data["applications"][0]["deployments"][0]["max_surge_percnt"] = 25
    with pytest.raises(AssertionError, match="max_surge_percnt"):
        parse_serve_config(data)


def test_override_of_a_missing_deployment_fails():
    data = _serve_config("rayservice-gpu.yaml")
    data["applications"][0]["deployments"][0]["name"] = "engine-llama"
    with pytest.raises(AssertionError, match="engine-llama"):
        build_application(parse_serve_config(data).applications[0])


def test_override_that_serve_rejects_fails():
    data = _serve_config("rayservice-gpu.yaml")
    data["applications"][0]["deployments"][0].update(  # both: Serve refuses it
        num_replicas=2, autoscaling_config={"min_replicas": 1, "max_replicas": 2})
    with pytest.raises(Exception, match="num_replicas"):
        parse_serve_config(data)


# -- configs/*.yaml --------------------------------------------------------------------------


CONFIG_FILES = sorted(CONFIGS.glob("*.yaml"))


def _is_serve_config(path: Path) -> bool:
    data = _load(path)
    return isinstance(data, dict) and "applications" in data


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_config_file_is_valid(path, monkeypatch):
    if _is_serve_config(path):
        monkeypatch.chdir(REPO)  # `serve run configs/...` runs from the repository root; config_path is relative to it
        serve_config = parse_serve_config(_load(path))
        for app_schema in serve_config.applications:
            build_application(app_schema)
    else:
        config = load_config(path)
        build_from_config(config)


def test_serve_cpu_config():
    serve_config = parse_serve_config(_load(CONFIGS / "serve-cpu.yaml"))
    assert serve_config.http_options.host == "127.0.0.1" and serve_config.http_options.port == SERVE_PORT
    [app_schema] = serve_config.applications
    assert (app_schema.name, app_schema.route_prefix, app_schema.import_path) == ("llm", "/", BUILDER_IMPORT_PATH)
    assert app_schema.args == {"config_path": "configs/cpu.yaml"}


def test_gpu_config():
    config = load_config(CONFIGS / "gpu.yaml")
    [model] = config.models
    assert model.on_gpu and model.deployment.num_gpus == 1
    assert model.engine.gpu_memory_utilization == 0.90 and model.engine.enforce_eager is False
    assert model.engine.kv_cache_gib is None and model.engine.max_model_len == 8192
    assert config.service.host == "127.0.0.1"


@pytest.mark.parametrize("base", ["cpu.yaml", "gpu.yaml"])
def test_container_config_differs_only_in_host(base):
    path = CONFIGS / f"container-{base}"
    if not path.exists():
        pytest.skip(f"no {path.name}")
    container = load_config(path)
    assert container.service.host == "0.0.0.0", "a container must listen beyond its own loopback"
    loopback = container.model_copy(update={"service": container.service.model_copy(update={"host": "127.0.0.1"})})
    assert loopback == load_config(CONFIGS / base), f"{path.name} drifted from {base}"


DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile*"))


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_serves_a_valid_config(path):
    """The images cannot be built here; at least what they point at must exist and be right."""
    text = path.read_text()
    cmd = re.search(r"^CMD\s+(\[.*\])\s*$", text, re.MULTILINE)
    assert cmd, "CMD in exec form"
    args = yaml.safe_load(cmd.group(1))
    config_path = args[args.index("--config") + 1]
    assert load_config(REPO / config_path).service.host == "0.0.0.0"
    assert re.search(r"^EXPOSE\s+8000\b", text, re.MULTILINE)
    assert re.search(r"^HEALTHCHECK\b.*(\n\s+.*)*?/health\b", text, re.MULTILINE)
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"


def test_gpu_manifest_engine_arguments_are_vllms_own():
    """As far as a CPU machine goes: vLLM's own engine arguments for the GPU manifest's model, constructed (and
    checked by vLLM's dataclass) without starting an engine or reading the model."""
    from app.engine.cpu.precision import resolve_cpu_precision
    from app.engine.vllm.to_vllm import engine_args

    serve_config = parse_serve_config(yaml.safe_load(_manifest("rayservice-gpu.yaml")["spec"]["serveConfigV2"]))
    for app_schema in serve_config.applications:
        config, _ = build_application(app_schema)
        for model in config.models:
            choice = resolve_cpu_precision(model.engine.dtype, on_gpu=model.on_gpu)
            args = engine_args(model, choice.dtype)
            assert model.on_gpu and args.model == model.source and args.served_model_name == model.id
            assert (args.dtype, args.enforce_eager) == ("bfloat16", False)
            assert args.gpu_memory_utilization == model.engine.gpu_memory_utilization == 0.90
            assert args.tensor_parallel_size == 1 and args.max_model_len == model.engine.max_model_len


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_clients_reach_the_head_only_so_a_lost_worker_cuts_no_connection(path):
    """The node-loss topology (docs/kuberay.md): the head's Serve proxy alone takes clients, the ingress tier
    runs beside it (the head's `ingress` resource, which app/cli/local_cluster.py's head offers too), and the worker
    pods run engines only, ready by Ray's own agent (no proxy there to probe)."""
    manifest = _load(path)
    spec = manifest["spec"]
    assert spec.get("excludeHeadPodFromServeSvc") is False, "the head's proxy is the one clients reach"
    serve_config = parse_serve_config(yaml.safe_load(spec["serveConfigV2"]))
    assert serve_config.proxy_location == "HeadOnly"
    head = spec["rayClusterConfig"]["headGroupSpec"]
    offered = json.loads(json.loads(head["rayStartParams"]["resources"]))
    assert offered.get(INGRESS_RESOURCE, 0) > 0, "the head offers the ingress resource"
    for app_schema in serve_config.applications:
        config, built = build_application(app_schema)
        assert not colocated(config)
        assert any(d.name == INGRESS_NAME for d in built.deployments)
        override = next(d for d in app_schema.deployments if d.name == INGRESS_NAME)  # what Serve applies over the code
        options = override.ray_actor_options
        options = options if isinstance(options, dict) else options.dict(exclude_unset=True)
        asked = (options.get("resources") or {}).get(INGRESS_RESOURCE, 0)
        assert 0 < asked * override.num_replicas <= offered[INGRESS_RESOURCE], \
            "the ingress asks for the head's resource, a share small enough for all its replicas"
        assert options.get("num_cpus") == 0
    for name, _group, container in _ray_containers(manifest):
        if name != "head":
            probe = container["readinessProbe"]["httpGet"]
            assert probe["port"] != SERVE_PORT, f"{name}: no Serve proxy on a worker pod to probe"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_a_rolling_update_starts_new_replicas_before_it_stops_old_ones_and_they_have_room(path):
    """Serve's default rollout stops an old replica before it starts its replacement: with two replicas, one carried
    everything for an engine's start (the chaos run of 2026-12-02 01:11 refused 1,070 requests by time). The
    manifests surge instead (`max_surge_percent`), and the surge needs room: an engine pod more than the most
    replicas within the worker group's maxReplicas (else the update waits forever, old replicas serving), and the
    head's ingress resource for every ingress replica twice over."""
    manifest = _load(path)
    spec = manifest["spec"]
    serve_config = parse_serve_config(yaml.safe_load(spec["serveConfigV2"]))
    offered = json.loads(json.loads(spec["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["resources"]))
    pods = max(g["maxReplicas"] for g in spec["rayClusterConfig"]["workerGroupSpecs"])
    for app_schema in serve_config.applications:
        config, built = build_application(app_schema)
        overrides = {d.name: d for d in app_schema.deployments}
        for deployment in _engine_deployments(config, built).values():
            surge_percent = overrides[deployment.name].max_surge_percent
            assert isinstance(surge_percent, int) and surge_percent > 0, f"{deployment.name}: no surge"
            most = _max_replicas(app_schema, deployment)
            surge = -(-surge_percent * most // 100)
            assert most + surge <= pods, f"{deployment.name}: {most} replicas + {surge} surge > {pods} pods"
        ingress = overrides[INGRESS_NAME]
        assert ingress.max_surge_percent == 100
        options = ingress.ray_actor_options
        options = options if isinstance(options, dict) else options.dict(exclude_unset=True)
        assert 2 * ingress.num_replicas * options["resources"][INGRESS_RESOURCE] <= offered[INGRESS_RESOURCE]


def test_the_gpu_manifest_scales_engines_with_the_service_s_policy_within_its_pods():
    app_schema = parse_serve_config(_serve_config("rayservice-gpu.yaml")).applications[0]
    config, built = build_application(app_schema)
    (engine,) = _engine_deployments(config, built).values()
    scaling = engine._deployment_config.autoscaling_config
    assert scaling.policy.policy_function == "app.scaling.serve_policy:TokenDemandPolicy"
    assert (scaling.min_replicas, scaling.max_replicas, scaling.downscale_delay_s) == (1, 4, 600)
    gpu_group = next(g for g in _load(MANIFESTS[0].parent / "rayservice-gpu.yaml")["spec"]["rayClusterConfig"][
        "workerGroupSpecs"])
    assert gpu_group["maxReplicas"] >= scaling.max_replicas + 1  # and the rolling update's surge
