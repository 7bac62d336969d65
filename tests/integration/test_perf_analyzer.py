"""The third-party perf_analyzer drives the bundled models (strings included) at concurrency 1..8 and
sees no failed request. (A smoke check of interoperability, not a performance measurement.)"""
import os
import re
import shutil
import subprocess

import pytest
from harness.perf_analyzer import SMOKE_MAX_TRIALS, SMOKE_WINDOWS

PERF_ANALYZER = shutil.which("perf_analyzer", path=os.path.dirname(os.environ.get("SLUICE_VENV_BIN", "")) or None) \
    or shutil.which("perf_analyzer")


def run_perf_analyzer(*args):
    """perf_analyzer over two concurrency levels with `args`; fails on any error, else returns."""
    assert PERF_ANALYZER, "perf_analyzer is not on PATH (scripts/setup.sh installs it into .venv/bin)"
    # This checks interoperability, not speed: short windows that accept any spread (on a shared
    # 2-core machine the windows are never "stable").
    result = subprocess.run([PERF_ANALYZER, *args, *SMOKE_WINDOWS, "--max-trials", str(SMOKE_MAX_TRIALS)],
                            capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "error" not in output.lower(), output
    throughputs = [float(x) for x in re.findall(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", output)]
    assert len(throughputs) == 2 and all(t > 0 for t in throughputs), output


@pytest.mark.parametrize("model", ["mlp", "convnet"])
def test_perf_analyzer_reports_no_errors(bundled_server, model, tmp_path):
    csv = tmp_path / "result.csv"
    run_perf_analyzer("-m", model, "-u", bundled_server.url, "-i", "grpc", "-b", "4", "--concurrency-range", "1:8:7",
                      "-f", str(csv))
    assert csv.exists()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_perf_analyzer_over_http_reports_no_errors(bundled_server, binary, tmp_path):
    """perf_analyzer -i http at concurrency 1 and 16 against the REST endpoint (binary tensors by
    default, JSON with --input-tensor-format/--output-tensor-format json)."""
    formats = [] if binary else ["--input-tensor-format", "json", "--output-tensor-format", "json"]
    run_perf_analyzer("-m", "mlp", "-u", bundled_server.http_url, "-i", "http", "-b", "1", *formats,
                      "--concurrency-range", "1:16:15")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_sends_strings(bundled_server, protocol):
    """perf_analyzer's random strings (BYTES) to the bundled text classifier, over both protocols."""
    url = bundled_server.url if protocol == "grpc" else bundled_server.http_url
    run_perf_analyzer("-m", "text_classifier", "-u", url, "-i", protocol, "-b", "4", "--string-length", "64",
                      "--concurrency-range", "1:8:7")


def test_perf_analyzer_streaming_reports_no_errors(bundled_server):
    """perf_analyzer --streaming: every request on one ModelStreamInfer stream per concurrent
    client."""
    run_perf_analyzer("-m", "mlp", "-u", bundled_server.url, "-i", "grpc", "--streaming", "-b", "1",
                      "--concurrency-range", "1:16:15")


def test_perf_analyzer_system_shared_memory_reports_no_errors(bundled_server):
    """perf_analyzer --shared-memory system: it registers its own regions and sends every input
    and output through them."""
    run_perf_analyzer("-m", "mlp", "-u", bundled_server.url, "-i", "grpc", "--shared-memory", "system",
                      "--output-shared-memory-size", "4096", "-b", "1", "--concurrency-range", "1:16:15")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_drives_sequences(bundled_server, protocol):
    """perf_analyzer on a stateful model: it reads sequence_batching from the model config and sends
    sequences of 8 requests (sequence_id, sequence_start, sequence_end), one per concurrent client
    at a time; the bundled accumulator has 8 slots."""
    url = bundled_server.url if protocol == "grpc" else bundled_server.http_url
    run_perf_analyzer("-m", "accumulator", "-u", url, "-i", protocol, "-b", "1", "--sequence-length", "8",
                      "--concurrency-range", "1:8:7")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_sets_trace_settings(bundled_server, protocol):
    """perf_analyzer --trace-level/--trace-rate/--trace-count/--log-frequency: it sets the server's
    trace settings through the trace extension before it measures (the spans go to the default
    collector URL, where nothing listens here: dropped and counted, requests unaffected)."""
    import tritonclient.grpc as grpcclient
    url = bundled_server.url if protocol == "grpc" else bundled_server.http_url
    client = grpcclient.InferenceServerClient(bundled_server.url)
    try:
        run_perf_analyzer("-m", "mlp", "-u", url, "-i", protocol, "-b", "1", "--trace-level", "TIMESTAMPS",
                          "--trace-rate", "1", "--trace-count", "-1", "--log-frequency", "0",
                          "--concurrency-range", "1:2:1")
        settings = client.get_trace_settings(as_json=True)["settings"]
        assert settings["trace_level"]["value"] == ["TIMESTAMPS"]
        assert settings["trace_rate"]["value"] == ["1"]
    finally:  # the other tests share this server: tracing off again
        client.update_trace_settings(settings={"trace_level": None, "trace_rate": None, "trace_count": None})
        assert client.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == ["OFF"]
        client.close()
