"""The container image and the Kubernetes manifests, checked without a Docker engine or a
cluster: the Dockerfile is linted (hadolint) and every path it copies exists; the image's
contents are staged with the same script the Dockerfile runs (scripts/package.sh) and the staged
server must run from there alone; the kustomizations render (kubectl kustomize), the core kinds
validate against the Kubernetes schemas (kubernetes-validate, strict), the custom resources
(KEDA, KServe) carry what they need, everything passes yamllint, and the numbers that must agree
(drain timings, ports, probe services, metric names) agree."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from conftest import BIN_DIR, ROOT, free_port, start_server

VENV_BIN = os.path.join(ROOT, ".venv", "bin")
DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
K8S = os.path.join(ROOT, "deploy", "k8s")
KUSTOMIZATIONS = ["base", "overlays/production", "overlays/example-models", "overlays/tls", "overlays/http-probes",
                  "overlays/shm-sidecar", "overlays/cpu-dedicated", "kserve"]
KUBERNETES_VERSION = "1.32.0"


def run(*args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)


# ---- container image ---------------------------------------------------------------------------

def dockerfile_instructions():
    """(instruction, arguments) per logical line, continuation lines joined."""
    text = open(DOCKERFILE).read().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


def test_dockerfile_passes_hadolint():
    result = run(os.path.join(VENV_BIN, "hadolint"), DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_path_the_dockerfile_copies_exists_and_is_not_ignored():
    ignored = [line.strip() for line in open(os.path.join(ROOT, ".dockerignore"))
               if line.strip() and not line.startswith("#")]
    copied = []
    for instruction, rest in dockerfile_instructions():
        if instruction != "COPY" or "--from=" in rest:
            continue
        sources = shlex.split(rest)[:-1]
        copied += sources
        for source in sources:
            assert os.path.exists(os.path.join(ROOT, source)), f"COPY {source}: no such path"
            assert source.rstrip("/") not in ignored, f"COPY {source} is excluded by .dockerignore"
    # The build stage copies the context whole: what it builds from must be in it, and what it
    # does not need (the tests, local build outputs) must not.
    assert "." in copied
    for needed in ("scripts", "server", "proto", "client", "models", "requirements.txt", "CMakeLists.txt"):
        assert needed not in ignored, f".dockerignore excludes {needed}, which the build needs"
    for unneeded in ("tests", ".venv", "build", ".git"):
        assert unneeded in ignored, f".dockerignore should leave out {unneeded}"
    runs = " ".join(rest for instruction, rest in dockerfile_instructions() if instruction == "RUN")
    for script in ("scripts/setup.sh", "scripts/build.sh", "scripts/package.sh"):
        assert script in runs


def test_runtime_stage_is_slim_non_root_and_healthchecked():
    text = open(DOCKERFILE).read()
    # BuildKit would pull the frontend a syntax line names from a registry.
    assert not re.search(r"^#\s*syntax\s*=", text, re.M)
    instructions = list(dockerfile_instructions())
    assert ("ARG", "BASE_IMAGE=debian:12-slim") in instructions
    stages = [rest for instruction, rest in instructions if instruction == "FROM"]
    # Both stages on the base users pull (and CI builds): the torch wheel brings CUDA and cuDNN.
    assert stages == ["${BASE_IMAGE} AS build", "${BASE_IMAGE} AS runtime"]
    runtime = instructions[[i for i, (ins, rest) in enumerate(instructions) if ins == "FROM"][1]:]
    by_instruction = {}
    for instruction, rest in runtime:
        by_instruction.setdefault(instruction, []).append(rest)
    assert by_instruction["USER"] == ["10001:10001"]
    assert "8000 8001 8002" in by_instruction["EXPOSE"]
    assert any("/models" in volume for volume in by_instruction["VOLUME"])
    assert "sluice-client" in by_instruction["HEALTHCHECK"][0] and "health" in by_instruction["HEALTHCHECK"][0]
    assert "${SLUICE_HEALTH_PORT}" in by_instruction["HEALTHCHECK"][0]
    # Only what the build stage staged, and no RUN after the large copy (it would copy it again).
    assert by_instruction["COPY"] == ["--from=build /image/ /"]
    order = [instruction for instruction, _ in runtime]
    assert order.index("RUN") < order.index("COPY") and order.count("RUN") == 1
    environment = " ".join(by_instruction["ENV"])
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in environment
    # Setting it would give every GPU to pods that asked for none where nvidia is the default runtime.
    assert "NVIDIA_VISIBLE_DEVICES" not in environment
    assert "HOME=/tmp" in environment  # read-only root file system: only /tmp is writable
    # The proxy CA reaches the build stage only.
    build = instructions[:[i for i, (ins, rest) in enumerate(instructions) if ins == "FROM"][1]]
    assert any(ins == "COPY" and rest.startswith("docker/build-ca/") for ins, rest in build)
    assert not any("build-ca" in rest for _, rest in runtime)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """The image's /opt/sluice, staged by scripts/package.sh (torch and CUDA libraries linked)."""
    destination = tmp_path_factory.mktemp("package") / "sluice"
    result = run(os.path.join(ROOT, "scripts", "package.sh"), "--link", str(destination),
                 env={**os.environ, "SLUICE_BUILD_DIR": os.path.dirname(BIN_DIR)})
    assert result.returncode == 0, result.stdout + result.stderr
    return destination


