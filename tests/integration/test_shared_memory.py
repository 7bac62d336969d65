"""System shared memory with tritonclient's own tritonclient.utils.shared_memory against the real
server, over gRPC and HTTP: register, infer with inputs and outputs in regions (unary, on a gRPC
stream, and over HTTP beside JSON and binary tensors), status, unregister, every error case with
its code and Triton's words, unregister while a request uses the region, CUDA shared memory
answered as Triton without GPUs, one registry for both protocols, and the server serving after
each. Hostile clients: an object shrunk (ftruncate) after its registration fails the request that
touches it instead of ending the server; keys outside the operator's --client-shm-keys prefixes,
and every key without that flag, are refused; keys that are no single POSIX name too."""
import asyncio
import http.client as httplib
import json
import os
import queue
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from conftest import start_server, wait_models_ready


# The keys Region makes (and the missing object the error cases name), as an operator allows them.
KEYS = "--client-shm-keys=/sluice_"


@pytest.fixture(scope="module")
def shm_server(test_repository, tmp_path_factory):
    server = start_server(test_repository, tmp_path_factory,
                          ["--strict-readiness", "false", "--device", "cpu", "--allow-client-shm=true", KEYS])
    wait_models_ready(server, ["dtype_fp32", "slow_queue"])
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture()
def client(shm_server):
    client = grpcclient.InferenceServerClient(shm_server.url)
    yield client
    client.unregister_system_shared_memory()  # all
    client.close()


class Region:
    """A POSIX shared memory object made with tritonclient's helper, destroyed at the end."""

    def __init__(self, name, byte_size):
        self.name, self.key, self.byte_size = name, f"/sluice_{name}_{os.getpid()}", byte_size
        self.handle = shm.create_shared_memory_region(name, self.key, byte_size)

    def close(self):
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture()
def regions():
    made = []

    def make(name, byte_size):
        made.append(Region(name, byte_size))
        return made[-1]

    yield make
    for region in made:
        region.close()


def shm_request(region_in, region_out, x, out_offset=0, out_size=None):
    inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_shared_memory(region_in.name, x.nbytes)
    out = grpcclient.InferRequestedOutput("OUTPUT__0")
    out.set_shared_memory(region_out.name, out_size or x.nbytes, offset=out_offset)
    return [inp], [out]


def read_output(result, region, offset=0):
    output = result.get_output("OUTPUT__0")
    return shm.get_contents_as_numpy(region.handle, triton_to_np_dtype(output.datatype), list(output.shape),
                                     offset=offset)


