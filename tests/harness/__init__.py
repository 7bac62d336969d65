"""What the integration tests, the benchmarks and the GPU proof kit share: starting and stopping a
real sluice-server (harness.server), repositories of the bundled models (harness.repository),
perf_analyzer runs (harness.perf_analyzer), callgrind windows (harness.callgrind), a process's
memory and CPU (harness.process), and what the benchmark scripts share (harness.bench: pinning,
a benchmark's server, model counts, the JSON report). One copy of each, imported by all three (put the tests/ folder
on sys.path)."""
