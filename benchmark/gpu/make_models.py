#!/usr/bin/env python3
"""Build a tiny, deterministic Llama target + matching EAGLE(1) draft + tokenizer.

Usage: python3 benchmark/gpu/make_models.py [--shape tiny|8b] OUTDIR
       -> OUTDIR/target, OUTDIR/draft, OUTDIR/prompts.json

``--shape 8b`` builds the same rule at Llama-3.1-8B shapes on the GPU (exact_8b.py: 32 layers
of hidden 4096, the rule in layers 0-1, the other 30 doing real work that adds exactly zero).

The builder is the package's sglang_draft_layout/tiny_models.py (the GPU test that `apply`
writes into a fork embeds the same source); see its docstring for the design. Same model
and prompts as the shared device recipe (same seeds, same draws); the expected rule
continuation is stored for EXPECTED_NEW tokens so that every request (a multiple of
num_steps + 1 from 64 on, at most 72: serve_checks.max_new_tokens) is checked against a prefix of it. The names below are
re-exported for make_deepseek_models.py and make_dsv4_models.py (`import make_models as mm`).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from sglang_draft_layout.tiny_models import (  # noqa: E402,F401  (re-exported)
    A_QK,
    C0,
    C1,
    CTX,
    EXPECTED_NEW,
    HD,
    H,
    I,
    M_FREQ,
    NH,
    NKV,
    SEED,
    THETA,
    V,
    build_models,
    build_tokenizer,
    check_positional_pattern,
    make_prompts,
    make_weights,
    rope_freqs,
    rule_continuation,
    rule_embeddings,
    save_checkpoint,
    save_draft,
    save_target,
)


def main():
    import argparse

    ap = argparse.ArgumentParser(description="build the target, the EAGLE draft and the prompts")
    ap.add_argument("--shape", choices=["tiny", "8b"], default="tiny")
    ap.add_argument("out", nargs="?", default="/tmp/models")
    a = ap.parse_args()
    if a.shape == "8b":
        import exact_8b

        tok, prompts = exact_8b.build(a.out)
        print("8b shape:", prompts["shape"], "rule check wrong positions:", prompts["rule_check_wrong_positions"])
    else:
        tok, prompts = build_models(a.out)
    print(
        "tokenizer:",
        type(tok).__name__,
        len(tok),
        "roundtrip:",
        repr(tok.decode(tok("Hello world 123")["input_ids"], skip_special_tokens=True)),
    )
    print("positional softmax gap (want >= 20):", round(prompts["positional_softmax_gap"], 2))
    print("long prompt tokens:", prompts["n_tokens"])


if __name__ == "__main__":
    main()
