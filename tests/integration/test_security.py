"""Security of the gRPC and HTTP ports: TLS and mutual TLS (Triton's --grpc-use-ssl* flags, which
the HTTP port follows), with certificates made by openssl at test time (the right CA works;
plaintext and a wrong CA are refused; under mutual TLS a missing or untrusted client certificate
is refused; a certificate rotated on disk is picked up by both ports), and restricted protocol
groups (--grpc-restricted-protocol). tritonclient (gRPC and HTTP), curl, sluice-client and
grpc.health.v1."""
import os
import shutil
import subprocess
import time

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from conftest import CLIENT, SERVER, start_server
from torch import nn
from tritonclient.utils import InferenceServerException


class Double(nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0 + INPUT__0


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=Sluice test {name}",
            cwd=directory)


def make_certificate(directory, name, ca, extensions):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
    with open(os.path.join(directory, f"{name}.ext"), "w") as f:
        f.write(extensions)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    make_ca(directory, "ca")
    make_ca(directory, "other_ca")
    make_certificate(directory, "server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                                "extendedKeyUsage=serverAuth\n")
    make_certificate(directory, "client", "ca", "extendedKeyUsage=clientAuth\n")
    make_certificate(directory, "stranger", "other_ca", "extendedKeyUsage=clientAuth\n")
    return {name: str(directory / name) for name in ("ca", "other_ca", "server", "client", "stranger")}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls_repository")
    # "double", and the same model on 1 MiB tensors (requests and answers of many TLS records).
    for name, batch, width in (("double", 4, 2), ("double_large", 0, 262144)):
        os.makedirs(root / name / "1")
        (root / name / "config.pbtxt").write_text(
            f'max_batch_size: {batch}\n'
            f'input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]\n'
            f'output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]\n'
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n')
        torch.jit.script(Double()).save(str(root / name / "1" / "model.pt"))
    return root


def credentials(certs, client=None, ca="ca"):
    def read(path):
        with open(path, "rb") as f:
            return f.read()
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=read(certs[ca] + ".pem"))
    return grpc.ssl_channel_credentials(root_certificates=read(certs[ca] + ".pem"),
                                        private_key=read(certs[client] + ".key"),
                                        certificate_chain=read(certs[client] + ".pem"))


def tls_args(certs, mutual=False):
    args = ["--device", "cpu", "--grpc-use-ssl", "true", "--grpc-server-cert", certs["server"] + ".pem",
            "--grpc-server-key", certs["server"] + ".key"]
    if mutual:
        args += ["--grpc-use-ssl-mutual", "true", "--grpc-root-cert", certs["ca"] + ".pem"]
    return args


def triton_client(server, certs, client=None, ca="ca", ssl=True):
    if not ssl:
        return grpcclient.InferenceServerClient(url=server.url)
    kwargs = {"ssl": True, "root_certificates": certs[ca] + ".pem"}
    if client is not None:
        kwargs.update(private_key=certs[client] + ".key", certificate_chain=certs[client] + ".pem")
    return grpcclient.InferenceServerClient(url=server.url, **kwargs)


def infer_double(client):
    tensor = grpcclient.InferInput("INPUT__0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.5, -2.0]], np.float32))
    return client.infer("double", [tensor]).as_numpy("OUTPUT__0")


@pytest.fixture(scope="module")
def tls_server(repository, certs, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, tls_args(certs), credentials=credentials(certs))
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def mutual_server(repository, certs, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, tls_args(certs, mutual=True),
                          credentials=credentials(certs, client="client"))
    yield server
    assert server.stop() == 0, server.log()


def refused(client):
    with pytest.raises(InferenceServerException) as error:
        client.is_server_live()
    client.close()
    return str(error.value.status())


def test_tls_client_with_the_right_ca_infers(tls_server, certs):
    client = triton_client(tls_server, certs)
    assert client.is_server_ready()
    np.testing.assert_array_equal(infer_double(client), [[3.0, -4.0]])
    client.close()


def test_plaintext_and_a_wrong_ca_are_refused(tls_server, certs):
    assert refused(triton_client(tls_server, certs, ssl=False)) == "StatusCode.UNAVAILABLE"
    assert refused(triton_client(tls_server, certs, ca="other_ca")) == "StatusCode.UNAVAILABLE"


def test_mutual_tls_needs_a_client_certificate_from_the_ca(mutual_server, certs):
    client = triton_client(mutual_server, certs, client="client")
    np.testing.assert_array_equal(infer_double(client), [[3.0, -4.0]])
    client.close()
    assert refused(triton_client(mutual_server, certs)) == "StatusCode.UNAVAILABLE"  # no certificate
    assert refused(triton_client(mutual_server, certs, client="stranger")) == "StatusCode.UNAVAILABLE"
    assert refused(triton_client(mutual_server, certs, ssl=False)) == "StatusCode.UNAVAILABLE"


def run_client(server, *args):
    return subprocess.run([CLIENT, "--url", server.url, *args], capture_output=True, text=True, timeout=60)


def test_sluice_client_over_mutual_tls(mutual_server, certs):
    ok = run_client(mutual_server, "--ssl", "--root-cert", certs["ca"] + ".pem", "--client-cert",
                    certs["client"] + ".pem", "--client-key", certs["client"] + ".key", "health")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ready: true" in ok.stdout
    no_cert = run_client(mutual_server, "--ssl", "--root-cert", certs["ca"] + ".pem", "health")
    assert no_cert.returncode != 0
    assert "UNAVAILABLE" in no_cert.stdout + no_cert.stderr
    half = run_client(mutual_server, "--ssl", "--client-cert", certs["client"] + ".pem", "health")
    assert half.returncode != 0 and "--client-cert and --client-key go together" in half.stdout + half.stderr


def test_a_certificate_rotated_on_disk_serves_new_connections_without_a_restart(repository, certs,
                                                                              tmp_path_factory):
    """The server's certificate and key as a Kubernetes Secret mounts them (tls.crt and tls.key
    linked through ..data, which a renewal swaps with one rename): with --grpc-tls-reload-secs 1
    a renewed certificate serves the next handshakes; open connections and new ones both work."""
    import socket
    import ssl
    directory = tmp_path_factory.mktemp("rotating")
    certs_dir = os.path.dirname(certs["server"])
    if not os.path.exists(os.path.join(certs_dir, "renewed.pem")):
        make_certificate(certs_dir, "renewed", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                                     "extendedKeyUsage=serverAuth\n")

    def publish(version, name):
        os.makedirs(directory / version)
        shutil.copy(os.path.join(certs_dir, f"{name}.pem"), directory / version / "tls.crt")
        shutil.copy(os.path.join(certs_dir, f"{name}.key"), directory / version / "tls.key")
        os.symlink(version, directory / "..data_next")
        os.replace(directory / "..data_next", directory / "..data")

    publish("v1", "server")
    for name in ("tls.crt", "tls.key"):
        os.symlink(os.path.join("..data", name), directory / name)
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--grpc-use-ssl", "true", "--grpc-server-cert", str(directory / "tls.crt"),
                           "--grpc-server-key", str(directory / "tls.key"), "--grpc-tls-reload-secs", "1"],
                          credentials=credentials(certs))
    try:
        port = int(server.url.rsplit(":", 1)[1])

        def served_name():
            context = ssl.create_default_context(cafile=certs["ca"] + ".pem")
            context.set_alpn_protocols(["h2"])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="localhost") as tls:
                    return dict(pair[0] for pair in tls.getpeercert()["subject"])["commonName"]

        def served_name_over_http():
            context = ssl.create_default_context(cafile=certs["ca"] + ".pem")
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="localhost") as tls:
                    return dict(pair[0] for pair in tls.getpeercert()["subject"])["commonName"]

        assert served_name() == "server"
        assert served_name_over_http() == "server"
        before = triton_client(server, certs)
        assert infer_double(before).tolist() == [[3.0, -4.0]]
        publish("v2", "renewed")
        deadline = time.monotonic() + 15
        while served_name() != "renewed":
            assert time.monotonic() < deadline, "the renewed certificate was not picked up"
            time.sleep(0.2)
        while served_name_over_http() != "renewed":
            assert time.monotonic() < deadline, "the HTTP port did not pick the renewed certificate up"
            time.sleep(0.2)
        assert "event=tls_reloaded transport=http" in server.log()
        assert infer_double(before).tolist() == [[3.0, -4.0]]  # the open connection goes on
        after = triton_client(server, certs)
        assert infer_double(after).tolist() == [[3.0, -4.0]]
    finally:
        assert server.stop() == 0, server.log()


