#!/usr/bin/env bash
# Sets up, builds, writes the bundled example models' files and runs sluice-server on models/
# (mlp, convnet, text_classifier, the stateful accumulator and the two .pt2 packages). Arguments go to
# sluice-server (see build/bin/sluice-server --help), e.g.
#   scripts/serve.sh --grpc-port 9001 --device cpu
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
.venv/bin/python models/generate_models.py
exec build/bin/sluice-server --model-repository models "$@"
