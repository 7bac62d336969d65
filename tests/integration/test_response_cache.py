"""The response cache (config.pbtxt `response_cache { enable: true }`, `--cache-config
local,size=BYTES`) against the real server with tritonclient over gRPC and HTTP: identical requests
answered from the cache (the model adds random noise, so a hit shows as the same bytes), the
statistics extension's cache_hit / cache_miss and Triton's cache metrics, outputs into system
shared memory on a hit, entries dropped on unload and reload, the byte bound under many distinct
requests, a model that enables the cache on a server without one, and single flight (identical
requests that come while one is queued share its run; a cancel leaves the others waiting)."""
import os
import subprocess
import threading
import time

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException
from torch import nn

from conftest import SERVER, start_server
from harness.server import metric_value as metric
from make_test_repository import Spin, tensor_block, write_model


class Noisy(nn.Module):
    """OUTPUT__0: x plus fresh noise (no two runs agree); OUTPUT__1: 2x."""

    def forward(self, x):
        return x + torch.rand_like(x), x * 2


def noisy_config(cache):
    return ('platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
            + tensor_block("input", "INPUT__0", "TYPE_FP32", [16])
            + 'output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 16 ] },'
              ' { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 16 ] }]\n'
            + "dynamic_batching { }\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
            + ("response_cache { enable: true }\n" if cache else ""))


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("response_cache")
    write_model(root, "cached", noisy_config(True), Noisy())
    write_model(root, "plain", noisy_config(False), Noisy())
    write_model(root, "spin", 'platform: "pytorch_libtorch"\nmax_batch_size: 1\n'
                + tensor_block("input", "INPUT__0", "TYPE_FP32", [2])
                + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [2])
                + "dynamic_batching { }\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
                + "response_cache { enable: true }\n", Spin(noise=True))
    return root


def grpc_infer(client, model, x, outputs=None, **kwargs):
    inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client.infer(model, [inp], outputs=requested, **kwargs)


def http_infer(client, model, x, binary=True):
    inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in ("OUTPUT__0", "OUTPUT__1")]
    return client.infer(model, [inp], outputs=outputs)


def test_identical_requests_are_answered_from_the_cache_over_grpc_and_http(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, ["--device", "cpu", "--cache-config", "local,size=1048576"])
    client = grpcclient.InferenceServerClient(server.url)
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        first = grpc_infer(client, "cached", x, request_id="first")
        noisy = first.as_numpy("OUTPUT__0")
        assert not np.array_equal(noisy, x) and np.all((noisy >= x) & (noisy < x + 1))
        again = grpc_infer(client, "cached", x, request_id="again")
        np.testing.assert_array_equal(again.as_numpy("OUTPUT__0"), noisy)  # the same bytes: a hit
        np.testing.assert_array_equal(again.as_numpy("OUTPUT__1"), x * 2)
        response = again.get_response()
        assert response.model_name == "cached" and response.model_version == "1" and response.id == "again"
        assert [o.name for o in response.outputs] == ["OUTPUT__0", "OUTPUT__1"]
        assert [list(o.shape) for o in response.outputs] == [[1, 16], [1, 16]]
        # Over HTTP, binary and JSON: the same cached answer.
        for binary in (True, False):
            answer = http_infer(http, "cached", x, binary)
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT__0"), noisy)
        # Another input, or another choice of outputs, is another request.
        other = grpc_infer(client, "cached", x + 1)
        assert not np.array_equal(other.as_numpy("OUTPUT__0"), noisy + 1)
        only_doubled = grpc_infer(client, "cached", x, outputs=["OUTPUT__1"])
        assert [o.name for o in only_doubled.get_response().outputs] == ["OUTPUT__1"]
        np.testing.assert_array_equal(only_doubled.as_numpy("OUTPUT__1"), x * 2)
        # Two rows in one request: cached as a whole.
        two = np.stack([x[0], x[0] + 5])
        batch = grpc_infer(client, "cached", two).as_numpy("OUTPUT__0")
        np.testing.assert_array_equal(grpc_infer(client, "cached", two).as_numpy("OUTPUT__0"), batch)
        # A model without response_cache runs every request.
        plain = [grpc_infer(client, "plain", x).as_numpy("OUTPUT__0") for _ in range(2)]
        assert not np.array_equal(plain[0], plain[1])

        # Hits: again, http x2, the batch's second. Misses: first, other, only_doubled, batch's first.
        (stats,) = client.get_inference_statistics("cached", as_json=True)["model_stats"]
        inference = stats["inference_stats"]
        assert int(inference["cache_hit"]["count"]) == 4 and int(inference["cache_hit"]["ns"]) > 0, inference
        assert int(inference["cache_miss"]["count"]) == 4 and int(inference["cache_miss"]["ns"]) > 0, inference
        assert int(inference["success"]["count"]) == 8, inference
        assert int(stats["inference_count"]) == 5, stats  # rows that ran: 1 + 1 + 1 + 2
        (http_stats,) = http.get_inference_statistics("cached")["model_stats"]
        assert int(http_stats["inference_stats"]["cache_hit"]["count"]) == 4, http_stats
        (plain_stats,) = client.get_inference_statistics("plain", as_json=True)["model_stats"]
        assert int(plain_stats["inference_stats"].get("cache_miss", {}).get("count", 0)) == 0, plain_stats

        text = server.metrics_text()
        assert metric(text, 'nv_cache_num_hits_per_model{model="cached",version="1"}') == 4, text
        assert metric(text, 'nv_cache_num_misses_per_model{model="cached",version="1"}') == 4, text
        assert metric(text, 'nv_cache_hit_duration_per_model{model="cached",version="1"}') > 0, text
        assert metric(text, 'nv_inference_request_success{model="cached",version="1"}') == 8, text
        assert metric(text, "sluice_response_cache_entries") == 4, text
        assert metric(text, "sluice_response_cache_limit_bytes") == 1048576, text
        assert 0 < metric(text, "sluice_response_cache_bytes") <= 1048576, text
        assert 'nv_cache_num_hits_per_model{model="plain"' not in text
    finally:
        http.close()
        client.close()
        assert server.stop() == 0, server.log()


