#!/bin/bash
# Pack a real fork's SGLang package for the GPU harness (here, on the CPU machine; git only):
#
#   bash benchmark/gpu/pack_fork_tree.sh GIT_DIR COMMIT NAME
#
# writes .gpu/forks/NAME.tar.xz: the fork's python/sglang at COMMIT (`git archive`, so exactly
# the committed files), as `sglang/`, plus FORK.txt (git dir, full commit, its subject). Carry
# `.gpu/forks` and run a driver with FORK_TREE=.gpu/forks/NAME.tar.xz (run_dsv4_fork_on_h200.sh,
# run_on_h200.sh): the unpatched tree is then this package in place of the sitepack's sglang/
# (first on PYTHONPATH; sgl-kernel, flashinfer, tvm-ffi and the rest stay the sitepack's), and
# the patched tree a copy of it patched by `apply`. A source tree has no build outputs: no
# sglang/_version.py (sglang.__version__ then reads the sitepack's dist-info, 0.5.12) and no
# compiled srt/grpc/_core (the gRPC server mode, which the harness does not use).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 GIT_DIR COMMIT NAME" >&2; exit 2; }
GITDIR=$1 COMMIT=$2 NAME=$3
ROOT=$(git rev-parse --show-toplevel)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
FULL=$(git --git-dir="$GITDIR" rev-parse --verify "$COMMIT^{commit}")
git --git-dir="$GITDIR" archive "$FULL" python/sglang | tar -x -C "$T"
[ -f "$T/python/sglang/__init__.py" ] || { echo "no python/sglang at $FULL" >&2; exit 1; }
mv "$T/python/sglang" "$T/sglang"
{ echo "git_dir $GITDIR"; echo "commit $FULL"; echo "subject $(git --git-dir="$GITDIR" log -1 --format=%s "$FULL")"; } > "$T/FORK.txt"
mkdir -p "$ROOT/.gpu/forks"
tar -cf - -C "$T" FORK.txt sglang | xz -9 -T0 > "$ROOT/.gpu/forks/$NAME.tar.xz"
(cd "$ROOT" && git check-ignore -q ".gpu/forks/$NAME.tar.xz") || echo "note: .gpu/ is not git-ignored here" >&2
echo "$ROOT/.gpu/forks/$NAME.tar.xz: $(stat -c %s "$ROOT/.gpu/forks/$NAME.tar.xz") bytes, $FULL"