def test_inputs_and_outputs_in_regions(client, regions):
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    region_in, region_out = regions("in", x.nbytes), regions("out", 4096)
    shm.set_shared_memory_region(region_in.handle, [x])
    client.register_system_shared_memory(region_in.name, region_in.key, region_in.byte_size)
    client.register_system_shared_memory(region_out.name, region_out.key, region_out.byte_size)
    inputs, outputs = shm_request(region_in, region_out, x, out_offset=128)
    result = client.infer("dtype_fp32", inputs, outputs=outputs)
    np.testing.assert_array_equal(read_output(result, region_out, offset=128), x + x)
    assert result.get_response().raw_output_contents[0] == b""  # the bytes went to the region, as Triton

    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert status["in"] == {"name": "in", "key": region_in.key, "byte_size": str(x.nbytes)}
    assert status["out"]["byte_size"] == "4096"
    assert list(client.get_system_shared_memory_status("out", as_json=True)["regions"]) == ["out"]
    metadata = client.get_server_metadata(as_json=True)
    assert "system_shared_memory" in metadata["extensions"]

    # Many requests on one stream, each writing its own slice of the output region.
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i in range(8):
        inputs, outputs = shm_request(region_in, region_out, x, out_offset=i * 48)
        client.async_stream_infer("dtype_fp32", inputs, outputs=outputs, request_id=str(i))
    for _ in range(8):
        result, error = answers.get(timeout=30)
        assert error is None, error
        i = int(result.get_response().id)
        np.testing.assert_array_equal(read_output(result, region_out, offset=i * 48), x + x)
    client.stop_stream()

    client.unregister_system_shared_memory("in")
    assert list(client.get_system_shared_memory_status(as_json=True)["regions"]) == ["out"]
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_every_error_has_its_code(client, regions):
    region = regions("r", 256)
    client.register_system_shared_memory("r", region.key, 256)
    cases = [
        (lambda: client.register_system_shared_memory("r", region.key, 256), "StatusCode.ALREADY_EXISTS",
         "shared memory region 'r' already in manager"),
        (lambda: client.register_system_shared_memory("big", region.key, 257), "StatusCode.INVALID_ARGUMENT",
         "failed to register shared memory region 'big': invalid args"),
        (lambda: client.register_system_shared_memory("off", region.key, 16, offset=250),
         "StatusCode.INVALID_ARGUMENT", "run past the end"),
        (lambda: client.register_system_shared_memory("nokey", "/sluice_no_such_object", 16),
         "StatusCode.INVALID_ARGUMENT", "Unable to open shared memory region: '/sluice_no_such_object'"),
        (lambda: client.get_system_shared_memory_status("nope"), "StatusCode.NOT_FOUND",
         "Unable to find system shared memory region: 'nope'"),
        # No CUDA shared memory here: a registration is refused, as by Triton without GPUs.
        (lambda: client.register_cuda_shared_memory("c", b"\0" * 64, 0, 16), "StatusCode.INVALID_ARGUMENT",
         "failed to register CUDA shared memory region: 'c', GPUs not supported"),
        (lambda: client.get_cuda_shared_memory_status("c"), "StatusCode.NOT_FOUND",
         "Unable to find cuda shared memory region: 'c'"),
    ]
    for call, code, message in cases:
        with pytest.raises(InferenceServerException) as error:
            call()
        assert error.value.status() == code, (message, error.value)
        assert message in error.value.message(), error.value
    # What Triton's shared-memory examples do first: clean up CUDA regions (there are none).
    assert not client.get_cuda_shared_memory_status(as_json=True).get("regions")
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("c")

    x = np.ones((1, 16), dtype=np.float32)
    shm.set_shared_memory_region(region.handle, [x])

    def infer_error(inputs, outputs):
        with pytest.raises(InferenceServerException) as error:
            client.infer("dtype_fp32", inputs, outputs=outputs)
        return error.value

    inputs, outputs = shm_request(region, region, x)
    inputs[0].set_shared_memory("r", 64, offset=200)  # 200 + 64 > 256
    error = infer_error(inputs, outputs)
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message().startswith("Invalid offset + byte size for shared memory region: 'r'"), error
    assert "64 bytes at offset 200 do not fit its 256 bytes" in error.message()
    inputs, outputs = shm_request(region, region, x)
    inputs[0].set_shared_memory("nope", 64)
    error = infer_error(inputs, outputs)
    assert error.status() == "StatusCode.NOT_FOUND"
    assert error.message() == "Unable to find shared memory region: 'nope' (input 'INPUT__0')"
    inputs, outputs = shm_request(region, region, x, out_size=32)  # the output needs 64 bytes
    error = infer_error(inputs, outputs)
    assert "output 'OUTPUT__0' has 64 bytes, more than its shared memory slice holds (32 bytes)" in error.message()
    # The server serves on, from the same region.
    inputs, outputs = shm_request(region, region, x, out_offset=64)
    result = client.infer("dtype_fp32", inputs, outputs=outputs)
    np.testing.assert_array_equal(read_output(result, region, offset=64), x + x)


