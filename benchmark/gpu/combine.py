#!/usr/bin/env python3
"""Merge results.json files of several harness runs into one table (one row per configuration,
unpatched and patched side by side), and optionally write a slim copy of the results.

  python3 benchmark/gpu/combine.py [--slim OUT.json] [--md OUT.md] run1/results.json run2/results.json ...

The summaries are recomputed from the per-request records (serve_checks.summarize), so old
results files gain the current metrics. The slim copy drops the output token ids (the rule
match, first differing position, accept length and seconds of every request stay).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_checks  # noqa: E402


def acc_text(r):
    if r is None:
        return "not run"
    if not r.get("checks"):
        return f"no result ({r.get('error') or r.get('status')})"
    if r.get("topk") is None:
        return "-"
    low = [c for c in r["checks"] if c.get("accept_len") is not None and c["accept_len"] < r["steps"] + 1]
    text = f"{r['accept_min']:.3f} min, {r['accept_mean']:.3f} mean"
    if low:
        text += (
            f"; {len(low)}/{len(r['checks'])} requests < {r['steps'] + 1} ("
            + ", ".join(f"{c['tag']} {c['accept_len']:.3f}" for c in low[:3])
            + (", ..." if len(low) > 3 else "")
            + ")"
        )
    else:
        text += f"; all {len(r['checks'])} requests = {r['steps'] + 1}"
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slim")
    ap.add_argument("--md")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    by_name = {}
    for i, path in enumerate(a.files, 1):
        for r in json.load(open(path)):
            r["run"] = i
            if r.get("checks"):
                serve_checks.summarize(r, serve_checks.parse(r["config"]))
            by_name[r["config"]] = r
    results = list(by_name.values())
    serve_checks.compare_with_nonspec(results)
    groups = {}
    for r in results:
        key = r["config"].rsplit("_", 1)[0] if r.get("topk") is not None else r["config"]
        groups.setdefault(key, {})[r["tree"] if r.get("topk") is not None else "nonspec"] = r
    lines = [
        "| configuration | worker | run | unpatched: accept length per request | patched: accept length per request "
        "| outputs = rule (unpatched / patched) | outputs = non-spec (reference) "
        "| tokens/s single, unpatched / patched | tokens/s batch of 8, unpatched / patched | startup s (u / p) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, g in groups.items():
        if "nonspec" in g:
            r = g["nonspec"]
            lines.append(
                f"| {key} | - | {r['run']} | - | - | {r.get('all_match_rule')} (unpatched tree) | reference "
                f"| {r.get('single_stream_tokens_per_s')} | {r.get('batch8_tokens_per_s')} | {r.get('startup_s')} |"
            )
            continue
        u, p = g.get("unpatched"), g.get("patched")
        any_r = u or p
        worker = "EAGLEWorkerV2 (overlap on)" if any_r["topk"] == 1 else "EAGLEWorker v1 (overlap off)"

        def f(r, k):
            return "-" if r is None else r.get(k)

        eq = f"{f(u, 'equal_nonspec')} / {f(p, 'equal_nonspec')} ({any_r.get('equal_nonspec_ref')})"
        lines.append(
            f"| {key} | {worker} | {any_r['run']} | {acc_text(u)} | {acc_text(p)} | "
            f"{f(u, 'all_match_rule')} / {f(p, 'all_match_rule')} | {eq} | "
            f"{f(u, 'single_stream_tokens_per_s')} / {f(p, 'single_stream_tokens_per_s')} | "
            f"{f(u, 'batch8_tokens_per_s')} / {f(p, 'batch8_tokens_per_s')} | "
            f"{f(u, 'startup_s')} / {f(p, 'startup_s')} |"
        )
    table = "\n".join(lines)
    print(table)
    if a.md:
        open(a.md, "w").write(table + "\n")
    if a.slim:
        slim = []
        for r in results:
            r = dict(r)
            r["checks"] = [{k: v for k, v in c.items() if k != "output_ids"} for c in r.get("checks", [])]
            slim.append(r)
        json.dump(slim, open(a.slim, "w"), separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
