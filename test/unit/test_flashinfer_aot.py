"""benchmark/gpu/flashinfer_aot.sh on CPU: FlashInfer modules put where flashinfer loads them
instead of JIT-compiling (only those that load), and the device's JIT-compiled modules packed
for the next session."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bash(script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f". benchmark/gpu/flashinfer_aot.sh; {script}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=True,
    )


def test_install_puts_only_modules_that_load_where_flashinfer_looks(tmp_path):
    site, src, logs = tmp_path / "site", tmp_path / "fiaot", tmp_path / "logs"
    site.mkdir()
    logs.mkdir()
    # tvm_ffi stands in for the device's: a module "loads" unless its file says it is broken
    (site / "tvm_ffi.py").write_text("def load_module(path):\n    assert 'broken' not in open(path).read()\n")
    for name, text in (("good", "ok"), ("bad", "broken")):
        (src / name).mkdir(parents=True)
        (src / name / f"{name}.so").write_text(text)
    (src / "misnamed").mkdir()
    (src / "misnamed" / "other.so").write_text("ok")
    out = bash(f'install_flashinfer_aot "{src}" "{site}" "{logs}"').stdout
    aot = site / "flashinfer" / "data" / "aot"
    assert (aot / "good" / "good.so").read_text() == "ok"
    assert sorted(p.name for p in aot.iterdir()) == ["good"]
    assert "in place: good" in out and "bad does not load, left out (JIT instead)" in out
    again = bash(f'install_flashinfer_aot "{src}" "{site}" "{logs}"').stdout  # warm machine: nothing redone
    assert "in place" not in again


def test_pack_takes_the_compiled_modules_alone_and_keeps_under_the_limit(tmp_path):
    ops = tmp_path / "home" / ".cache" / "flashinfer" / "0.6.11.post1" / "90" / "cached_ops"
    for name in ("batch_prefill_a", "norm"):
        (ops / name).mkdir(parents=True)
        (ops / name / f"{name}.so").write_bytes(os.urandom(2048))
        (ops / name / f"{name}.cuda.o").write_bytes(b"object")
    (ops / "tmp").mkdir()
    env = {"HOME": str(tmp_path / "home")}
    packed = tmp_path / "flashinfer_jit.tgz"
    out = bash(f'pack_flashinfer_jit "{packed}"', env).stdout
    with tarfile.open(packed) as tar:
        assert sorted(tar.getnames()) == ["batch_prefill_a/batch_prefill_a.so", "norm/norm.so"]
    assert "2 JIT-compiled flashinfer module(s)" in out
    packed.unlink()
    out = bash(f'pack_flashinfer_jit "{packed}" 100', env).stdout
    assert "over 100: left out" in out and not packed.exists()
    assert "no JIT-compiled" in bash(f'pack_flashinfer_jit "{packed}"', {"HOME": str(tmp_path)}).stdout
    for folder in ("batch_prefill_a", "norm", "tmp"):  # a cache without modules leaves no file behind
        for path in (ops / folder).iterdir():
            path.unlink()
    assert "no JIT-compiled" in bash(f'pack_flashinfer_jit "{packed}"', env).stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_install_takes_the_packed_modules_a_device_run_returned(tmp_path):
    site, src, logs, built = tmp_path / "site", tmp_path / "fiaot", tmp_path / "logs", tmp_path / "built"
    for folder in (site, src, logs):
        folder.mkdir()
    (site / "tvm_ffi.py").write_text("def load_module(path):\n    assert 'broken' not in open(path).read()\n")
    for name, text in (("norm", "ok"), ("cascade", "broken")):
        (built / name).mkdir(parents=True)
        (built / name / f"{name}.so").write_text(text)
    with tarfile.open(src / "flashinfer_jit-2026-12-01.tgz", "w:gz") as tar:
        tar.add(built / "norm" / "norm.so", "norm/norm.so")
        tar.add(built / "cascade" / "cascade.so", "cascade/cascade.so")
    out = bash(f'install_flashinfer_aot "{src}" "{site}" "{logs}"').stdout
    aot = site / "flashinfer" / "data" / "aot"
    assert sorted(p.name for p in aot.iterdir()) == ["norm"]
    assert (aot / "norm" / "norm.so").read_text() == "ok"
    assert "in place: norm" in out and "cascade does not load" in out