def test_unregister_while_in_use_succeeds_and_the_request_still_completes(client, regions):
    """slow_queue holds a lone request 1.5 s: unregister both of its regions meanwhile. The call
    succeeds at once, the request still reads and writes its (still mapped) regions, and a new
    request naming them is refused."""
    x = np.full((1, 4), 3, dtype=np.float32)
    region_in, region_out = regions("busy_in", 64), regions("busy_out", 64)
    shm.set_shared_memory_region(region_in.handle, [x])
    client.register_system_shared_memory("busy_in", region_in.key, 64)
    client.register_system_shared_memory("busy_out", region_out.key, 64)
    inputs, outputs = shm_request(region_in, region_out, x)
    done = threading.Event()
    answer = {}

    def callback(result, error):
        answer["result"], answer["error"] = result, error
        done.set()

    client.async_infer("slow_queue", inputs, callback, outputs=outputs)
    time.sleep(0.3)  # queued, waiting for company
    client.unregister_system_shared_memory("busy_in")
    client.unregister_system_shared_memory("busy_out")
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
    assert done.wait(10)
    assert answer["error"] is None, answer["error"]
    # RowMix: each row is x * 2 + the row's sum.
    np.testing.assert_array_equal(read_output(answer["result"], region_out), x * 2 + x.sum(axis=1, keepdims=True))
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'busy_in'"):
        client.infer("slow_queue", inputs, outputs=outputs)


def test_client_shared_memory_is_off_by_default(test_repository, tmp_path_factory, regions):
    """As Triton 26.05+: without --allow-client-shm=true every register and unregister call, system
    and CUDA, answers UNIMPLEMENTED with Triton's sentence; status calls answer, listing nothing."""
    disabled = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
    for flags in ([], ["--allow-shared-memory", "false"]):  # the default, and the older flag's name
        server = start_server(test_repository, tmp_path_factory, ["--strict-readiness", "false", "--device", "cpu",
                                                                  *flags])
        try:
            wait_models_ready(server, ["dtype_fp32"])
            client = grpcclient.InferenceServerClient(server.url)
            region = regions("off", 64)
            for call in (lambda: client.register_system_shared_memory("off", region.key, 64),
                         lambda: client.unregister_system_shared_memory(),
                         lambda: client.unregister_system_shared_memory("off"),
                         lambda: client.register_cuda_shared_memory("c", b"\0" * 64, 0, 16),
                         lambda: client.unregister_cuda_shared_memory()):
                with pytest.raises(InferenceServerException) as error:
                    call()
                assert error.value.status() == "StatusCode.UNIMPLEMENTED", (flags, error.value)
                assert error.value.message() == disabled, (flags, error.value)
            assert not client.get_system_shared_memory_status(as_json=True).get("regions")
            assert not client.get_cuda_shared_memory_status(as_json=True).get("regions")
            assert "system_shared_memory" not in client.get_server_metadata(as_json=True)["extensions"]
            x = np.ones((1, 4), dtype=np.float32)
            inputs, outputs = shm_request(region, region, x)
            with pytest.raises(InferenceServerException, match="--allow-client-shm=true") as error:
                client.infer("dtype_fp32", inputs, outputs=outputs)
            assert error.value.status() == "StatusCode.FAILED_PRECONDITION"
            client.close()
            # The same over HTTP: 501 (Triton's code for UNSUPPORTED) with the sentence.
            rest = httpclient.InferenceServerClient(server.http_url)
            for call in (lambda: rest.register_system_shared_memory("off", region.key, 64),
                         lambda: rest.unregister_system_shared_memory(),
                         lambda: rest.unregister_system_shared_memory("off"),
                         lambda: rest.register_cuda_shared_memory("c", b"\0" * 64, 0, 16),
                         lambda: rest.unregister_cuda_shared_memory("c")):
                with pytest.raises(InferenceServerException) as error:
                    call()
                assert (error.value.status(), error.value.message()) == ("501", disabled), flags
            assert rest.get_system_shared_memory_status() == []
            assert rest.get_cuda_shared_memory_status() == []
            assert "system_shared_memory" not in rest.get_server_metadata()["extensions"]
            inputs, outputs = http_shm_request(region, region, x)
            with pytest.raises(InferenceServerException, match="--allow-client-shm=true") as error:
                rest.infer("dtype_fp32", inputs, outputs=outputs)
            assert error.value.status() == "400"
            rest.close()
        finally:
            assert server.stop() == 0, server.log()


