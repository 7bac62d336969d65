"""What the integration tests, the benchmarks and the GPU proof kit share: starting and stopping a
real sluice-server (harness.server) and reading a process's memory and CPU (harness.process).
One copy of each, imported by all three (put the tests/ folder on sys.path)."""