def test_a_hit_writes_its_outputs_into_shared_memory(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--cache-config", "local,size=1048576", "--allow-client-shm=true",
                           "--client-shm-keys=/sluice_cache_"])
    client = grpcclient.InferenceServerClient(server.url)
    http = httpclient.InferenceServerClient(server.http_url)
    key = f"/sluice_cache_out_{os.getpid()}"
    small_key = f"/sluice_cache_small_{os.getpid()}"
    in_key = f"/sluice_cache_in_{os.getpid()}"
    in_region = None
    region = shm.create_shared_memory_region("cache_out", key, 64)
    small = shm.create_shared_memory_region("cache_small", small_key, 32)
    try:
        client.register_system_shared_memory("cache_out", key, 64)
        client.register_system_shared_memory("cache_small", small_key, 32)
        x = np.full((1, 16), 3, dtype=np.float32)
        # A miss, answered in the message; the hits below write the same bytes into the region.
        first = grpc_infer(client, "cached", x, outputs=["OUTPUT__0"]).as_numpy("OUTPUT__0")

        def into_region(protocol, value=x):
            shm.set_shared_memory_region(region, [np.zeros((1, 16), dtype=np.float32)])
            module = grpcclient if protocol == "grpc" else httpclient
            inp = module.InferInput("INPUT__0", [1, 16], "FP32")
            inp.set_data_from_numpy(value)
            out = module.InferRequestedOutput("OUTPUT__0")
            out.set_shared_memory("cache_out", 64)
            result = (client if protocol == "grpc" else http).infer("cached", [inp], outputs=[out])
            assert result.get_output("OUTPUT__0") is not None
            return shm.get_contents_as_numpy(region, np.float32, [1, 16])

        def into_region_for(value):
            return into_region("grpc", value).copy()

        for protocol in ("grpc", "http"):
            np.testing.assert_array_equal(into_region(protocol), first)
        # A slice too small for the cached output: Triton's kind of error, and the server serves on.
        inp = grpcclient.InferInput("INPUT__0", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        out = grpcclient.InferRequestedOutput("OUTPUT__0")
        out.set_shared_memory("cache_small", 32)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("cached", [inp], outputs=[out])
        assert "more than its shared memory slice holds" in refused.value.message()
        again = grpc_infer(client, "cached", x, outputs=["OUTPUT__0"]).as_numpy("OUTPUT__0")
        np.testing.assert_array_equal(again, first)

        # A request that reads its input from, or writes its output to, shared memory is kept
        # too: it runs on a copy of its inputs taken when it arrived (the cache key's), and its
        # outputs are written where the client cannot rewrite them before they are copied into its
        # region, so its answer is the key's.
        def shm_input(value, protocol="grpc"):
            shm.set_shared_memory_region(in_region, [np.full((1, 16), value, dtype=np.float32)])
            module = grpcclient if protocol == "grpc" else httpclient
            inp = module.InferInput("INPUT__0", [1, 16], "FP32")
            inp.set_shared_memory("cache_in", 64)
            out = module.InferRequestedOutput("OUTPUT__0")
            result = (client if protocol == "grpc" else http).infer("cached", [inp], outputs=[out])
            return result.as_numpy("OUTPUT__0")

        in_region = shm.create_shared_memory_region("cache_in", in_key, 64)
        client.register_system_shared_memory("cache_in", in_key, 64)
        runs = [shm_input(7), shm_input(7, "http")]
        np.testing.assert_array_equal(runs[1], runs[0])  # the first was kept
        kept = grpc_infer(client, "cached", np.full((1, 16), 7, dtype=np.float32), outputs=["OUTPUT__0"])
        np.testing.assert_array_equal(kept.as_numpy("OUTPUT__0"), runs[0])
        written = into_region_for(np.full((1, 16), 8, dtype=np.float32))
        from_message = grpc_infer(client, "cached", np.full((1, 16), 8, dtype=np.float32), outputs=["OUTPUT__0"])
        np.testing.assert_array_equal(from_message.as_numpy("OUTPUT__0"), written)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(region)
        shm.destroy_shared_memory_region(small)
        if in_region is not None:
            shm.destroy_shared_memory_region(in_region)
        http.close()
        client.close()
        assert server.stop() == 0, server.log()


def test_identical_requests_in_flight_share_one_run_and_a_cancel_leaves_the_others(repository, tmp_path_factory):
    """Single flight: identical requests that come while the first is queued wait for its run (one
    run, the same noisy bytes for all, over gRPC and HTTP); the first one's caller cancels and the
    others are answered unharmed."""
    server = start_server(repository, tmp_path_factory, ["--device", "cpu", "--cache-config", "local,size=1048576"])
    client = grpcclient.InferenceServerClient(server.url)
    answers = {}
    lock = threading.Lock()

    def keep(name):
        def callback(result, error):
            with lock:
                answers[name] = error if error is not None else result.as_numpy("OUTPUT__0")
        return callback

    def spin_input(steps, tag, module=grpcclient):
        inp = module.InferInput("INPUT__0", [1, 2], "FP32")
        inp.set_data_from_numpy(np.array([[steps, tag]], dtype=np.float32))
        return inp

    def http_call(name):
        with httpclient.InferenceServerClient(server.http_url) as http:
            try:
                result = http.infer("spin", [spin_input(2000, 1, httpclient)]).as_numpy("OUTPUT__0")
            except InferenceServerException as error:
                result = error
        with lock:
            answers[name] = result

    def statistics():
        (stats,) = client.get_inference_statistics("spin", as_json=True)["model_stats"]
        return stats

    try:
        before = int(statistics().get("execution_count", 0))
        # The blocker holds the one instance (about a second) while the identical requests queue.
        client.async_infer("spin", [spin_input(150000, 0)], keep("blocker"))
        time.sleep(0.2)
        leader = client.async_infer("spin", [spin_input(2000, 1)], keep("leader"))
        time.sleep(0.05)
        http_thread = threading.Thread(target=http_call, args=("http",))
        http_thread.start()
        client.async_infer("spin", [spin_input(2000, 1)], keep("grpc"))
        time.sleep(0.1)
        leader.cancel()  # the first one's caller goes away; the run stays for the others
        http_thread.join(timeout=60)
        deadline = time.monotonic() + 60
        while len(answers) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert set(answers) == {"blocker", "leader", "http", "grpc"}, answers
        assert isinstance(answers["leader"], InferenceServerException), answers
        for name in ("http", "grpc"):
            assert isinstance(answers[name], np.ndarray), answers[name]
        noisy = answers["grpc"]
        assert not np.array_equal(noisy, np.array([[2000, 1]], dtype=np.float32))
        np.testing.assert_array_equal(answers["http"], noisy)  # one run's bytes for both
        stats = statistics()
        assert int(stats["execution_count"]) - before == 2, stats  # the blocker and one shared run
        text = server.metrics_text()
        assert metric(text, 'sluice_cache_shared_answers_total{model="spin",version="1"}') == 1, text
        # The shared answer was kept: the next identical request is a hit with the same bytes.
        again = client.infer("spin", [spin_input(2000, 1)]).as_numpy("OUTPUT__0")
        np.testing.assert_array_equal(again, noisy)
    finally:
        client.close()
        assert server.stop() == 0, server.log()


def test_unload_and_reload_drop_the_versions_answers(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--cache-config", "local,size=1048576",
                           "--model-control-mode", "explicit", "--load-model", "cached"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        x = np.ones((1, 16), dtype=np.float32)
        before = grpc_infer(client, "cached", x).as_numpy("OUTPUT__0")
        np.testing.assert_array_equal(grpc_infer(client, "cached", x).as_numpy("OUTPUT__0"), before)
        assert metric(server.metrics_text(), "sluice_response_cache_entries") == 1
        client.load_model("cached")  # a reload: the new version starts with nothing cached
        assert metric(server.metrics_text(), "sluice_response_cache_entries") == 0
        reloaded = grpc_infer(client, "cached", x).as_numpy("OUTPUT__0")
        assert not np.array_equal(reloaded, before)
        client.unload_model("cached")
        assert metric(server.metrics_text(), "sluice_response_cache_entries") == 0
        client.load_model("cached")
        assert not np.array_equal(grpc_infer(client, "cached", x).as_numpy("OUTPUT__0"), reloaded)
    finally:
        client.close()
        assert server.stop() == 0, server.log()


def test_the_cache_stays_within_its_size(repository, tmp_path_factory):
    """A 64 KiB cache is sixteen 4 KiB segments; an entry (a 64-byte input in its key, 128 output
    bytes, a header) takes about 350 bytes of one, so 600 distinct requests evict the oldest
    segments over and over; the mapped bytes never pass the size."""
    size = 65536
    server = start_server(repository, tmp_path_factory, ["--device", "cpu", "--cache-config", f"local,size={size}"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        peak = 0
        for i in range(600):
            grpc_infer(client, "cached", np.full((1, 16), i, dtype=np.float32))
            if i % 50 == 0:
                peak = max(peak, metric(server.metrics_text(), "sluice_response_cache_bytes"))
        text = server.metrics_text()
        peak = max(peak, metric(text, "sluice_response_cache_bytes"))
        assert 0 < peak <= size, text
        assert 0 < metric(text, "sluice_response_cache_used_bytes") <= peak, text
        entries = metric(text, "sluice_response_cache_entries")
        assert 100 <= entries <= 200, text
        assert metric(text, "sluice_response_cache_evictions_total") == 600 - entries, text
        # The most recent answer is still there; the first is long gone.
        last = np.full((1, 16), 599, dtype=np.float32)
        np.testing.assert_array_equal(grpc_infer(client, "cached", last).as_numpy("OUTPUT__0"),
                                      grpc_infer(client, "cached", last).as_numpy("OUTPUT__0"))
        hits = metric(server.metrics_text(), 'nv_cache_num_hits_per_model{model="cached",version="1"}')
        grpc_infer(client, "cached", np.full((1, 16), 0, dtype=np.float32))
        assert metric(server.metrics_text(), 'nv_cache_num_hits_per_model{model="cached",version="1"}') == hits
    finally:
        client.close()
        assert server.stop() == 0, server.log()


def test_without_a_server_cache_the_model_runs_uncached_and_says_so(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, ["--device", "cpu"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        x = np.ones((1, 16), dtype=np.float32)
        answers = [grpc_infer(client, "cached", x).as_numpy("OUTPUT__0") for _ in range(2)]
        assert not np.array_equal(answers[0], answers[1])
        assert "event=response_cache_off model=cached" in server.log()
        assert "--cache-config local,size=BYTES" in server.log()
        assert "sluice_response_cache_bytes" not in server.metrics_text()
    finally:
        client.close()
        assert server.stop() == 0, server.log()


def test_a_bad_cache_config_is_refused_at_start(repository):
    for flag, words in (("redis,host=x", "Sluice has the local cache only"),
                        ("local,size=lots", "size must be a positive number of bytes")):
        done = subprocess.run([SERVER, "--model-repository", str(repository), "--cache-config", flag],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr, done.stderr


def test_perf_analyzer_runs_against_a_cached_model(repository, tmp_path_factory, tmp_path):
    """Triton's perf_analyzer, over gRPC and then HTTP, sends the same random input every time:
    after the first, hits. It reads the cache's statistics and reports them in its CSV without an
    error."""
    from harness import perf_analyzer
    server = start_server(repository, tmp_path_factory, ["--device", "cpu", "--cache-config", "local,size=1048576"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        for protocol, url in (("grpc", server.url), ("http", server.http_url)):
            row = perf_analyzer.run(url, "cached", 4, str(tmp_path / f"{protocol}.csv"), smoke=True,
                                    protocol=("-i", protocol))
            assert float(row["Inferences/Second"]) > 0, row
            # perf_analyzer read the server's cache statistics (its average, in whole microseconds,
            # may round to 0: a hit takes about a microsecond here).
            assert "Server Cache Hit" in row and "Server Cache Miss" in row, row
        (stats,) = client.get_inference_statistics("cached", as_json=True)["model_stats"]
        inference = stats["inference_stats"]
        assert int(inference["cache_hit"]["count"]) > 10 * int(inference["cache_miss"]["count"]), inference
        assert "fail" not in inference or int(inference["fail"].get("count", 0)) == 0, inference
    finally:
        client.close()
        assert server.stop() == 0, server.log()