def test_the_shared_memory_group_can_be_restricted(test_repository, tmp_path_factory, regions):
    server = start_server(test_repository, tmp_path_factory,
                          ["--strict-readiness", "false", "--device", "cpu", "--allow-shared-memory", "true", KEYS,
                           "--grpc-restricted-protocol", "shared-memory:shm-key=s3cret",
                           "--http-restricted-api", "shared-memory:shm-key=s3cret"])
    try:
        client = grpcclient.InferenceServerClient(server.url)
        region = regions("guarded", 64)
        with pytest.raises(InferenceServerException) as error:
            client.register_system_shared_memory("guarded", region.key, 64)
        assert error.value.status() == "StatusCode.UNAUTHENTICATED"
        client.register_system_shared_memory("guarded", region.key, 64, headers={"shm-key": "s3cret"})
        status = client.get_system_shared_memory_status(headers={"shm-key": "s3cret"}, as_json=True)
        assert list(status["regions"]) == ["guarded"]
        client.close()
        rest = httpclient.InferenceServerClient(server.http_url)
        for call in (lambda headers: rest.get_system_shared_memory_status(headers=headers),
                     lambda headers: rest.unregister_system_shared_memory("guarded", headers=headers),
                     lambda headers: rest.get_cuda_shared_memory_status(headers=headers)):
            with pytest.raises(InferenceServerException) as error:
                call(None)
            assert error.value.status() == "401", error.value
        assert [entry["name"] for entry in rest.get_system_shared_memory_status(headers={"shm-key": "s3cret"})] \
            == ["guarded"]
        rest.close()
    finally:
        assert server.stop() == 0, server.log()


# ---- HTTP: Triton's /v2/systemsharedmemory and /v2/cudasharedmemory endpoints, and the
# shared_memory_* parameters of JSON inference requests.

@pytest.fixture()
def rest(shm_server):
    client = httpclient.InferenceServerClient(shm_server.http_url)
    yield client
    client.unregister_system_shared_memory()  # all
    client.close()


def http_shm_request(region_in, region_out, x, out_offset=0, out_size=None):
    inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_shared_memory(region_in.name, x.nbytes)
    out = httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)
    out.set_shared_memory(region_out.name, out_size or x.nbytes, offset=out_offset)
    return [inp], [out]


def raw(server, method, path, body=None):
    """One raw HTTP request: (status, decoded JSON body or None)."""
    connection = httplib.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        payload = response.read()
        return response.status, json.loads(payload) if payload else None
    finally:
        connection.close()


