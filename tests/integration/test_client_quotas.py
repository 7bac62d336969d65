"""Quotas per client (--client-quota) over both protocols with real clients: a client over its
rate or its in-flight cap is refused at once (gRPC RESOURCE_EXHAUSTED with retry-after and
grpc-retry-pushback-ms trailing metadata, HTTP 429 with Retry-After) while others are served; one
bucket per client across gRPC and HTTP; the identity header believed only from a trusted proxy; a
mutual-TLS client named by its certificate's subject (on gRPC and HTTPS alike); a stream's refused request answered in the
stream, which goes on; the sluice_client_* series."""
import http.client as httplib
import json
import os
import threading
import time

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as service_pb2
import tritonclient.http as httpclient
from conftest import start_server
from harness.server import metric_value
from test_security import Double, certs, credentials, https_get, tls_args, triton_client  # noqa: F401 (certs: a fixture)
from tritonclient.utils import InferenceServerException

CONFIG = ('max_batch_size: 4\n'
          'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
          'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
          'instance_group [ { kind: KIND_CPU count: 1 } ]\n')


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """"double", and "held": the same model whose batches wait up to 4 s for a second request (a
    lone request stays in flight that long)."""
    root = tmp_path_factory.mktemp("quota_repository")
    for name, extra in (("double", ""),
                        ("held", "dynamic_batching { preferred_batch_size: [ 4 ] "
                                 "max_queue_delay_microseconds: 4000000 }\n")):
        os.makedirs(root / name / "1")
        (root / name / "config.pbtxt").write_text(CONFIG + extra)
        torch.jit.script(Double()).save(str(root / name / "1" / "model.pt"))
    return root


def grpc_request(model="double"):
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.5, -2.0])
    return request


def grpc_infer(server, headers=(), model="double", channel_credentials=None):
    """One ModelInfer as raw gRPC: (code, message, trailing metadata as a dict)."""
    channel = (grpc.secure_channel(server.url, channel_credentials) if channel_credentials
               else grpc.insecure_channel(server.url))
    with channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                   response_deserializer=service_pb2.ModelInferResponse.FromString)
        try:
            _, outcome = call.with_call(grpc_request(model), metadata=list(headers), timeout=30)
            return grpc.StatusCode.OK, "", dict(outcome.trailing_metadata() or ())
        except grpc.RpcError as error:
            return error.code(), error.details(), dict(error.trailing_metadata() or ())