def test_bad_tls_configuration_fails_at_start_with_the_flag_named(repository, certs, tmp_path):
    def start(*args):
        return subprocess.run([SERVER, "--model-repository", str(repository), "--grpc-port", "0", "--http-port", "0",
                               "--metrics-port", "0", "--device", "cpu", *args],
                              capture_output=True, text=True, timeout=120)
    missing = start("--grpc-use-ssl", "true")
    assert missing.returncode != 0
    assert "--grpc-server-cert is required" in missing.stdout + missing.stderr
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    bad = start("--grpc-use-ssl", "true", "--grpc-server-cert", str(not_pem), "--grpc-server-key",
                certs["server"] + ".key")
    assert bad.returncode != 0
    assert f"--grpc-server-cert: {not_pem} is not a PEM file" in bad.stdout + bad.stderr
    no_root = start(*tls_args(certs)[2:], "--grpc-use-ssl-mutual", "true")
    assert no_root.returncode != 0
    assert "--grpc-root-cert" in no_root.stdout + no_root.stderr
    for reload in ("0", "60"):  # read once, or watched
        mismatched = start("--grpc-use-ssl", "true", "--grpc-server-cert", certs["server"] + ".pem",
                           "--grpc-server-key", certs["client"] + ".key", "--grpc-tls-reload-secs", reload)
        assert mismatched.returncode != 0, reload
        output = mismatched.stdout + mismatched.stderr
        assert "--grpc-server-key" in output and ("do not match" in output or "does not match" in output), output


