"""Request tracing end to end: callers with a parent span from the OpenTelemetry Python SDK (gRPC
unary and stream, HTTP) against the real server, which exports its spans over OTLP/HTTP to a
receiver in this test that decodes them with the official OTLP protobuf definitions (PyPI's
opentelemetry-proto). Checks that the server's spans are children of the caller's, that their
timings nest and add up, that a batch span links every traced request in it, that sampling and
the trace settings API (guarded by the "trace" protocol group) work, and that an unreachable
collector changes nothing for clients.
"""
import http.server
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from tritonclient.utils import InferenceServerException

from conftest import free_port, start_server, wait_models_loaded
from harness.server import metric_value

TRACE_KEY = {"trace-key": "s3cret"}  # the "trace" group's guard on both protocols
KIND_SERVER, KIND_INTERNAL = 2, 1
STATUS_ERROR = 2


class Collector:
    """An OTLP/HTTP receiver on 127.0.0.1: decodes each POST /v1/traces body as an
    ExportTraceServiceRequest and keeps its spans (with their resource attributes)."""

    def __init__(self):
        self.spans = []
        self.resources = []
        self.bad_bodies = 0
        self.lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = trace_service_pb2.ExportTraceServiceRequest()
                try:
                    request.ParseFromString(body)
                    ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
                except Exception:  # noqa: BLE001 (a body that is no OTLP fails the test below)
                    ok = False
                with collector.lock:
                    if not ok:
                        collector.bad_bodies += 1
                    for resource_spans in request.resource_spans:
                        collector.resources.append({kv.key: kv.value.string_value
                                                    for kv in resource_spans.resource.attributes})
                        for scope in resource_spans.scope_spans:
                            collector.spans.extend(scope.spans)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace_id):
        with self.lock:
            return [span for span in self.spans if span.trace_id.hex() == trace_id]

    def wait_for(self, predicate, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [span for span in self.spans if predicate(span)]
            if found:
                return found
            time.sleep(0.05)
        return []

    def wait_trace(self, trace_id, names, timeout=15.0):
        """The spans of `trace_id` once every name in `names` is among them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.of_trace(trace_id)
            if set(names) <= {span.name for span in spans}:
                return spans
            time.sleep(0.05)
        raise AssertionError(f"trace {trace_id}: {names} not all exported; got "
                             f"{sorted(span.name for span in self.of_trace(trace_id))}")


def attributes(span):
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = value.int_value if value.HasField("int_value") else value.string_value
    return out


def tracing_args(url, *settings):
    """The test repository on the CPU, traced at level TIMESTAMPS into `url`, with `settings`."""
    args = ["--strict-readiness", "false", "--device", "cpu", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"opentelemetry,url={url}"]
    for setting in settings:
        args += ["--trace-config", setting]
    return args


@pytest.fixture(scope="module")
def collector():
    receiver = Collector()
    yield receiver
    receiver.server.shutdown()
    assert receiver.bad_bodies == 0


@pytest.fixture(scope="module")
def traced_server(test_repository, tmp_path_factory, collector):
    # Level on, but a rate so high that only callers with a trace context (and the first request)
    # are traced until a test changes the settings.
    server = start_server(test_repository, tmp_path_factory, tracing_args(
        collector.url, "rate=1000000000", "opentelemetry,bsp_schedule_delay=100",
        "opentelemetry,resource=deployment.environment=test") + [
        "--grpc-restricted-protocol", "trace:trace-key=s3cret", "--http-restricted-api", "trace:trace-key=s3cret"])
    wait_models_loaded(server)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def caller():
    """An OpenTelemetry SDK tracer whose finished spans stay in memory."""
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider.get_tracer("sluice-tests")


def rows(n=1, value=1.0):
    return np.full((n, 4), value, dtype=np.float32)


def grpc_inputs(data):
    tensor = grpcclient.InferInput("INPUT__0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def http_inputs(data):
    tensor = httpclient.InferInput("INPUT__0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    return [tensor]


def call_with_parent(caller, send):
    """Runs send(headers) inside a new caller span; (its trace id, span id, start, end)."""
    with caller.start_as_current_span("caller") as span:
        headers = {}
        TraceContextTextMapPropagator().inject(headers)
        send(headers)
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}", span.start_time, span.end_time


def check_request_spans(spans, parent_span_id, start, name, model, protocol):
    """The request span is the caller's child, starting after it did (it may end a moment after
    the caller's span: the server stamps the end once the answer is handed over, while the client
    may already have it); queue, compute and output are the request span's children, each within
    it, one after another, adding up to no more."""
    by_name = {span.name: span for span in spans}
    request = by_name[name]
    assert request.parent_span_id.hex() == parent_span_id
    assert request.kind == KIND_SERVER
    assert start <= request.start_time_unix_nano <= request.end_time_unix_nano
    assert attributes(request)["sluice.model"] == model
    assert attributes(request)["sluice.protocol"] == protocol
    assert attributes(request)["sluice.status"] == "OK"
    assert request.status.code != STATUS_ERROR
    queue, compute, output = by_name["queue"], by_name["compute"], by_name["output"]
    for child in (queue, compute, output):
        assert child.parent_span_id == request.span_id
        assert child.kind == KIND_INTERNAL
        assert request.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= request.end_time_unix_nano
    assert queue.end_time_unix_nano == compute.start_time_unix_nano
    assert compute.end_time_unix_nano == output.start_time_unix_nano
    children = sum(c.end_time_unix_nano - c.start_time_unix_nano for c in (queue, compute, output))
    assert children <= request.end_time_unix_nano - request.start_time_unix_nano
    assert len(compute.links) == 1  # to its batch's span
    return request, compute


def test_a_grpc_call_with_a_parent_span_gets_child_spans_that_nest(traced_server, collector, caller):
    client = grpcclient.InferenceServerClient(traced_server.url)
    answers = []
    trace_id, span_id, start, _ = call_with_parent(
        caller, lambda headers: answers.append(client.infer("batched", grpc_inputs(rows()), headers=headers)))
    assert answers[0].as_numpy("OUTPUT__0").shape == (1, 4)
    name = "inference.GRPCInferenceService/ModelInfer"
    spans = collector.wait_trace(trace_id, [name, "queue", "compute", "output"])
    request, compute = check_request_spans(spans, span_id, start, name, "batched", "grpc")
    assert attributes(request)["sluice.model_version"] == 1
    # The batch span it ran in: a trace of its own, linked back to this request.
    batch = collector.wait_for(lambda span: span.span_id == compute.links[0].span_id)
    assert batch and batch[0].name == "batch"
    assert any(link.span_id == request.span_id and link.trace_id == request.trace_id for link in batch[0].links)
    batch_attributes = attributes(batch[0])
    assert batch_attributes["sluice.model"] == "batched"
    assert batch_attributes["sluice.device"].startswith("cpu")
    assert batch_attributes["sluice.batch.padded_rows"] >= batch_attributes["sluice.batch.rows"] >= 1
    client.close()


def test_an_http_call_and_a_stream_with_a_parent_span(traced_server, collector, caller):
    client = httpclient.InferenceServerClient(traced_server.http_url)
    trace_id, span_id, start, _ = call_with_parent(
        caller, lambda headers: client.infer("batched", http_inputs(rows()), headers=headers))
    name = "POST /v2/models/{model}/infer"
    spans = collector.wait_trace(trace_id, [name, "queue", "compute", "output"])
    check_request_spans(spans, span_id, start, name, "batched", "http")
    client.close()

    stream_client = grpcclient.InferenceServerClient(traced_server.url)
    results = []
    done = threading.Event()

    def on_answer(result, error):
        results.append(error or result)
        done.set()

    def send(headers):
        stream_client.start_stream(callback=on_answer, headers=headers)
        stream_client.async_stream_infer("batched", grpc_inputs(rows()))
        assert done.wait(30)
        stream_client.stop_stream()

    trace_id, span_id, start, _ = call_with_parent(caller, send)
    assert not isinstance(results[0], InferenceServerException), results[0]
    name = "inference.GRPCInferenceService/ModelStreamInfer"
    spans = collector.wait_trace(trace_id, [name, "queue", "compute", "output"])
    check_request_spans(spans, span_id, start, name, "batched", "grpc")
    stream_client.close()


def test_a_batch_span_links_each_traced_request_in_it(traced_server, collector, caller):
    # "batched": preferred batch size 4, 5 ms queue delay. Four callers at once, several times:
    # their requests run together, and the batch span links each of them.
    def one(_):
        client = grpcclient.InferenceServerClient(traced_server.url)
        try:
            trace_id, _, _, _ = call_with_parent(
                caller, lambda headers: client.infer("batched", grpc_inputs(rows()), headers=headers))
            return trace_id
        finally:
            client.close()

    best = 0
    for _ in range(5):
        with ThreadPoolExecutor(4) as pool:
            trace_ids = set(pool.map(one, range(4)))
        requests = {}
        for trace_id in trace_ids:
            spans = collector.wait_trace(trace_id, ["inference.GRPCInferenceService/ModelInfer", "compute"])
            by_name = {span.name: span for span in spans}
            requests[by_name["inference.GRPCInferenceService/ModelInfer"].span_id] = by_name["compute"]
        batch_ids = {compute.links[0].span_id for compute in requests.values()}
        for batch_id in batch_ids:
            batch = collector.wait_for(lambda span, wanted=batch_id: span.span_id == wanted)[0]
            linked = {link.span_id for link in batch.links}
            # Every request whose compute span points at this batch is linked from it.
            assert {rid for rid, compute in requests.items() if compute.links[0].span_id == batch_id} <= linked
            assert attributes(batch)["sluice.batch.requests"] >= len(linked)
            best = max(best, len(linked))
        if best >= 2:
            break
    assert best >= 2, "four concurrent requests never shared a batch in five tries"


def test_sampling_follows_the_trace_settings_api_on_both_protocols(traced_server, collector):
    grpc_client = grpcclient.InferenceServerClient(traced_server.url)
    http_client = httpclient.InferenceServerClient(traced_server.http_url)
    # Guarded: without the header, refused.
    with pytest.raises(InferenceServerException, match="trace"):
        grpc_client.get_trace_settings()
    with pytest.raises(InferenceServerException):
        http_client.get_trace_settings()
    settings = grpc_client.get_trace_settings(headers=TRACE_KEY, as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["TIMESTAMPS"]
    assert settings["trace_rate"]["value"] == ["1000000000"]
    assert settings["trace_mode"]["value"] == ["opentelemetry"]

    # "padded" alone: one request in two, three traces at most.
    updated = grpc_client.update_trace_settings(model_name="padded", settings={"trace_rate": "2", "trace_count": "3"},
                                                headers=TRACE_KEY, as_json=True)["settings"]
    assert updated["trace_rate"]["value"] == ["2"] and updated["trace_count"]["value"] == ["3"]
    since = time.time_ns()
    for _ in range(10):
        grpc_client.infer("padded", grpc_inputs(rows()))
    name = "inference.GRPCInferenceService/ModelInfer"

    def padded_roots(span):
        return (span.name == name and span.start_time_unix_nano >= since
                and attributes(span).get("sluice.model") == "padded")

    deadline = time.monotonic() + 15
    while len(collector.wait_for(padded_roots)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # five export periods more: a fourth trace, if there were one, would be here
    assert len(collector.wait_for(padded_roots)) == 3
    left = http_client.get_trace_settings(model_name="padded", headers=TRACE_KEY)
    assert left["trace_count"] == "0" and left["trace_rate"] == "2"
    # The server's settings are untouched by the model's.
    assert http_client.get_trace_settings(headers=TRACE_KEY)["trace_rate"] == "1000000000"

    # Over HTTP: the model's level OFF stops even callers with a trace context; clearing it
    # (null) gives the server's settings back.
    off = http_client.update_trace_settings(model_name="padded", settings={"trace_level": ["OFF"]}, headers=TRACE_KEY)
    assert off["trace_level"] == ["OFF"]
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    grpc_client.infer("padded", grpc_inputs(rows()), headers={"traceparent": parent})
    cleared = http_client.update_trace_settings(
        model_name="padded", settings={"trace_level": None, "trace_rate": None, "trace_count": None}, headers=TRACE_KEY)
    assert cleared["trace_level"] == ["TIMESTAMPS"] and cleared["trace_rate"] == "1000000000"
    grpc_client.infer("padded", grpc_inputs(rows()), headers={"traceparent": parent.replace("cd", "ef")})
    traced = collector.wait_for(lambda span: span.trace_id.hex() == "ab" * 16 and span.name == name)
    assert len(traced) == 1 and traced[0].parent_span_id.hex() == "ef" * 8

    # Bad settings: a clear error, nothing changed; the export URL is not a setting.
    for bad, words in (({"trace_rate": "0"}, "trace_rate"), ({"trace_level": ["TENSORS"]}, "TENSORS"),
                       ({"url": "http://elsewhere:4318/v1/traces"}, "unknown trace setting 'url'"),
                       ({"trace_file": "/tmp/x"}, "cannot be changed")):
        with pytest.raises(InferenceServerException, match=words):
            grpc_client.update_trace_settings(settings=bad, headers=TRACE_KEY)
        with pytest.raises(InferenceServerException, match=words):
            http_client.update_trace_settings(settings=bad, headers=TRACE_KEY)
    with pytest.raises(InferenceServerException, match="no_such_model|unknown|not found"):
        grpc_client.get_trace_settings(model_name="no_such_model", headers=TRACE_KEY)
    assert grpc_client.get_trace_settings(headers=TRACE_KEY, as_json=True)["settings"]["trace_rate"]["value"] == [
        "1000000000"]
    grpc_client.close()
    http_client.close()


def test_failures_are_recorded_on_the_span_and_spans_are_counted(traced_server, collector, caller):
    client = grpcclient.InferenceServerClient(traced_server.url)

    def send(headers):
        with pytest.raises(InferenceServerException):
            client.infer("batched", grpc_inputs(rows(1)[:, :3]), headers=headers)  # wrong shape

    trace_id, span_id, _, _ = call_with_parent(caller, send)
    name = "inference.GRPCInferenceService/ModelInfer"
    request = [span for span in collector.wait_trace(trace_id, [name]) if span.name == name][0]
    assert request.parent_span_id.hex() == span_id
    assert request.status.code == STATUS_ERROR and "INPUT__0" in request.status.message
    assert attributes(request)["sluice.status"] == "INVALID_ARGUMENT"
    # Refused before any version was found: the span still names the model asked for.
    trace_id, _, _, _ = call_with_parent(caller, lambda headers: pytest.raises(
        InferenceServerException, client.infer, "no_such_model", grpc_inputs(rows()), headers=headers))
    (missing,) = [span for span in collector.wait_trace(trace_id, [name]) if span.name == name]
    assert attributes(missing)["sluice.model"] == "no_such_model"
    assert attributes(missing)["sluice.status"] == "NOT_FOUND" and missing.status.code == STATUS_ERROR
    assert len(collector.of_trace(trace_id)) == 1  # no stage reached
    assert {"deployment.environment": "test", "service.name": "sluice"}.items() <= collector.resources[-1].items()
    text = traced_server.metrics_text()
    assert metric_value(text, "sluice_trace_spans_exported_total") >= 4
    assert metric_value(text, 'sluice_trace_spans_dropped_total{reason="queue_full"}') == 0
    client.close()


def test_an_unreachable_collector_changes_nothing_for_clients(test_repository, tmp_path_factory):
    closed = free_port()  # nothing listens there
    server = start_server(test_repository, tmp_path_factory, tracing_args(
        f"http://127.0.0.1:{closed}/v1/traces", "rate=1", "opentelemetry,bsp_schedule_delay=50",
        "opentelemetry,bsp_max_queue_size=16", "opentelemetry,bsp_max_export_batch_size=8"))
    try:
        wait_models_loaded(server)
        client = grpcclient.InferenceServerClient(server.url)
        for i in range(60):
            answer = client.infer("batched", grpc_inputs(rows(1, float(i))))
            assert answer.as_numpy("OUTPUT__0").shape == (1, 4)
        client.close()
        deadline = time.monotonic() + 15
        while True:
            text = server.metrics_text()
            failed = metric_value(text, 'sluice_trace_spans_dropped_total{reason="export_failed"}') or 0
            full = metric_value(text, 'sluice_trace_spans_dropped_total{reason="queue_full"}') or 0
            if failed > 0 and failed + full >= 60 * 4 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert failed > 0, text
        assert metric_value(text, "sluice_trace_spans_exported_total") == 0
        assert "event=trace_export_failed" in server.log()
    finally:
        started = time.monotonic()
        assert server.stop() == 0, server.log()
    assert time.monotonic() - started < 15  # the last flush gives up after 2 s


def test_an_ensembles_steps_are_spans_under_its_request(tmp_path_factory, collector, caller):
    """An ensemble request traced over gRPC: each step is an INTERNAL span "ensemble step N" under
    the request span, naming its model, with the model's queue, compute and output spans under
    it; the second step starts after the first ended."""
    from test_ensembles import CHAIN, data, write_composing, write_ensemble
    root = tmp_path_factory.mktemp("traced_ensemble")
    write_composing(root)
    write_ensemble(root, "chain", CHAIN)
    server = start_server(root, tmp_path_factory, tracing_args(
        collector.url, "rate=1000000000", "opentelemetry,bsp_schedule_delay=100"))
    try:
        wait_models_loaded(server)
        client = grpcclient.InferenceServerClient(server.url)
        tensor = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        tensor.set_data_from_numpy(data(1))
        trace_id, span_id, _, _ = call_with_parent(
            caller, lambda headers: client.infer("chain", [tensor], headers=headers))
        name = "inference.GRPCInferenceService/ModelInfer"
        spans = collector.wait_trace(trace_id, [name, "ensemble step 1", "ensemble step 2"])
        by_name = {span.name: span for span in spans}
        request = by_name[name]
        assert request.parent_span_id.hex() == span_id and attributes(request)["sluice.model"] == "chain"
        for number, model in ((1, "normalise"), (2, "double")):
            step = by_name[f"ensemble step {number}"]
            assert step.kind == KIND_INTERNAL and step.parent_span_id == request.span_id
            assert attributes(step)["sluice.model"] == model
            assert attributes(step)["sluice.ensemble.step"] == number
            assert request.start_time_unix_nano <= step.start_time_unix_nano <= step.end_time_unix_nano
            assert step.end_time_unix_nano <= request.end_time_unix_nano
            stages = sorted(span.name for span in spans if span.parent_span_id == step.span_id)
            assert stages == ["compute", "output", "queue"], stages
        assert by_name["ensemble step 1"].end_time_unix_nano <= by_name["ensemble step 2"].start_time_unix_nano
        client.close()
    finally:
        assert server.stop() == 0, server.log()
