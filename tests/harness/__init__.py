"""What the integration tests, the benchmarks and the GPU proof kit share: starting and stopping a
real sluice-server (harness.server), repositories of the bundled models (harness.repository),
perf_analyzer runs (harness.perf_analyzer), callgrind windows (harness.callgrind) and a process's
memory and CPU (harness.process). One copy of each, imported by all three (put the tests/ folder
on sys.path)."""
