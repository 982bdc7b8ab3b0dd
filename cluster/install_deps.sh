#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages hydra builds against and the tests' Python packages, only those missing
# Needs root or sudo for apt-get; does nothing when everything is present.
set -euo pipefail
packages=(cmake g++ make pkg-config libopenmpi-dev openmpi-bin libhdf5-dev libboost-program-options-dev
          libopenblas-dev nlohmann-json3-dev libfmt-dev libgtest-dev libxxhash-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all build dependencies present"
else
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The Python side of the tests (cluster/tokenize_text.py and its token files): h5py, numpy, the
# Hugging Face `tokenizers` package, pyarrow (.parquet inputs) and jinja2 (chat templates), from PyPI
# into the python3 the tests run. Without them those
# tests report "Not Run" (skipped); a failed install is a warning, not a failed build.
if command -v python3 >/dev/null && ! python3 -c "import h5py, numpy, tokenizers, pyarrow, jinja2" 2>/dev/null; then
  echo "install_deps: installing the tests' Python packages (h5py numpy tokenizers pyarrow jinja2)"
  python3 -m pip install -q h5py numpy tokenizers pyarrow jinja2 >/dev/null 2>&1 ||
    echo "install_deps: warning: pip could not install h5py/numpy/tokenizers/pyarrow/jinja2; the tokenize tests (or their parquet and chat-template cases) will be skipped"
fi
# The Python side of exports and plots: torch (CPU is enough), transformers and safetensors (the
# export tests and the README's real-text recipe load exports as a transformers user does) and
# matplotlib (the plot scripts' test). Without them those tests report "Not Run" (skipped).
if command -v python3 >/dev/null && ! python3 -c "import torch, transformers, safetensors, matplotlib" 2>/dev/null; then
  echo "install_deps: installing the export and plot tests' Python packages (torch transformers safetensors matplotlib)"
  python3 -m pip install -q torch transformers safetensors matplotlib >/dev/null 2>&1 ||
    echo "install_deps: warning: pip could not install torch/transformers/safetensors/matplotlib; the export, recipe and plot tests will be skipped"
fi
