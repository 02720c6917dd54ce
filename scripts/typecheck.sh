#!/usr/bin/env bash
# Type-check the packages under their installed names (rayless.transport, ...).
# The repository keeps transport/, placement/, actors/ and store/ at the top while the wheel
# maps them under ``rayless``; mypy has no package-dir mapping, so this lays a tree of
# symbolic links in build/typecheck that mirrors the installed layout and checks it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=build/typecheck
rm -rf "$root"
mkdir -p "$root/rayless"
for f in rayless/*; do
  case "$(basename "$f")" in __pycache__) continue ;; esac
  ln -s "$PWD/$f" "$root/rayless/"
done
for p in transport placement actors store weights; do ln -s "$PWD/$p" "$root/rayless/$p"; done
exec mypy "$@" "$root/rayless"