def test_http_inputs_and_outputs_in_regions(shm_server, rest, client, regions):
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    region_in, region_out = regions("hin", x.nbytes), regions("hout", 4096)
    shm.set_shared_memory_region(region_in.handle, [x])
    rest.register_system_shared_memory(region_in.name, region_in.key, region_in.byte_size)
    rest.register_system_shared_memory(region_out.name, region_out.key, 2048, offset=1024)
    assert sorted(rest.get_system_shared_memory_status(), key=lambda entry: entry["name"]) == [
        {"name": "hin", "key": region_in.key, "offset": 0, "byte_size": x.nbytes},
        {"name": "hout", "key": region_out.key, "offset": 1024, "byte_size": 2048}]
    assert [entry["name"] for entry in rest.get_system_shared_memory_status("hout")] == ["hout"]
    # One registry for both protocols.
    assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) == {"hin", "hout"}
    assert "system_shared_memory" in rest.get_server_metadata()["extensions"]

    # Input and output in regions: the output is described (name, datatype, shape) without data.
    inputs, outputs = http_shm_request(region_in, region_out, x, out_offset=128)
    result = rest.infer("dtype_fp32", inputs, outputs=outputs)
    output = result.get_output("OUTPUT__0")
    assert output == {"name": "OUTPUT__0", "datatype": "FP32", "shape": [2, 6]}
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(region_out.handle, np.float32, output["shape"], offset=1024 + 128), x + x)

    # An input in a region with the output in JSON or binary; an inline input with the output in a region.
    for binary in (False, True):
        result = rest.infer("dtype_fp32", inputs,
                            outputs=[httpclient.InferRequestedOutput("OUTPUT__0", binary_data=binary)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x + x)
    for binary in (False, True):
        inline = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inline.set_data_from_numpy(x * 3, binary_data=binary)
        rest.infer("dtype_fp32", [inline], outputs=outputs)
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(region_out.handle, np.float32, [2, 6], offset=1024 + 128), x * 6)

    # tritonclient.http.aio, the same request.
    async def aio_infer():
        async with aiohttpclient.InferenceServerClient(shm_server.http_url) as aio:
            assert [entry["name"] for entry in await aio.get_system_shared_memory_status("hin")] == ["hin"]
            aio_inputs, aio_outputs = http_shm_request(region_in, region_out, x, out_offset=512)
            return (await aio.infer("dtype_fp32", aio_inputs, outputs=aio_outputs)).get_output("OUTPUT__0")
    assert asyncio.run(aio_infer())["shape"] == [2, 6]
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(region_out.handle, np.float32, [2, 6], offset=1024 + 512), x + x)

    rest.unregister_system_shared_memory("hin")
    assert [entry["name"] for entry in rest.get_system_shared_memory_status()] == ["hout"]
    rest.unregister_system_shared_memory()
    assert rest.get_system_shared_memory_status() == []
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_http_errors_have_tritons_codes_and_words(shm_server, rest, regions):
    region = regions("hr", 256)
    rest.register_system_shared_memory("hr", region.key, 256)
    cases = [
        (lambda: rest.register_system_shared_memory("hr", region.key, 256), "400",
         "shared memory region 'hr' already in manager"),
        (lambda: rest.register_system_shared_memory("big", region.key, 257), "400",
         "failed to register shared memory region 'big': invalid args"),
        (lambda: rest.register_system_shared_memory("nokey", "/sluice_no_such_object", 16), "400",
         "Unable to open shared memory region: '/sluice_no_such_object'"),
        (lambda: rest.get_system_shared_memory_status("nope"), "404",
         "Unable to find system shared memory region: 'nope'"),
        (lambda: rest.register_cuda_shared_memory("c", b"\0" * 64, 0, 16), "400",
         "failed to register CUDA shared memory region: 'c', GPUs not supported"),
        (lambda: rest.get_cuda_shared_memory_status("c"), "404", "Unable to find cuda shared memory region: 'c'"),
    ]
    for call, code, message in cases:
        with pytest.raises(InferenceServerException) as error:
            call()
        assert (error.value.status(), message in error.value.message()) == (code, True), (message, error.value)
    # What Triton's HTTP shared-memory examples do first: clean up CUDA regions (there are none).
    assert rest.get_cuda_shared_memory_status() == []
    rest.unregister_cuda_shared_memory()
    rest.unregister_cuda_shared_memory("c")

    # Bodies, names and methods, as Triton's endpoints refuse them.
    for method, path, body, code, words in [
            ("POST", "/v2/systemsharedmemory/register", json.dumps({"key": region.key, "byte_size": 8}), 400,
             "'region name' is necessary to register system shared memory region"),
            ("POST", "/v2/cudasharedmemory/register", "{}", 400,
             "'region name' is necessary to register cuda shared memory region"),
            ("POST", "/v2/systemsharedmemory/region/q/register", json.dumps({"byte_size": 8}), 400,
             "Shared memory register request has no 'key' field"),
            ("POST", "/v2/systemsharedmemory/region/q/register", json.dumps({"key": region.key}), 400,
             "Shared memory register request has no 'byte_size' field"),
            ("POST", "/v2/systemsharedmemory/region/q/register", "not json", 400, "not valid JSON"),
            ("GET", "/v2/systemsharedmemory/region/q/register", None, 405, "use POST"),
            ("POST", "/v2/systemsharedmemory/status", None, 405, "use GET"),
            ("GET", "/v2/systemsharedmemory/region/q/delete", None, 404, "no endpoint")]:
        status, answer = raw(shm_server, method, path, body)
        assert (status, words in answer["error"]) == (code, True), (path, status, answer)

    x = np.ones((1, 16), dtype=np.float32)
    shm.set_shared_memory_region(region.handle, [x])

    def infer_error(inputs, outputs):
        with pytest.raises(InferenceServerException) as error:
            rest.infer("dtype_fp32", inputs, outputs=outputs)
        return error.value

    inputs, outputs = http_shm_request(region, region, x)
    inputs[0].set_shared_memory("hr", 64, offset=200)  # 200 + 64 > 256
    error = infer_error(inputs, outputs)
    assert error.status() == "400"
    assert error.message().startswith("Invalid offset + byte size for shared memory region: 'hr'"), error
    inputs, outputs = http_shm_request(region, region, x)
    inputs[0].set_shared_memory("nope", 64)
    error = infer_error(inputs, outputs)
    assert (error.status(), error.message()) == ("404", "Unable to find shared memory region: 'nope' (input 'INPUT__0')")
    inputs, outputs = http_shm_request(region, region, x, out_size=32)  # the output needs 64 bytes
    error = infer_error(inputs, outputs)
    assert "output 'OUTPUT__0' has 64 bytes, more than its shared memory slice holds (32 bytes)" in error.message()
    # A raw request that sets both data and a region, and an output that asks for binary in a region.
    both = {"inputs": [{"name": "INPUT__0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16,
                        "parameters": {"shared_memory_region": "hr", "shared_memory_byte_size": 64}}]}
    status, answer = raw(shm_server, "POST", "/v2/models/dtype_fp32/infer", json.dumps(both))
    assert status == 400 and "Input must set only one of the following fields" in answer["error"], answer
    binary_too = {"inputs": [{"name": "INPUT__0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}],
                  "outputs": [{"name": "OUTPUT__0", "parameters": {"shared_memory_region": "hr",
                                                                   "shared_memory_byte_size": 64,
                                                                   "binary_data": True}}]}
    status, answer = raw(shm_server, "POST", "/v2/models/dtype_fp32/infer", json.dumps(binary_too))
    assert status == 400 and "Output can't set both 'shared_memory_region' and 'binary_data'" in answer["error"]
    # The server serves on, from the same region.
    inputs, outputs = http_shm_request(region, region, x, out_offset=64)
    rest.infer("dtype_fp32", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(region.handle, np.float32, [1, 16], offset=64), x + x)


# ---- Hostile clients.

def truncate(region, size=0):
    """What a hostile client does after registering: shrink its object (POSIX shared memory
    objects are files in /dev/shm on Linux). The client's own mapping must not be read after it."""
    os.truncate("/dev/shm" + region.key, size)


def test_a_region_truncated_after_registering_fails_the_request_and_the_server_serves_on(shm_server, client, regions):
    """The object is shrunk to 0 bytes between its registration and a request that reads (then
    one that writes) the region: without the guard the server died of SIGBUS, no answer and no log
    line. Now the request is refused INVALID_ARGUMENT, the region is unregistered, and the server
    answers the next request correctly."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    victim_in, victim_out = regions("victim_in", 8192), regions("victim_out", 8192)
    healthy_in, healthy_out = regions("healthy_in", 4096), regions("healthy_out", 4096)
    for region in (victim_in, victim_out, healthy_in, healthy_out):
        client.register_system_shared_memory(region.name, region.key, region.byte_size)
    shm.set_shared_memory_region(victim_in.handle, [x])
    shm.set_shared_memory_region(healthy_in.handle, [x])
    truncate(victim_in)
    truncate(victim_out)

    for read_from, write_to, dropped in ((victim_in, healthy_out, "victim_in"), (healthy_in, victim_out, "victim_out")):
        inputs, outputs = shm_request(read_from, write_to, x)
        with pytest.raises(InferenceServerException) as error:
            client.infer("dtype_fp32", inputs, outputs=outputs)
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT", error.value
        assert f"shared memory region '{dropped}' was truncated while the request used it" in error.value.message()
        # Unregistered: status no longer lists it, and a request naming it is told so.
        assert dropped not in client.get_system_shared_memory_status(as_json=True).get("regions", {})
        with pytest.raises(InferenceServerException, match=f"Unable to find shared memory region: '{dropped}'"):
            client.infer("dtype_fp32", inputs, outputs=outputs)

    assert client.is_server_live()
    log = shm_server.log()
    assert f"event=shm_truncated region=victim_in key={victim_in.key}" in log
    assert f"event=shm_truncated region=victim_out key={victim_out.key}" in log
    inputs, outputs = shm_request(healthy_in, healthy_out, x)
    result = client.infer("dtype_fp32", inputs, outputs=outputs)
    np.testing.assert_array_equal(read_output(result, healthy_out), x + x)


def test_http_a_region_truncated_after_registering_is_a_400_and_the_server_serves_on(shm_server, rest, regions):
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    victim, healthy = regions("hvictim", 8192), regions("hhealthy", 4096)
    rest.register_system_shared_memory(victim.name, victim.key, victim.byte_size)
    rest.register_system_shared_memory(healthy.name, healthy.key, healthy.byte_size)
    shm.set_shared_memory_region(victim.handle, [x])
    shm.set_shared_memory_region(healthy.handle, [x])
    truncate(victim)
    inputs, outputs = http_shm_request(victim, healthy, x, out_offset=2048)
    with pytest.raises(InferenceServerException) as error:
        rest.infer("dtype_fp32", inputs, outputs=outputs)
    assert error.value.status() == "400", error.value
    assert "shared memory region 'hvictim' was truncated while the request used it" in error.value.message()
    assert [entry["name"] for entry in rest.get_system_shared_memory_status()] == ["hhealthy"]

    assert rest.is_server_live()
    inputs, outputs = http_shm_request(healthy, healthy, x, out_offset=1024)
    rest.infer("dtype_fp32", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(healthy.handle, np.float32, [1, 16], offset=1024), x + x)


def test_keys_outside_the_allowed_prefixes_and_keys_that_are_no_posix_name_are_refused(shm_server, client, rest):
    """The server allows /sluice_ keys only: an object of another name is not opened, even though
    it exists and the server's user could open it. A key with a NUL byte (which shm_open would cut
    short) or more than one '/' is no POSIX shared memory name."""
    key = f"/other_app_{os.getpid()}"
    handle = shm.create_shared_memory_region("other", key, 64)
    try:
        with pytest.raises(InferenceServerException) as error:
            client.register_system_shared_memory("other", key, 64)
        assert error.value.status() == "StatusCode.PERMISSION_DENIED", error.value
        assert f"shared memory key '{key}' is not allowed: this server accepts keys starting with '/sluice_'" \
            in error.value.message()
        with pytest.raises(InferenceServerException) as error:
            rest.register_system_shared_memory("other", key, 64)
        assert error.value.status() == "403", error.value
        assert not client.get_system_shared_memory_status(as_json=True).get("regions")
    finally:
        shm.destroy_shared_memory_region(handle)

    for bad, problem in ((f"/sluice_nul_{os.getpid()}\0/../etc", "it holds a NUL byte"),
                         ("/sluice_dir/object", "only its first character may be '/'"),
                         ("sluice_no_slash", "it must be '/' followed by a name")):
        with pytest.raises(InferenceServerException) as error:
            client.register_system_shared_memory("bad", bad, 64)
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT", (bad, error.value)
        assert problem in error.value.message(), (bad, error.value)
        status, answer = raw(shm_server, "POST", "/v2/systemsharedmemory/region/bad/register",
                             json.dumps({"key": bad, "byte_size": 64}))
        assert (status, problem in answer["error"]) == (400, True), (bad, answer)


def test_without_client_shm_keys_every_registration_is_refused(test_repository, tmp_path_factory, regions):
    """--allow-client-shm=true alone allows no key: registrations are PERMISSION_DENIED with the
    flag to set, and the server warns at start-up."""
    server = start_server(test_repository, tmp_path_factory,
                          ["--strict-readiness", "false", "--device", "cpu", "--allow-client-shm=true"])
    try:
        region = regions("nokeys", 64)
        client = grpcclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException) as error:
            client.register_system_shared_memory("nokeys", region.key, 64)
        assert error.value.status() == "StatusCode.PERMISSION_DENIED", error.value
        assert "--client-shm-keys=<prefix>" in error.value.message()
        assert not client.get_system_shared_memory_status(as_json=True).get("regions")
        client.close()
        rest = httpclient.InferenceServerClient(server.http_url)
        with pytest.raises(InferenceServerException) as error:
            rest.register_system_shared_memory("nokeys", region.key, 64)
        assert error.value.status() == "403", error.value
        rest.close()
        assert "event=client_shm_keys_unset" in server.log()
    finally:
        assert server.stop() == 0, server.log()
