"""Hostile clients: requests a careless or malicious client sends to the real server over gRPC and
HTTP, and what the server must answer (the right status, a short, well-formed message) while it
goes on serving everyone else."""
import http.client as httplib
import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from test_server import assert_still_serving, good_request


def http_call(server, method, path, body=None, headers=None, timeout=30):
    """One raw HTTP request on its own connection: (status, headers, body bytes). `path` may hold
    any bytes (str: sent as latin-1, one byte per character)."""
    connection = httplib.HTTPConnection("127.0.0.1", server.http_port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def http_infer_body(request_id=None):
    body = {"inputs": [{"name": "INPUT__0", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    if request_id is not None:
        body["id"] = request_id
    return json.dumps(body)


def assert_http_still_serves(server):
    status, _, body = http_call(server, "POST", "/v2/models/dtype_fp32/infer", http_infer_body("fine"))
    assert status == 200, body
    answer = json.loads(body)
    assert answer["id"] == "fine" and answer["outputs"][0]["data"] == [2.0, 4.0, 6.0]


def fp32_input():
    inp = grpcclient.InferInput("INPUT__0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), np.float32))
    return inp


# ---- long and malformed client strings in messages and ids ----------------------------------------
# A client's names, keys and ids are echoed in error messages cut short (at most 128 bytes of them,
# then "...(N bytes)") and with invalid UTF-8 and controls escaped; every gRPC status message and
# HTTP error body is at most 4 KiB of valid UTF-8; a request id over 1024 bytes is refused.

LONG_NAME = "m" * 20000  # past gRPC's hard limit on trailing metadata (16 KiB) when echoed whole
LONG_ID = "i" * (2 << 20)


@pytest.mark.parametrize("query", ["metadata", "ready", "infer"])
def test_a_20_kb_model_name_over_grpc_is_not_found_with_a_short_message(triton, query):
    with pytest.raises(InferenceServerException) as error:
        if query == "metadata":
            triton.get_model_metadata(LONG_NAME)
        elif query == "ready":
            triton.is_model_ready(LONG_NAME)
        else:
            triton.infer(LONG_NAME, [fp32_input()])
    # Before the cap: RESOURCE_EXHAUSTED "received metadata size exceeds hard limit".
    assert error.value.status() == "StatusCode.NOT_FOUND", error.value
    message = error.value.message()
    assert message.startswith("Request for unknown model: 'mmm"), message  # Triton's words kept
    assert "...(20000 bytes)' is not found" in message and len(message) < 300, message


def test_a_20_kb_input_name_over_grpc_is_refused_with_a_short_message(stub):
    request = good_request()
    request.inputs[0].name = "x" * 20000
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
    assert "unexpected input 'xxx" in error.value.details() and len(error.value.details()) < 400
    assert_still_serving(stub)


@pytest.mark.parametrize("path", ["/v2/models/bad%FFname", "/v2/models/bad%FF%FE%C0name/ready",
                                  "/v2/models/%FF%0A%1B/infer"])
def test_a_model_name_with_invalid_utf8_over_http_gets_a_json_error_body(server, path):
    method = "POST" if path.endswith("/infer") else "GET"
    status, headers, body = http_call(server, method, path, http_infer_body() if method == "POST" else None)
    assert status == 404, body
    assert headers["Content-Type"] == "application/json"
    error = json.loads(body)["error"]  # json.loads of bytes refuses invalid UTF-8
    assert error.startswith("Request for unknown model: '"), error
    assert "\\xFF" in error, error
    if "%0A" in path:
        assert "\\x0A\\x1B" in error and "\n" not in error, error
    assert_http_still_serves(server)


def test_a_long_path_over_http_is_echoed_short(server):
    status, _, body = http_call(server, "GET", "/v3/" + "p" * 4000)
    assert status == 404, body
    error = json.loads(body)["error"]
    assert error.startswith("no endpoint /v3/ppp") and "...(4004 bytes)" in error and len(error) < 300, error


def test_a_2_mb_request_id_is_refused_over_grpc(triton, stub):
    with pytest.raises(InferenceServerException) as error:
        triton.infer("dtype_fp32", [fp32_input()], request_id=LONG_ID)
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT", error.value
    message = error.value.message()
    assert message.startswith("the request id 'iii") and "...(2097152 bytes)" in message, message
    assert "longer than the 1024 bytes" in message and len(message) < 300, message
    # At the bound it is served and echoed.
    at_bound = "j" * 1024
    assert triton.infer("dtype_fp32", [fp32_input()], request_id=at_bound).get_response().id == at_bound
    assert_still_serving(stub)


def test_a_2_mb_request_id_in_a_stream_is_refused_and_not_echoed(stub):
    refused = good_request()
    refused.id = LONG_ID
    fine = good_request()
    fine.id = "fine"
    responses = list(stub.ModelStreamInfer(iter([refused, fine]), timeout=30))
    assert len(responses) == 2
    by_id = {response.infer_response.id: response for response in responses}
    assert set(by_id) == {"", "fine"}
    assert "the request id 'iii" in by_id[""].error_message and len(by_id[""].error_message) < 300
    assert by_id["fine"].error_message == ""
    output = np.frombuffer(by_id["fine"].infer_response.raw_output_contents[0], np.float32)
    assert output.tolist() == [2.0, 2.0, 2.0]


def test_a_2_mb_request_id_is_refused_over_http(server):
    status, _, body = http_call(server, "POST", "/v2/models/dtype_fp32/infer", http_infer_body(LONG_ID))
    assert status == 400, body[:200]
    assert len(body) < 400, body[:400]
    error = json.loads(body)["error"]
    assert error.startswith("the request id 'iii") and "longer than the 1024 bytes" in error, error
    client = httpclient.InferenceServerClient(url=server.http_url)
    try:
        inp = httpclient.InferInput("INPUT__0", [1, 3], "FP32")
        inp.set_data_from_numpy(np.ones((1, 3), np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("dtype_fp32", [inp], request_id=LONG_ID)
        assert refused.value.status() == "400" and "the request id" in refused.value.message()
    finally:
        client.close()
    assert_http_still_serves(server)


def test_a_long_string_parameter_is_quoted_short(stub):
    request = good_request()
    request.parameters["timeout"].string_param = "t" * 100000
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
    details = error.value.details()
    assert "'timeout' must be a non-negative integer" in details and "...(100000 bytes)" in details, details
    assert len(details) < 400, details
    assert_still_serving(stub)