def http_infer(server, headers=None, model="double"):
    """One POST .../infer as raw HTTP: (status, Retry-After or None, body)."""
    body = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [1, 2],
                                   "data": [1.5, -2.0]}]})
    connection = httplib.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body,
                           {"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, response.getheader("Retry-After"), response.read().decode()
    finally:
        connection.close()


def scrape(server):
    connection = httplib.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def held_pending(server):
    """sluice_pending_requests of the model "held" (0 when it has no series yet)."""
    for line in scrape(server).splitlines():
        if line.startswith("sluice_pending_requests{") and 'model="held"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0


def series(client, outcome):
    return f'sluice_client_requests_total{{client="{client}",outcome="{outcome}"}}'


def test_a_client_over_its_rate_is_refused_with_a_time_to_retry_on_both_protocols(repository, tmp_path_factory):
    # One token every 100 s (none comes back during the test, however slow the host), 3 at once: 127.0.0.1's bucket is shared by its gRPC and HTTP requests.
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--client-quota", "rate=0.01,burst=3"])
    try:
        assert grpc_infer(server)[0] == grpc.StatusCode.OK
        assert http_infer(server)[0] == 200
        assert grpc_infer(server)[0] == grpc.StatusCode.OK
        code, message, trailers = grpc_infer(server)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
        assert "client '127.0.0.1' is over its rate of 0.01 inference requests/s (burst 3" in message
        assert 90 <= int(trailers["retry-after"]) <= 100, trailers
        assert 90000 < int(trailers["grpc-retry-pushback-ms"]) <= 100000, trailers
        status, retry_after, body = http_infer(server)
        assert status == 429, body
        assert 90 <= int(retry_after) <= 100
        assert "is over its rate" in json.loads(body)["error"]
        # tritonclient sees the same refusals as exceptions with the status and the reason.
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("INPUT__0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("double", [tensor])
        assert refused.value.status() == "429" and "over its rate" in refused.value.message()
        client.close()
        # Other calls are not inference: health and metadata stay open to the client.
        assert grpcclient.InferenceServerClient(server.url).is_server_live()
        assert "event=client_quotas rate=0.01 burst=3" in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_the_in_flight_cap_refuses_a_second_request_until_the_first_is_answered(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--client-quota", "in-flight=1"])
    try:
        first = {}
        waiting = threading.Thread(target=lambda: first.update(code=grpc_infer(server, model="held")[0]))
        started = time.monotonic()
        waiting.start()
        # The first waits in "held"'s queue (up to 4 s for a batch of 4): in flight meanwhile. The
        # second is sent once the first is seen queued (sent together, either may come first).
        deadline = time.monotonic() + 10
        while held_pending(server) != 1:
            assert "code" not in first, f"the held request was answered at once: {first}"
            assert time.monotonic() < deadline, "the held request never queued"
            time.sleep(0.02)
        code, message, trailers = grpc_infer(server)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
        assert "has 1 inference requests in flight, its cap" in message
        assert trailers["retry-after"] == "1"
        status, retry_after, body = http_infer(server)
        assert status == 429 and retry_after == "1", body
        waiting.join(30)
        assert first["code"] == grpc.StatusCode.OK
        assert time.monotonic() - started < 10
        assert grpc_infer(server)[0] == grpc.StatusCode.OK  # answered: its place is free again
    finally:
        assert server.stop() == 0, server.log()


def test_the_identity_header_is_believed_only_from_a_trusted_proxy(repository, tmp_path_factory):
    quota = ["--device", "cpu", "--client-quota", "rate=0.01,burst=1", "--client-identity-header", "X-Client-Id"]
    trusting = start_server(repository, tmp_path_factory, quota + ["--trusted-proxies", "127.0.0.0/8"])
    distrusting = start_server(repository, tmp_path_factory, quota + ["--trusted-proxies", "10.0.0.0/8,fd00::/8"])
    try:
        # From a trusted peer each named client has its own bucket, on either protocol.
        assert grpc_infer(trusting, [("x-client-id", "tenant-a")])[0] == grpc.StatusCode.OK
        assert http_infer(trusting, {"X-Client-Id": "tenant-b"})[0] == 200
        code, message, _ = grpc_infer(trusting, [("x-client-id", "tenant-b")])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "client 'tenant-b'" in message
        assert http_infer(trusting, {"X-Client-Id": "tenant-a"})[0] == 429
        assert grpc_infer(trusting)[0] == grpc.StatusCode.OK  # no header: the proxy's own address
        # From any other peer the header is ignored: the address is the client.
        assert grpc_infer(distrusting, [("x-client-id", "tenant-a")])[0] == grpc.StatusCode.OK
        code, message, _ = grpc_infer(distrusting, [("x-client-id", "tenant-z")])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "client '127.0.0.1'" in message
        status, _, body = http_infer(distrusting, {"X-Client-Id": "tenant-y"})
        assert status == 429 and "client '127.0.0.1'" in body
    finally:
        assert trusting.stop() == 0, trusting.log()
        assert distrusting.stop() == 0, distrusting.log()


def test_a_mutual_tls_client_is_its_certificate_subject(repository, certs, tmp_path_factory):  # noqa: F811
    server = start_server(repository, tmp_path_factory,
                          tls_args(certs, mutual=True) + ["--client-quota", "rate=1000",
                                                          "--client-quota", "rate=0.01,burst=1:CN=client"],
                          credentials=credentials(certs, client="client"))
    try:
        channel_credentials = credentials(certs, client="client")
        assert grpc_infer(server, channel_credentials=channel_credentials)[0] == grpc.StatusCode.OK
        code, message, _ = grpc_infer(server, channel_credentials=channel_credentials)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
        assert "client 'CN=client' is over its rate of 0.01" in message
        # tritonclient with the same certificate is the same client.
        client = triton_client(server, certs, client="client")
        tensor = grpcclient.InferInput("INPUT__0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("double", [tensor])
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        client.close()
        # Over HTTPS with the same certificate: the same client, the same bucket.
        status, _ = https_get(server, certs, "/v2/health/live", client="client")
        assert status == 200  # not inference: not counted
        import ssl
        context = ssl.create_default_context(cafile=certs["ca"] + ".pem")
        context.load_cert_chain(certs["client"] + ".pem", certs["client"] + ".key")
        connection = httplib.HTTPSConnection("127.0.0.1", server.http_port, timeout=30, context=context)
        connection.request("POST", "/v2/models/double/infer", json.dumps(
            {"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}))
        response = connection.getresponse()
        assert response.status == 429 and "client 'CN=client'" in response.read().decode()
        connection.close()
    finally:
        assert server.stop() == 0, server.log()


def test_a_streams_refused_request_is_answered_in_the_stream_which_goes_on(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--client-quota", "rate=0.01,burst=2"])
    try:
        answers = []
        done = threading.Event()

        def callback(result, error):
            answers.append((result, error))
            if len(answers) == 3:
                done.set()
        client = grpcclient.InferenceServerClient(server.url)
        client.start_stream(callback=callback)
        for index in range(3):
            tensor = grpcclient.InferInput("INPUT__0", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.array([[index, 1.0]], np.float32))
            client.async_stream_infer("double", [tensor], request_id=str(index))
        assert done.wait(30), answers
        client.stop_stream()
        client.close()
        errors = [error for _, error in answers if error is not None]
        assert len(errors) == 1 and "is over its rate" in errors[0].message(), answers
        assert sum(result is not None for result, _ in answers) == 2
    finally:
        assert server.stop() == 0, server.log()


def test_the_metrics_name_the_busiest_clients_and_count_the_rest_as_other(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--client-quota", "rate=0.01,burst=2", "--client-identity-header",
                           "x-client-id", "--trusted-proxies", "127.0.0.1", "--client-quota-metrics-clients", "1"])
    try:
        for _ in range(3):
            grpc_infer(server, [("x-client-id", "busy")])  # 2 admitted, 1 refused
        grpc_infer(server, [("x-client-id", "quiet")])
        first = scrape(server)  # names "busy" (one name allowed); it counts from here on
        assert metric_value(first, series("other", "admitted")) == 3
        assert metric_value(first, series("other", "rate_limited")) == 1
        assert metric_value(first, series("busy", "rate_limited")) == 0
        assert metric_value(first, "sluice_client_quota_clients") == 2
        grpc_infer(server, [("x-client-id", "busy")])
        http_infer(server, {"x-client-id": "quiet"})
        grpc_infer(server, [("x-client-id", "quiet")])
        second = scrape(server)
        assert metric_value(second, series("busy", "rate_limited")) == 1
        assert metric_value(second, series("other", "admitted")) == 4
        assert metric_value(second, series("other", "rate_limited")) == 2
        assert metric_value(second, series("quiet", "admitted")) is None
        assert metric_value(second, 'sluice_client_requests_in_flight{client="busy"}') == 0
    finally:
        assert server.stop() == 0, server.log()
