"""KServe's own Python SDK against the real sluice-server: its REST client (InferenceRESTClient with
protocol v2) reads readiness from JSON bodies ({"live": true}, {"ready": true}), where tritonclient
reads only status codes, and infers with its own request and response types.

The SDK lives in ./.venv-kserve (scripts/setup.sh; kserve and tritonclient register the same
protobuf names, so they cannot share a process): the checks run there, in a child process, and
print what they saw as JSON."""
import json
import os
import subprocess

from conftest import ROOT

KSERVE_PYTHON = os.path.join(ROOT, ".venv-kserve", "bin", "python")

CLIENT = """
import asyncio, json, sys
import httpx
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

async def main(base_url):
    client = InferenceRESTClient(config=RESTConfig(protocol="v2", timeout=30))
    seen = {}
    try:
        seen["live"] = await client.is_server_live(base_url)
        seen["ready"] = await client.is_server_ready(base_url)
        seen["model_ready"] = await client.is_model_ready(base_url, "dtype_fp32")
        seen["broken_model_ready"] = await client.is_model_ready(base_url, "wrong_arity")
        request = InferRequest(model_name="dtype_fp32", request_id="k-1", infer_inputs=[
            InferInput(name="INPUT__0", shape=[2, 3], datatype="FP32", data=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])])
        response = await client.infer(base_url, request, model_name="dtype_fp32")
        seen["id"] = response.id
        seen["outputs"] = [(output.name, output.shape, output.datatype, list(output.data))
                           for output in response.outputs]
        try:
            await client.infer(base_url, request, model_name="no_such_model")
        except httpx.HTTPStatusError as error:
            seen["unknown_model"] = [error.response.status_code, error.response.json()["error"]]
    finally:
        await client.close()
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1]))
"""


def test_kserve_rest_client(server):
    assert os.path.exists(KSERVE_PYTHON), f"{KSERVE_PYTHON} is missing: run scripts/setup.sh"
    result = subprocess.run([KSERVE_PYTHON, "-c", CLIENT, f"http://{server.http_url}"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["live"] is True and seen["ready"] is True
    assert seen["model_ready"] is True and seen["broken_model_ready"] is False
    assert seen["id"] == "k-1"
    assert seen["outputs"] == [["OUTPUT__0", [2, 3], "FP32", [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]]]
    assert seen["unknown_model"] == [404, "Request for unknown model: 'no_such_model' is not found"]