def test_restricted_protocols_need_the_header(repository, tmp_path_factory):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--grpc-restricted-protocol",
                           "model-config,statistics,model-repository:admin-key=s3cret"])
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        np.testing.assert_array_equal(infer_double(client), [[3.0, -4.0]])  # inference stays open
        assert client.is_model_ready("double")                              # and health
        for call in (lambda **kw: client.get_model_config("double", **kw),
                     lambda **kw: client.get_inference_statistics("double", **kw),
                     lambda **kw: client.get_model_repository_index(**kw)):
            with pytest.raises(InferenceServerException) as missing:
                call()
            assert missing.value.status() == "StatusCode.UNAUTHENTICATED"
            assert "send the header 'admin-key'" in missing.value.message()
            with pytest.raises(InferenceServerException) as wrong:
                call(headers={"admin-key": "guess"})
            assert wrong.value.status() == "StatusCode.PERMISSION_DENIED"
            assert "s3cret" not in wrong.value.message()
            call(headers={"admin-key": "s3cret"})
        with grpc.insecure_channel(server.url) as channel:  # orchestrator probes stay open
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="ready"), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
        client.close()
        assert "event=protocol_restricted group=model-config header=admin-key" in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_bad_restriction_fails_at_start(repository):
    result = subprocess.run([SERVER, "--model-repository", str(repository), "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0",
                             "--device", "cpu", "--grpc-restricted-protocol", "logging:key=value"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "unknown protocol group 'logging'" in result.stdout + result.stderr


def https_get(server, certs, path="/v2/health/ready", client=None, ca="ca"):
    """GET over TLS on the HTTP port with Python's ssl: (status, body); raises ssl.SSLError or
    OSError when the handshake fails."""
    import http.client as httplib
    import ssl
    context = ssl.create_default_context(cafile=certs[ca] + ".pem")
    if client is not None:
        context.load_cert_chain(certs[client] + ".pem", certs[client] + ".key")
    connection = httplib.HTTPSConnection("127.0.0.1", server.http_port, timeout=10, context=context)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_the_http_port_speaks_tls_beside_grpc_tls_and_refuses_plaintext(tls_server, certs):
    import http.client as httplib
    import ssl
    import tritonclient.http as httpclient
    assert "tls=on" in tls_server.log()
    assert https_get(tls_server, certs)[0] == 200
    # curl as users call it, and tritonclient.http with ssl=True.
    curl = subprocess.run(["curl", "-sS", "--cacert", certs["ca"] + ".pem", "-o", "/dev/null", "-w", "%{http_code}",
                           f"https://127.0.0.1:{tls_server.http_port}/v2/health/live"],
                          capture_output=True, text=True, timeout=30)
    assert curl.stdout == "200", curl.stdout + curl.stderr
    client = httpclient.InferenceServerClient(f"127.0.0.1:{tls_server.http_port}", ssl=True,
                                              ssl_options={"ca_certs": certs["ca"] + ".pem"})
    tensor = httpclient.InferInput("INPUT__0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.5, -2.0]], np.float32))
    np.testing.assert_array_equal(client.infer("double", [tensor]).as_numpy("OUTPUT__0"), [[3.0, -4.0]])
    client.close()
    # Plaintext is answered 400 in plaintext, saying why; a wrong CA fails the handshake.
    connection = httplib.HTTPConnection("127.0.0.1", tls_server.http_port, timeout=10)
    connection.request("GET", "/v2/health/live")
    response = connection.getresponse()
    assert response.status == 400 and "this port speaks HTTPS" in response.read().decode()
    connection.close()
    with pytest.raises(ssl.SSLError):
        https_get(tls_server, certs, ca="other_ca")
    wrong_ca = subprocess.run(["curl", "-sS", "--cacert", certs["other_ca"] + ".pem",
                               f"https://127.0.0.1:{tls_server.http_port}/v2/health/live"],
                              capture_output=True, text=True, timeout=30)
    assert wrong_ca.returncode != 0
    assert https_get(tls_server, certs)[0] == 200  # the server serves on


def test_mutual_tls_on_the_http_port_needs_a_client_certificate_from_the_ca(mutual_server, certs):
    import ssl
    assert "tls=mutual" in mutual_server.log()
    assert https_get(mutual_server, certs, client="client")[0] == 200
    for client in (None, "stranger"):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            https_get(mutual_server, certs, client=client)
    curl = subprocess.run(["curl", "-sS", "--cacert", certs["ca"] + ".pem", "--cert", certs["client"] + ".pem",
                           "--key", certs["client"] + ".key", "-o", "/dev/null", "-w", "%{http_code}",
                           f"https://127.0.0.1:{mutual_server.http_port}/v2/models/double/ready"],
                          capture_output=True, text=True, timeout=30)
    assert curl.stdout == "200", curl.stdout + curl.stderr
    assert https_get(mutual_server, certs, client="client")[0] == 200


def test_https_carries_large_bodies_and_answers_on_kept_alive_and_resumed_connections(repository, certs,
                                                                                    tmp_path_factory):
    import http.client as httplib
    import socket
    import ssl
    import tritonclient.http as httpclient
    server = start_server(repository, tmp_path_factory, tls_args(certs, mutual=True),
                          credentials=credentials(certs, client="client"))
    try:
        # 1 MiB in and out, three times on one kept-alive connection (binary tensors).
        client = httpclient.InferenceServerClient(
            f"127.0.0.1:{server.http_port}", ssl=True, concurrency=1,
            ssl_options={"ca_certs": certs["ca"] + ".pem", "certfile": certs["client"] + ".pem",
                         "keyfile": certs["client"] + ".key"})
        for step in range(3):
            values = np.arange(262144, dtype=np.float32) + step
            tensor = httpclient.InferInput("INPUT__0", [262144], "FP32")
            tensor.set_data_from_numpy(values, binary_data=True)
            result = client.infer("double_large", [tensor],
                                  outputs=[httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), values * 2)
        client.close()
        # A resumed TLS session (a ticket from the first connection) under mutual TLS.
        context = ssl.create_default_context(cafile=certs["ca"] + ".pem")
        context.load_cert_chain(certs["client"] + ".pem", certs["client"] + ".key")
        context.maximum_version = ssl.TLSVersion.TLSv1_2  # a session to resume right after the handshake

        def get(session=None):
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as raw:
                with context.wrap_socket(raw, server_hostname="localhost", session=session) as tls:
                    tls.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    answer = b""
                    while chunk := tls.recv(4096):
                        answer += chunk
                    return answer.split(b" ", 2)[1], tls.session, tls.session_reused
        status, session, _ = get()
        assert status == b"200"
        status, _, reused = get(session)
        assert status == b"200" and reused
        # Clients that close without close_notify (Python's, tritonclient's) said goodbye: no
        # refusal is logged for them.
        connection = httplib.HTTPSConnection("127.0.0.1", server.http_port, timeout=10, context=context)
        connection.request("GET", "/v2/health/live")
        assert connection.getresponse().status == 200
        connection.close()
        time.sleep(0.2)
        assert "http_tls_refused" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_http_can_still_be_turned_off_beside_tls(repository, certs, tmp_path_factory):
    import http.client as httplib
    server = start_server(repository, tmp_path_factory, tls_args(certs) + ["--allow-http", "false"],
                          credentials=credentials(certs))
    try:
        assert 'event=http_off reason="--allow-http false"' in server.log()
        with pytest.raises(OSError):
            connection = httplib.HTTPConnection("127.0.0.1", server.http_port, timeout=5)
            connection.request("GET", "/v2/health/live")
            connection.getresponse()
    finally:
        assert server.stop() == 0, server.log()