def resolved_libraries(binary):
    result = run("ldd", str(binary), env={"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    libraries = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            libraries[parts[0]] = parts[2]
    return libraries


def test_package_is_self_contained_with_one_copy_of_each_library(package):
    for binary in ("sluice-server", "sluice-client"):
        libraries = resolved_libraries(package / "bin" / binary)
        assert "not" not in libraries.values(), f"{binary}: {libraries}"
        packaged = set(os.listdir(package / "lib"))
        for soname, path in libraries.items():
            assert ROOT not in path, f"{binary} loads {soname} from the source tree: {path}"
            # What the package holds must load from it, also as a dependency of a dependency (the
            # image has no other copy): a system copy found first here would hide a missing path.
            if soname in packaged:
                assert path.startswith(str(package)), f"{binary} loads {soname} from {path}, not the package"
        if binary == "sluice-server":
            for soname in ("libtorch_cuda.so", "libc10.so", "libcudnn.so.9", "libgrpc++.so.1.51"):
                assert any(s.startswith(soname.split(".so")[0]) for s in libraries), soname
            torch_paths = [p for s, p in libraries.items() if s.startswith(("libtorch", "libc10", "libcudnn"))]
            assert all(p.startswith(str(package)) for p in torch_paths), torch_paths
    sonames = {}
    for directory, _, files in os.walk(package):
        for name in files:
            if ".so" in name:
                sonames.setdefault(name, []).append(os.path.join(directory, name))
    duplicates = {name: paths for name, paths in sonames.items() if len(paths) > 1}
    assert duplicates == {}
    # The base image is a plain Debian: libcudart is the wheel's, beside the server's libraries.
    assert [os.path.relpath(path, package) for name, paths in sonames.items() if name.startswith("libcudart")
            for path in paths] == ["lib/libcudart.so.13"]
    assert [name for name in sonames if name.startswith("libcudnn.so")] == ["libcudnn.so.9"]


def test_packaged_server_loads_the_bundled_torchvision_operators_without_python(package):
    library = package / "lib" / "sluice" / "torchvision_ops.so"
    assert library.is_file() and not library.is_symlink()
    needed = run("readelf", "-d", str(library)).stdout
    assert "libtorch_python" not in needed and "libpython" not in needed and "RPATH" not in needed, needed
    result = run(str(package / "bin" / "sluice-server"), "--device", "cpu", "--print-env")
    lines = [line for line in result.stdout.splitlines() if line.startswith("operator library:")]
    assert lines == [f"operator library: {os.path.realpath(library)} (bundled torchvision): 12 operators in torchvision"], \
        result.stdout


def test_packaged_server_serves_the_example_models_and_the_tag_names_the_line_up(package):
    versions = dict(line.split("=", 1) for line in (package / "VERSIONS").read_text().split())
    tag = run(os.path.join(ROOT, "docker", "image-tag.sh"), str(package / "VERSIONS")).stdout.strip()
    assert tag == (f"sluice:{versions['sluice']}-torch{versions['torch']}-cuda{versions['cuda']}"
                   f"-cudnn{versions['cudnn']}")
    assert re.fullmatch(r"sluice:\d+\.\d+\.\d+-torch[\d.]+-cuda[\d.]+-cudnn[\d.]+", tag)

    port = free_port()
    clean = {"PATH": f"{package}/bin:/usr/bin:/bin", "HOME": "/tmp"}  # as the image's, no venv
    server = subprocess.Popen(["sluice-server", "--model-repository", str(package / "models"),
                               "--grpc-address", "127.0.0.1", "--grpc-port", str(port),
                               "--metrics-port", "0", "--device", "cpu"],
                              env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            health = run("sluice-client", "--url", f"127.0.0.1:{port}", "health", env=clean)
            if health.returncode == 0 or time.monotonic() > deadline or server.poll() is not None:
                break
            time.sleep(0.5)
        assert health.returncode == 0, health.stdout + health.stderr
        assert "ready: true" in health.stdout
        models = run("sluice-client", "--url", f"127.0.0.1:{port}", "models", env=clean).stdout
        assert "mlp\t1\tREADY" in models and "convnet\t1\tREADY" in models
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output


# ---- Kubernetes --------------------------------------------------------------------------------

def why_kubectl_cannot_render():
    """Why `kubectl kustomize` cannot render these kustomizations here, or "" when it can. They use
    `labels` and components, which need the kustomize of kubectl 1.22 or later (v4.2): Debian 12's
    kubectl (kubernetes-client) is 1.20 and PyPI has none, so on a fresh Debian 12 machine without
    Kubernetes' own packages the tests that need the renderings skip, saying so."""
    if shutil.which("kubectl") is None:
        return "no kubectl on the PATH"
    result = run("kubectl", "version", "--client", "-o", "json")
    try:
        version = json.loads(result.stdout)["clientVersion"]
        major, minor = int(version["major"]), int(re.sub(r"\D", "", version["minor"]))
    except (ValueError, KeyError, TypeError):
        return f"cannot read kubectl's version: {result.stdout.strip()[:200]} {result.stderr.strip()[:200]}"
    if (major, minor) < (1, 22):
        return f"kubectl {major}.{minor} is older than 1.22 (its kustomize lacks `labels` or components)"
    return ""


@pytest.fixture(scope="module")
def rendered():
    why = why_kubectl_cannot_render()
    if why:
        pytest.skip(f"kubectl kustomize cannot render the kustomizations here: {why}")
    documents = {}
    for kustomization in KUSTOMIZATIONS:
        result = run("kubectl", "kustomize", os.path.join(K8S, kustomization))
        assert result.returncode == 0, f"{kustomization}: {result.stderr}"
        documents[kustomization] = (result.stdout, [d for d in yaml.safe_load_all(result.stdout) if d])
    return documents


def one(documents, kind):
    found = [d for d in documents if d["kind"] == kind]
    assert len(found) == 1, f"{kind}: {len(found)}"
    return found[0]


def args_of(container):
    return dict(arg.lstrip("-").split("=", 1) for arg in container["args"] if "=" in arg)


def test_kustomizations_validate_against_the_kubernetes_schemas(rendered, tmp_path):
    for kustomization, (text, documents) in rendered.items():
        path = tmp_path / (kustomization.replace("/", "_") + ".yaml")
        path.write_text(text)
        result = run(os.path.join(VENV_BIN, "kubernetes-validate"), "--strict", "--quiet",
                     "-k", KUBERNETES_VERSION, str(path))
        assert result.returncode == 0, f"{kustomization}:\n{result.stdout}{result.stderr}"
        # Only the custom resources are allowed to be unknown to the schemas.
        for line in result.stdout.splitlines():
            assert re.search(r"Couldn't find schema for kind (ScaledObject|ServingRuntime|InferenceService) ", line), line


def test_yamllint_passes_on_sources_and_rendered_output(rendered, tmp_path):
    config = os.path.join(ROOT, "deploy", ".yamllint.yaml")
    files = [K8S]
    for kustomization, (text, _) in rendered.items():
        path = tmp_path / (kustomization.replace("/", "_") + ".yaml")
        path.write_text(text)
        files.append(str(path))
    result = run(os.path.join(VENV_BIN, "yamllint"), "-c", config, "--strict", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_deployment_drain_probes_and_security(rendered):
    documents = rendered["overlays/production"][1]
    deployment = one(documents, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = args_of(container)
    # The drain fits the grace period: preStop, then the server's delay and grace.
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = pre_stop + float(args["shutdown-delay-seconds"]) + float(args["shutdown-grace-seconds"])
    assert pod["terminationGracePeriodSeconds"] > drain
    assert float(args["shutdown-delay-seconds"]) > 0
    assert int(args["grpc-max-connection-age-ms"]) > 0
    # Native gRPC probes on the health service names the server answers for.
    grpc_port = {p["name"]: p["containerPort"] for p in container["ports"]}["grpc"]
    assert int(args["grpc-port"]) == grpc_port
    assert container["livenessProbe"]["grpc"] == {"port": grpc_port, "service": "live"}
    assert container["readinessProbe"]["grpc"] == {"port": grpc_port, "service": "ready"}
    assert container["startupProbe"]["grpc"] == {"port": grpc_port, "service": "ready"}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == int(args["metrics-port"])
    assert container["image"].startswith("sluice:") and "-torch" in container["image"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[args["model-repository"]]["readOnly"] is True


def test_services_budget_and_autoscaling(rendered):
    documents = rendered["overlays/production"][1]
    deployment = one(documents, "Deployment")
    labels = deployment["spec"]["selector"]["matchLabels"]
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    public = services["sluice"]
    assert public["spec"]["type"] == "LoadBalancer"
    assert public["spec"]["selector"] == labels
    assert public["spec"]["ports"][0]["appProtocol"] == "kubernetes.io/h2c"
    container_ports = {p["name"]: p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    http = {p["name"]: p for p in public["spec"]["ports"]}["http"]
    assert (http["port"], http["targetPort"]) == (8000, "http")
    assert int(args_of(deployment["spec"]["template"]["spec"]["containers"][0])["http-port"]) == container_ports["http"]
    headless = services["sluice-headless"]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["selector"] == labels
    assert one(documents, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == labels
    # One autoscaler: KEDA's ScaledObject (it owns the HPA), on a metric the server exports.
    assert not [d for d in documents if d["kind"] == "HorizontalPodAutoscaler"]
    scaled = one(documents, "ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert scaled["spec"]["minReplicaCount"] >= 2
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    for key in ("serverAddress", "query", "threshold"):
        assert trigger["metadata"][key]
    metric = re.match(r"sum\((\w+)\{", trigger["metadata"]["query"]).group(1)
    sources = open(os.path.join(ROOT, "server", "metrics", "server_metrics.cc")).read()
    assert f'Name("{metric}")' in sources, f"the server exports no {metric}"


def test_tls_overlay_wires_the_secret_and_probes_with_sluice_client(rendered):
    documents = rendered["overlays/tls"][1]
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = args_of(container)
    assert args["grpc-use-ssl"] == "true"
    secret = {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]["secretName"]
    assert secret == "sluice-tls"
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["tls"]
    assert args["grpc-server-cert"] == f"{mount}/tls.crt" and args["grpc-server-key"] == f"{mount}/tls.key"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert "grpc" not in container[probe]
        command = container[probe]["exec"]["command"]
        assert command[0] == "sluice-client" and "--ssl" in command and "health" in command
    assert "--live" in container["livenessProbe"]["exec"]["command"]
    # The probe commands are ones sluice-client accepts.
    help_text = run(os.path.join(BIN_DIR, "sluice-client"), "--help").stdout
    for flag in ("--ssl-target-name", "--root-cert", "--timeout-ms"):
        assert flag in help_text
    assert "--live" in run(os.path.join(BIN_DIR, "sluice-client"), "health", "--help").stdout


def test_tls_overlay_serves_https_on_the_http_port(rendered):
    documents = rendered["overlays/tls"][1]
    container = one(documents, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "http" in {p["name"] for p in container["ports"]}
    assert "allow-http" not in args_of(container)  # the server's default: HTTPS beside gRPC TLS
    public = [d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "sluice"][0]
    assert [p["name"] for p in public["spec"]["ports"]] == ["grpc", "http"]
    assert all("appProtocol" not in p for p in public["spec"]["ports"])  # TLS, not h2c


def test_http_probes_overlay_probes_paths_the_server_answers(rendered, bundled_server):
    import http.client as httplib
    container = one(rendered["overlays/http-probes"][1], "Deployment")["spec"]["template"]["spec"]["containers"][0]
    paths = {}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert "grpc" not in container[probe]
        assert container[probe]["httpGet"]["port"] == "http"
        paths[probe] = container[probe]["httpGet"]["path"]
    assert paths == {"livenessProbe": "/v2/health/live", "readinessProbe": "/v2/health/ready",
                     "startupProbe": "/v2/health/ready"}
    assert container["startupProbe"]["failureThreshold"] == 120  # kept from the base
    for path in set(paths.values()):
        connection = httplib.HTTPConnection("127.0.0.1", bundled_server.http_port, timeout=10)
        connection.request("GET", path)
        assert connection.getresponse().status == 200, path
        connection.close()


def test_shm_sidecar_overlay_shares_a_memory_backed_dev_shm(rendered):
    spec = one(rendered["overlays/shm-sidecar"][1], "Deployment")["spec"]["template"]["spec"]
    volume = [v for v in spec["volumes"] if v["name"] == "dshm"][0]
    assert volume["emptyDir"]["medium"] == "Memory" and volume["emptyDir"]["sizeLimit"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert set(containers) == {"sluice", "client"}
    for container in containers.values():
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert containers["sluice"]["startupProbe"]  # the rest of production is kept
    # Client shared memory is off by default: the overlay turns it on, keeping production's flags.
    assert "--allow-client-shm=true" in containers["sluice"]["args"]
    assert "--client-shm-keys=/sidecar_" in containers["sluice"]["args"]  # only the sidecar's keys
    assert "--model-repository=/models" in containers["sluice"]["args"]


def test_cpu_dedicated_overlay_is_guaranteed_and_splits_its_cpus(rendered):
    pod = one(rendered["overlays/cpu-dedicated"][1], "Deployment")["spec"]["template"]["spec"]
    # Guaranteed QoS, which the static CPU manager needs to give the pod CPUs of its own: every
    # container's requests equal its limits, in whole CPUs, and no GPU is asked for.
    for container in pod["containers"] + pod.get("initContainers", []):
        resources = container["resources"]
        assert resources["requests"] == resources["limits"], container["name"]
        assert set(resources["limits"]) == {"cpu", "memory"}, resources
    container = pod["containers"][0]
    cpus = int(container["resources"]["limits"]["cpu"])
    args = args_of(container)
    assert args["device"] == "cpu" and "tolerations" not in pod
    # The models get a count of the pod's CPUs (their numbers are not known in advance), and the
    # front ends keep at least one.
    side, _, count = args["model-cpus"].partition(":")
    assert side in ("first", "last") and 1 <= int(count) < cpus, args["model-cpus"]
    assert container["startupProbe"] and args["shutdown-grace-seconds"]  # the rest of production is kept


def test_model_cpus_count_form_is_what_the_server_accepts(rendered, tmp_path_factory):
    """The overlay's --model-cpus form starts a server (here with the count cut to this machine's
    CPUs less one): the overlay cannot carry a form the server refuses."""
    container = one(rendered["overlays/cpu-dedicated"][1], "Deployment")["spec"]["template"]["spec"]["containers"][0]
    side, _, count = args_of(container)["model-cpus"].partition(":")
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    asked = min(int(count), len(allowed) - 1)
    chosen = allowed[:asked] if side == "first" else allowed[-asked:]
    server = start_server(tmp_path_factory.mktemp("empty_repository"), tmp_path_factory,
                          ["--device", "cpu", "--model-cpus", f"{side}:{asked}"])
    try:
        assert f"event=cpu_split models={','.join(map(str, chosen))} " in server.log(), server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_example_models_overlay_needs_no_volume_claim(rendered):
    documents = rendered["overlays/example-models"][1]
    assert not [d for d in documents if d["kind"] == "PersistentVolumeClaim"]
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    models = {v["name"]: v for v in pod["volumes"]}["models"]
    assert "emptyDir" in models and "persistentVolumeClaim" not in models
    init = pod["initContainers"][0]
    assert init["image"] == pod["containers"][0]["image"]
    assert "/opt/sluice/models/." in init["command"]


def test_kserve_runtime_and_inference_service(rendered):
    documents = rendered["kserve"][1]
    runtime = one(documents, "ServingRuntime")
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    container = spec["containers"][0]
    assert container["name"] == "kserve-container"
    args = args_of(container)
    assert args["model-repository"] == "/mnt/models"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"h2c": int(args["grpc-port"]), "http1": int(args["http-port"])}
    # Read-only root filesystem: /tmp (where .pt2 packages unpack) is an emptyDir.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    service = one(documents, "InferenceService")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] == "grpc-v2"
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert model["storageUri"]


def test_metrics_the_dashboards_and_autoscaler_use_are_served(bundled_server):
    text = bundled_server.metrics_text()
    assert re.search(r"^sluice_pending_requests\{", text, re.M)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
