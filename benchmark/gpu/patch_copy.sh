# Sourced by the run_*_on_h200.sh drivers: the patched copy of an installed SGLang,
# made by the project's own `apply`, and `check` on both trees.
#   make_patched_copy SITE PATCHED [DLSRC]
# SITE holds the installed sglang/; PATCHED receives a copy, patched once (a .patched marker
# keeps a warm machine from redoing it); DLSRC holds sglang_draft_layout (default: the repo's
# python/). Needs REPO, WORK and OUT; libcst comes from .whl/ when the machine lacks it.
# Writes $OUT/patch.txt (the apply and check output) and leaves DL and DLPATH set.
make_patched_copy() {
  local site=$1 patched=$2 dlsrc=${3:-$REPO/python} cst="" t
  if ! python3 -c "import libcst" 2>/dev/null; then
    cst=$WORK/cst
    [ -d "$cst/libcst" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$cst" .whl/libcst-*.whl || return 1
  fi
  DL="python3 -m sglang_draft_layout"
  DLPATH=$dlsrc${cst:+:$cst}
  if [ ! -f "$patched/.patched" ]; then
    rm -rf "$patched"; mkdir -p "$patched"
    cp -a "$site/sglang" "$patched/sglang" || return 1
    find "$patched/sglang" -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null
    { echo "\$ $DL apply $patched"; PYTHONPATH=$DLPATH $DL apply "$patched" 2>&1; echo "rc=$?"; } > "$WORK/apply.txt"
    cp "$WORK/apply.txt" "$OUT/patch.txt"
    echo "[setup] apply $patched: $(tail -3 "$WORK/apply.txt" | tr '\n' ' ')"
    grep -q "^rc=0" "$WORK/apply.txt" || { cat "$WORK/apply.txt"; return 1; }
    touch "$patched/.patched"
  fi
  for t in "$patched" "$site"; do
    { echo "\$ $DL check $t"; PYTHONPATH=$DLPATH $DL check "$t" 2>&1; echo "rc=$?"; } > "$WORK/check.txt"
    cat "$WORK/check.txt" >> "$OUT/patch.txt"
    echo "[setup] check $t: $(tail -2 "$WORK/check.txt" | tr '\n' ' ')"
  done
}

#   unpack_fork_tree TARBALL DEST
# A real fork's package (benchmark/gpu/pack_fork_tree.sh: FORK.txt and sglang/) into DEST/sglang,
# once (a .forked marker keeps a warm machine from redoing it); DEST then stands where the
# sitepack's sglang/ stood: first on PYTHONPATH, before the site, whose sglang/ it hides whole
# (a regular package is taken from the first path entry holding it). Prints FORK.txt.
unpack_fork_tree() {
  local tarball=$1 dest=$2
  if [ ! -f "$dest/.forked" ]; then
    rm -rf "$dest" && mkdir -p "$dest" || return 1
    xz -dc -T0 "$tarball" | tar -x -C "$dest" || return 1
    [ -f "$dest/sglang/__init__.py" ] || { echo "[setup] $tarball holds no sglang/__init__.py"; return 1; }
    echo "$tarball" > "$dest/.forked"
  fi
  sed 's/^/[setup] fork /' "$dest/FORK.txt" 2>/dev/null
}
