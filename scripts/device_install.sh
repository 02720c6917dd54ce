#!/usr/bin/env bash
# Install rayless on a lent device machine, into /tmp/rl-venv (the GPU check scripts call this).
#
# The venv sees the device python's own packages (its CUDA torch, pytest, numpy...), then the
# carried wheels (.whl/, from `bash scripts/device_check.sh prepare`) and rayless editable (an
# editable install keeps the checkout importable as rayless.transport, ... from its root).
# The device's python3 is itself a venv, and --system-site-packages reaches only the
# interpreter under it: a .pth file names the device python's site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=/tmp/rl-venv
python3 -m venv --system-site-packages "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -c 'import site; print("\n".join(site.getsitepackages()))' > "$site/_device_python.pth"
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
# before Python 3.12 a venv gets an old setuptools of its own, without bdist_wheel: the
# editable install builds with the device python's setuptools and wheel instead
"$venv/bin/python" -m pip uninstall -q -y setuptools 2>/dev/null || true
"$venv/bin/python" -m pip install -q --no-index --no-deps .whl/*.whl
"$venv/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e .
"$venv/bin/python" -c 'import rayless.actors, rayless.store, tensordict, zmq; print("installed")'
