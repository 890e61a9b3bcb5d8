# Sourced by the run_*_on_h200.sh drivers and ab_h200.sh: FlashInfer modules that need not be
# JIT-compiled on the device (a fresh H200 spends 110-220 s of device time compiling the Llama
# runs' modules during the first graph capture and prefill).
#
#   install_flashinfer_aot SRC SITE LOGDIR
#     each SRC/NAME/NAME.so (built by build_flashinfer_aot.py on a CPU machine) and each module in
#     SRC/*.tgz (what an earlier device run returned through pack_flashinfer_jit, carried packed:
#     a third of the size) goes to SITE/flashinfer/data/aot/NAME/, the
#     place flashinfer 0.6.11 loads a module from before it would JIT-compile it
#     (JitSpec.aot_path / is_aot). Each is test-loaded first (tvm_ffi.load_module, with SITE on
#     the path); one that does not load is left out, and flashinfer JIT-compiles it as before.
#   pack_flashinfer_jit FILE [MAX_BYTES]
#     the modules this machine JIT-compiled (~/.cache/flashinfer/VERSION/ARCH/cached_ops/NAME/NAME.so)
#     into FILE (tar.gz of NAME/NAME.so), unless larger than MAX_BYTES (default 16 MiB, what a
#     device call returns); copied into .gpu/fiaot/ and carried, a next session's machine skips
#     compiling them.
install_flashinfer_aot() {
  local src=$1 site=$2 logdir=$3 so name dst tgz unpacked=$3/fiaot_unpacked
  [ -d "$src" ] || return 0
  for tgz in "$src"/*.tgz; do
    [ -f "$tgz" ] || continue
    mkdir -p "$unpacked" && tar -xzf "$tgz" -C "$unpacked" || echo "[setup] $tgz does not unpack, left out"
  done
  for so in "$src"/*/*.so "$unpacked"/*/*.so; do
    [ -f "$so" ] || continue
    name=$(basename "$(dirname "$so")")
    [ "$(basename "$so")" = "$name.so" ] || continue
    dst=$site/flashinfer/data/aot/$name
    [ -f "$dst/$name.so" ] && continue
    if PYTHONPATH=$site python3 -c "import torch, tvm_ffi, sys; tvm_ffi.load_module(sys.argv[1])" "$so" \
        > "$logdir/aot_$name.txt" 2>&1; then
      mkdir -p "$dst" && cp "$so" "$dst/" && echo "[setup] flashinfer AOT module in place: $name"
    else
      echo "[setup] flashinfer AOT module $name does not load, left out (JIT instead): $(tail -1 "$logdir/aot_$name.txt")"
    fi
  done
}

pack_flashinfer_jit() {
  local file=$1 max=${2:-16777216} ops
  for ops in "$HOME"/.cache/flashinfer/*/*/cached_ops; do
    [ -d "$ops" ] || continue
    (cd "$ops" && ls */*.so 2>/dev/null | while read -r so; do
       [ "$(basename "$so")" = "$(dirname "$so").so" ] && echo "$so"; done) > "$file.list"
    [ -s "$file.list" ] || { rm -f "$file.list"; continue; }
    tar -czf "$file" -C "$ops" -T "$file.list" || return 1
    if [ "$(stat -c %s "$file")" -gt "$max" ]; then
      echo "[pack] $file: $(stat -c %s "$file") bytes, over $max: left out"; rm -f "$file"
    else
      echo "[pack] $file: $(wc -l < "$file.list") JIT-compiled flashinfer module(s), $(stat -c %s "$file") bytes"
    fi
    rm -f "$file.list"
    return 0
  done
  echo "[pack] no JIT-compiled flashinfer modules on this machine"
}
