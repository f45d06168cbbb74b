#!/usr/bin/env bash
# The GPU check: every case of tests/gpu on this host's CUDA devices, bounded to 5 minutes.
# Usage (from the repository root, devpool installed): bash tests/gpu/run.sh
# Prints the host's GPU, driver, torch and installed plugins, then each case's outcome.
set -uo pipefail
cd "$(dirname "$0")/../.."
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' || true
timeout 30 python3 -m pip list 2>/dev/null | grep -i -E "^(pytest|pytest-timeout|pytest-xdist|nvidia-ml-py|devpool) " || true
timeout 300 python3 -m pytest tests/gpu -v -rA -p no:cacheprovider -p no:randomly
