#!/usr/bin/env bash
# Packs what the GPU machine's python3 (3.12) lacks — DeepSpeed, Ray, Optuna, Liger and their missing
# dependencies — into .gpu/pyext.tar.xz at the project's root (ignored by .gitignore), for CPython
# 3.12 on x86-64, at the versions in this checkout's .venv. The one command (≈ 2 min, needs PyPI):
#
#   bash bench/gpu_pack.sh
#
# bench/gpu_session.sh unpacks it on the device (the run tool's `carry: [".gpu"]`). Adapted from
# ../shared/gpu/pack.sh: works in a git worktree too, adds liger_kernel, and refuses a pack over
# 60 MiB (the device carries 64 MiB in all, the checkout included).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
[ -x "$py" ] || { echo "gpu_pack: no $py: run 'make venv' first" >&2; exit 2; }
mkdir -p .gpu
work=$(mktemp -d); site=$work/site; mkdir -p "$site"
trap 'rm -rf "$work"' EXIT
ver() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pkgdir() { "$py" -c "import importlib.util as u, os; s=u.find_spec('$1'); print(os.path.dirname(s.origin) if s.submodule_search_locations else s.origin)"; }
# Pure-Python packages: copied from the venv (DeepSpeed ships no wheel; its ops build just in time).
for m in deepspeed hjson pydantic annotated_types typing_inspection typing_extensions jsonschema \
         jsonschema_specifications referencing tensorboardX optuna colorlog alembic sqlalchemy mako \
         liger_kernel; do
  p=$(pkgdir "$m" 2>/dev/null) || { echo "skip $m (not in the venv)"; continue; }
  cp -r "$p" "$site/"
done
# Compiled packages: CPython 3.12 manylinux wheels at the venv's versions.
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
for d in ray pydantic_core rpds_py; do
  "$py" -m pip download -q --no-deps "${plat[@]}" -d "$work/whl" "$d==$(ver "${d//_/-}")"
done
for w in "$work"/whl/*.whl; do "$py" -m zipfile -e "$w" "$site"; done
rm -rf "$site"/ray/jars          # Java jars: 31 MiB that the Python API never loads
find "$site" -name '*.js.map' -delete; find "$site" -name __pycache__ -prune -exec rm -rf {} +
chmod -R u+rwX,go+rX "$site"; find "$site" -path '*/ray/core/src/*' -type f -exec chmod +x {} +
tar -C "$site" -cJf .gpu/pyext.tar.xz.tmp . && mv .gpu/pyext.tar.xz.tmp .gpu/pyext.tar.xz
size=$(stat -c %s .gpu/pyext.tar.xz)
(( size <= 60 * 1024 * 1024 )) || { echo "gpu_pack: .gpu/pyext.tar.xz is $((size >> 20)) MiB, over 60 MiB: the device carries 64 MiB with the checkout" >&2; exit 2; }
echo "gpu_pack: .gpu/pyext.tar.xz $((size >> 20)) MiB ($size bytes)"
