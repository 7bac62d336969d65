"""Hostile clients: requests a careless or malicious client sends to the real server over gRPC and
HTTP, and what the server must answer (the right status, a short, well-formed message) while it
goes on serving everyone else."""
import http.client as httplib
import json
import socket
import threading
import time
import zlib

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start_server
from harness.process import rss_bytes
from test_http import call as http_call
from test_server import assert_still_serving, good_request


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


# ---- the HTTP transport: framing, slow clients, bodies, compression ------------------------------
# Raw sockets: a client library would refuse to send most of these.

def raw_exchange(server, data, timeout=10, shutdown_write=False):
    """Sends `data` on a fresh connection and reads until the server closes it (or `timeout`)."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout) as s:
        s.sendall(data)
        if shutdown_write:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except socket.timeout:
            pass
        return b"".join(chunks)


def gzip_of_spaces(size):
    """A gzip stream of `size` spaces, made a MiB at a time (a bomb: about 1000 to 1)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    parts = [compressor.compress(block) for _ in range(size >> 20)]
    parts.append(compressor.flush())
    return b"".join(parts)


def test_two_content_lengths_are_refused_not_smuggled(server):
    # The first Content-Length used to win and the rest of the body was answered as a request.
    answer = raw_exchange(server, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                  b"Content-Length: 2\r\n\r\nGET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert answer.count(b"HTTP/1.1") == 1, answer  # nothing was read as a second request
    assert b"Content-Length is given more than once" in answer
    for framing in (b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"):
        answer = raw_exchange(server, b"POST /v2/health/live HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400") and answer.count(b"HTTP/1.1") == 1, answer
    assert_http_still_serves(server)


def test_a_malformed_chunk_size_is_400(server):
    answer = raw_exchange(server, b"POST /v2/models/dtype_fp32/infer HTTP/1.1\r\nHost: x\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\nnot-hex\r\n{}\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer  # was 413
    assert b"chunk size" in answer
    assert_http_still_serves(server)


def test_a_client_that_half_closes_after_its_request_gets_its_answer(server):
    # An HTTP/1.0-style client (nc -N): a complete request, then shutdown(SHUT_WR). It used to be
    # answered 499 (cancelled while queued).
    body = http_infer_body("half").encode()
    request = (b"POST /v2/models/dtype_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
    for _ in range(3):
        answer = raw_exchange(server, request, shutdown_write=True)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["id"] == "half"
    assert_http_still_serves(server)


@pytest.fixture(scope="module")
def guarded_server(test_repository, tmp_path_factory):
    """Tight transport limits: a 1 s header deadline, 40 connections, a 64 MiB budget."""
    server = start_server(test_repository, tmp_path_factory,
                          ["--strict-readiness", "false", "--device", "cpu", "--http-header-timeout-ms", "1000",
                           "--http-max-connections", "40", "--http-max-buffered-bytes", str(64 << 20)])
    yield server
    assert server.stop() == 0, server.log()


def test_slow_headers_time_out_and_every_connection_counts(guarded_server):
    port = guarded_server.http_port
    trickling = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(30)]
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(10)]
    try:
        for s in trickling:
            s.sendall(b"G")
        # 40 open (30 trickling, 10 that never sent a byte): the 41st is refused at once.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            refused = extra.recv(65536)
        assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in refused, refused
        assert b"--http-max-connections" in refused
        started = time.monotonic()
        answers = {}
        for second in range(4):
            for i, s in enumerate(trickling):
                if i in answers:
                    continue
                try:
                    s.sendall(b"E")  # one byte a while: never silent, never finished
                except OSError:
                    answers[i] = b""
            time.sleep(0.5)
        for i, s in enumerate(trickling):
            if i not in answers:
                s.settimeout(5)
                answers[i] = s.recv(65536)
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers.values()), set(answers.values())
        assert b"--http-header-timeout-ms" in answers[0]
        assert time.monotonic() - started < 6
    finally:
        for s in trickling + silent:
            s.close()
    deadline = time.monotonic() + 10
    while True:  # the server sees the closes and has room again
        status, _, _ = http_call(guarded_server, "GET", "/v2/health/live")
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200
    assert_http_still_serves(guarded_server)


def test_half_sent_bodies_share_one_budget(guarded_server):
    port = guarded_server.http_port
    pid = guarded_server.process.pid
    before = rss_bytes(pid)
    # Four connections each declare 1 GiB and send 24 MiB of it: past the 64 MiB budget the next
    # bytes are refused with 503 and Retry-After instead of held.
    head = b"POST /v2/models/dtype_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (1 << 30)
    senders = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
    answers = []
    try:
        chunk = b"x" * (1 << 20)
        for s in senders:
            s.sendall(head)
        for _ in range(24):
            for s in senders:
                try:
                    s.sendall(chunk)
                except OSError:
                    pass  # refused and closed: the rest is not read
        grown = rss_bytes(pid) - before
        assert grown < (64 << 20) + (48 << 20), f"RSS grew {grown >> 20} MiB past a 64 MiB budget"
        assert_http_still_serves(guarded_server)  # meanwhile, a well-behaved client is served
        for s in senders:
            s.settimeout(0.5)
            try:
                answers.append(s.recv(65536))
            except (socket.timeout, OSError):
                answers.append(b"")
    finally:
        for s in senders:
            s.close()
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    assert refused, answers
    assert all(b"Retry-After: 1" in a and b"--http-max-buffered-bytes" in a for a in refused), refused


def test_a_gzip_bomb_is_refused_off_the_event_loop(server):
    # 1 GiB of spaces in about 1 MiB of gzip, within --http-max-body-bytes (1 GiB, which bounds
    # the inflated size): it used to be inflated and parsed on the event loop (4-5 s during which
    # /v2/health/live waited, 2 GB of RSS).
    bomb = gzip_of_spaces(1 << 30)
    assert len(bomb) < (2 << 20)
    pid = server.process.pid
    before = rss_bytes(pid)
    result = {}

    def send():
        result["answer"] = http_call(server, "POST", "/v2/models/dtype_fp32/infer", bomb,
                                     {"Content-Encoding": "gzip", "Content-Type": "application/json"})

    sender = threading.Thread(target=send)
    sender.start()
    live = []
    while sender.is_alive() and len(live) < 50:
        started = time.monotonic()
        assert http_call(server, "GET", "/v2/health/live")[0] == 200
        live.append(time.monotonic() - started)
    sender.join(30)
    status, _, answer = result["answer"]
    assert status == 413, answer
    assert "--http-max-inflate-ratio" in json.loads(answer)["error"]
    assert max(live) < 0.5, live  # the event loop kept answering
    assert rss_bytes(pid) - before < (256 << 20)
    assert_http_still_serves(server)
