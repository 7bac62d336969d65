"""The third-party perf_analyzer drives both bundled models with batch 4 and concurrency 1..8 and
sees no failed request. (A smoke check of interoperability, not a performance measurement.)"""
import os
import re
import shutil
import subprocess

import pytest

PERF_ANALYZER = shutil.which("perf_analyzer", path=os.path.dirname(os.environ.get("SLUICE_VENV_BIN", "")) or None) \
    or shutil.which("perf_analyzer")


@pytest.mark.parametrize("model", ["mlp", "convnet"])
def test_perf_analyzer_reports_no_errors(bundled_server, model, tmp_path):
    assert PERF_ANALYZER, "perf_analyzer is not on PATH (scripts/setup.sh installs it into .venv/bin)"
    csv = tmp_path / "result.csv"
    result = subprocess.run(
        [PERF_ANALYZER, "-m", model, "-u", bundled_server.url, "-i", "grpc", "-b", "4",
         "--concurrency-range", "1:8:7", "--measurement-mode", "count_windows",
         "--measurement-request-count", "100", "--max-trials", "10",
         # This checks interoperability, not speed: on a shared 2-core machine the windows are
         # never "stable", so accept any spread.
         "--stability-percentage", "1000", "-f", str(csv)],
        capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "error" not in output.lower(), output
    throughputs = [float(x) for x in re.findall(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", output)]
    assert len(throughputs) == 2 and all(t > 0 for t in throughputs), output
    assert csv.exists()
