#!/usr/bin/env python3
"""Diagnosis only (not part of the project's patch): copy an SGLang tree and make the
FlashInfer-MLA draft decode plan use the draft kv lengths, to test the cause of the accept length
seen with the DeepSeek MLA models (3.048 instead of 4 with topk 1 / 3 steps, unpatched and patched).

Usage: python3 benchmark/gpu/make_mla_kvlen_fix_tree.py SRC_ROOT DST_ROOT
  SRC_ROOT/sglang is copied to DST_ROOT/sglang, then in layers/attention/flashinfer_mla_backend.py:
  1. FlashInferMLAIndicesUpdaterDecode.call_begin_forward: with spec_info (a multi-step draft
     step), kv_len_arr passed to BatchMLAPagedAttentionWrapper.plan becomes the row lengths of the
     draft kv_indptr (seq_len + i + 1 for step i, topk 1) instead of seq_lens (paged_kernel_lens),
     which leaves out the draft tokens of earlier steps;
  2. FlashInferMLAAttnBackend.init_forward_metadata_replay_cuda_graph, decode branch: with
     spec_info, kv_len_arr_cpu and the CPU kv_indptr given to the plan come from the same draft
     kv_indptr (0.5.12 uses seq_lens_cpu and its cumsum, so request b >= 1 starts b * (i + 1)
     entries early in kv_indices).
Each edit must match exactly once, or the script fails.
"""
import shutil
import sys
from pathlib import Path

EDITS = [
    (  # 1. eager and replay: the draft rows' lengths
        "            kv_indptr, kv_indices = spec_info.kv_indptr, spec_info.kv_indices\n",
        "            kv_indptr, kv_indices = spec_info.kv_indptr, spec_info.kv_indices\n"
        "            kv_lens = (kv_indptr[1 : bs + 1] - kv_indptr[:bs]).to(torch.int32)  # kvlen-fix\n",
    ),
    (  # 2. CUDA-graph replay: the CPU lengths and indptr of the plan
        "            kv_len_arr_cpu = seq_lens_cpu[:bs]\n",
        "            kv_len_arr_cpu = seq_lens_cpu[:bs]\n"
        "            if spec_info is not None:  # kvlen-fix\n"
        "                kv_len_arr_cpu = (spec_info.kv_indptr[1 : bs + 1] - spec_info.kv_indptr[:bs]).to(\n"
        "                    device='cpu', dtype=seq_lens_cpu.dtype)\n",
    ),
]


def main():
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    if (dst / "sglang").exists():
        shutil.rmtree(dst / "sglang")
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "sglang", dst / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    f = dst / "sglang/srt/layers/attention/flashinfer_mla_backend.py"
    text = f.read_text()
    for old, new in EDITS:
        n = text.count(old)
        if n != 1:
            sys.exit(f"edit anchor found {n} times in {f}: {old!r}")
        text = text.replace(old, new)
    f.write_text(text)
    compile(text, str(f), "exec")
    print(f"wrote {f} ({len(EDITS)} edits, marked '# kvlen-fix')")


if __name__ == "__main__":
    main()
