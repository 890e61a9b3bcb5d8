"""What memory does the corrected draft kv_indices sizing cost? Bytes and fill, before and after.

Each ``*MultiStepDraftBackend`` of SGLang allocates its draft kv_indices as one 2-D buffer of
``speculative_num_steps`` rows (read off sglang 0.5.12's wheel: every allocation is
``torch.empty|zeros((self.speculative_num_steps, width), dtype=...)``; the draft kernel
``generate_draft_decode_kv_indices`` is launched over (num_steps, num_seqs, topk), so it fills
all num_steps rows although attention reads only the first num_steps - 1):

* eager path, ``init_forward_metadata``: allocated at every draft forward for the current
  batch, width ``batch_size * topk * max_context_len`` in every backend, 0.5.12 and patched alike;
* CUDA-graph path, ``init_cuda_graph_state(max_bs, max_num_tokens)``: allocated once, kept
  for the server's life, width in 0.5.12
    - FlashInfer, FlashInfer-MLA: ``max_bs * max_context_len`` (no topk: the overflow bug),
    - Triton, Aiter: ``max_num_tokens * max_context_len``, where the draft graph runner
      (speculative/eagle_draft_cuda_graph_runner.py, and frozen_kv_mtp_cuda_graph_runner.py)
      passes ``max_num_tokens = max_bs * num_tokens_per_bs`` with ``num_tokens_per_bs = topk``;
  patched: ``draft_kv_indices_buffer_width(max_bs, topk, max_context_len)`` = ``max_bs * topk *
  max_context_len`` in all four.

Row dtypes in 0.5.12: FlashInfer, FlashInfer-MLA, Aiter int32; Triton int64.
FlashInfer-MLA's draft backend raises for topk > 1 in 0.5.12 (``FlashInferMLAMultiStepDraftBackend.__init__``:
"Currently Flashinfer MLA only supports topk=1"), so in every setting it accepts its rows are
the same size before and after; the FlashInfer figures apply to it only for topk = 1.

The fill: row i holds ``draft_kv_indices_used_len(seq_lens_sum, topk, num_seqs * topk, i + 1)``
entries; the last row (i = num_steps - 1) is the fullest. For sequence-length mixes drawn
from fixed-seed distributions (clipped to max_context_len - num_steps, the most a request
may hold while drafting), the script gives used / width for the eager row, the patched
graph row (full batch and a quarter-full batch: graphs replay on the max_bs buffer), and the
unpatched FlashInfer graph row, where used / width > 1 is the overflow of upstream 27338.

    python benchmark/kv_indices_memory.py                       # tables
    python benchmark/kv_indices_memory.py --plot docs/kv_indices_memory.png --csv /tmp/grid.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import statistics
import sys
import time
from pathlib import Path

from sglang_draft_layout.speculative.spec_utils import draft_kv_indices_buffer_width, draft_kv_indices_used_len

GiB = 2**30
MAX_BS = (8, 16, 32, 64, 128, 256)
TOPK = (1, 2, 4, 8)
CONTEXT = (4096, 8192, 32768, 131072)
STEPS = (3, 5, 8)

#: backend: (row dtype bytes, 0.5.12 graph width(max_bs, topk, ctx))
BACKENDS = {
    "flashinfer": (4, lambda max_bs, topk, ctx: max_bs * ctx),
    "flashinfer_mla": (4, lambda max_bs, topk, ctx: max_bs * ctx),
    "triton": (8, lambda max_bs, topk, ctx: (max_bs * topk) * ctx),  # max_num_tokens = max_bs * topk
    "aiter": (4, lambda max_bs, topk, ctx: (max_bs * topk) * ctx),
}

#: sequence-length mixes: name -> sampler(rng, ctx) of one request's tokens in the KV cache
MIXES = {
    "short chat (lognormal, median 600)": lambda rng, ctx: rng.lognormvariate(math.log(600), 0.8),
    "chat + long prompts (median 2k)": lambda rng, ctx: rng.lognormvariate(math.log(2000), 1.0),
    "RAG / agents (median 8k)": lambda rng, ctx: rng.lognormvariate(math.log(8000), 0.7),
    "long context (uniform 25-100% of ctx)": lambda rng, ctx: rng.uniform(0.25, 1.0) * ctx,
    "every request at the limit": lambda rng, ctx: ctx,
}


def rows_bytes(steps: int, width: int, dtype_bytes: int) -> int:
    return steps * width * dtype_bytes


def grid() -> list[dict]:
    out = []
    for backend, (dtype_bytes, unpatched_width) in BACKENDS.items():
        for max_bs in MAX_BS:
            for topk in TOPK:
                for ctx in CONTEXT:
                    for steps in STEPS:
                        patched = draft_kv_indices_buffer_width(max_bs, topk, ctx)
                        before = unpatched_width(max_bs, topk, ctx)
                        out.append(
                            {
                                "backend": backend,
                                "dtype_bytes": dtype_bytes,
                                "max_bs": max_bs,
                                "topk": topk,
                                "context": ctx,
                                "steps": steps,
                                # eager rows at a full batch: the same expression before and after
                                "eager_bytes": rows_bytes(steps, max_bs * topk * ctx, dtype_bytes),
                                "graph_bytes_0512": rows_bytes(steps, before, dtype_bytes),
                                "graph_bytes_patched": rows_bytes(steps, patched, dtype_bytes),
                            }
                        )
    return out


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f}" if n < 10 * 2**20 else f"{n / 2**20:,.0f}"


def gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def sample_seq_lens(mix: str, n: int, ctx: int, steps: int, seed: int = 0) -> list[int]:
    rng = random.Random(f"{mix}/{n}/{ctx}/{seed}")
    return [max(1, min(int(MIXES[mix](rng, ctx)), ctx - steps)) for _ in range(n)]


def fill(seq_lens: list[int], topk: int, steps: int, width: int) -> tuple[float, float]:
    """(last row used / width, mean over the rows of used / width)."""
    num_seqs = len(seq_lens)
    used = [draft_kv_indices_used_len(sum(seq_lens), topk, num_seqs * topk, i + 1) for i in range(steps)]
    return used[-1] / width, statistics.mean(used) / width


def fill_rows(max_bs: int, topk: int, steps: int) -> tuple[list[list[str]], list[dict]]:
    rows = [
        [
            "sequence-length mix",
            "ctx",
            "mean len",
            "eager",
            "graph full",
            "graph 1/4",
            "0.5.12 FI graph, topk 1",
            "topk 2",
            "topk 4",
            "topk 8",
        ]
    ]
    raw = []
    for mix in MIXES:
        for ctx in CONTEXT:
            full = sample_seq_lens(mix, max_bs, ctx, steps)
            quarter = full[: max_bs // 4]
            patched = draft_kv_indices_buffer_width(max_bs, topk, ctx)
            eager = fill(full, topk, steps, draft_kv_indices_buffer_width(len(full), topk, ctx))
            graph_full = fill(full, topk, steps, patched)
            graph_quarter = fill(quarter, topk, steps, patched)
            # 0.5.12 FlashInfer graph row: max_bs * ctx wide whatever topk is
            need = {k: fill(full, k, steps, BACKENDS["flashinfer"][1](max_bs, k, ctx))[0] for k in TOPK}
            rows.append(
                [
                    mix,
                    f"{ctx // 1024}k",
                    f"{statistics.mean(full):.0f}",
                    f"{eager[0]:.1%}",
                    f"{graph_full[0]:.1%}",
                    f"{graph_quarter[0]:.1%}",
                ]
                + [f"{need[k]:.2f}" + (" OVERFLOW" if need[k] > 1 else "") for k in TOPK]
            )
            raw.append(
                {
                    "mix": mix,
                    "ctx": ctx,
                    "mean_len": statistics.mean(full),
                    "eager": eager[0],
                    "eager_mean_rows": eager[1],
                    "graph_full": graph_full[0],
                    "graph_quarter": graph_quarter[0],
                    "flashinfer_0512_need_over_width": need,
                }
            )
    return rows, raw


SHORT = {
    "short chat (lognormal, median 600)": "short chat\nmedian 600",
    "chat + long prompts (median 2k)": "chat + long\nprompts\nmedian 2k",
    "RAG / agents (median 8k)": "RAG / agents\nmedian 8k",
    "long context (uniform 25-100% of ctx)": "long context\n25-100%\nof ctx",
    "every request at the limit": "every request\nat the limit",
}


def size_label(mib: float) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def plot(data: list[dict], fill_raw: list[dict], fill_setting: tuple[int, int, int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 5.8), gridspec_kw={"width_ratios": [1, 1, 1.3]})
    colors = {1: "#4c72b0", 2: "#55a868", 4: "#dd8452", 8: "#c44e52"}
    steps = 5
    MiB = 2**20
    for ax, ctx in zip(axes[:2], (8192, 131072)):
        sel = [r for r in data if r["backend"] == "flashinfer" and r["context"] == ctx and r["steps"] == steps]
        for topk in TOPK:
            pts = sorted((r["max_bs"], r["graph_bytes_patched"] / MiB) for r in sel if r["topk"] == topk)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colors[topk], label=f"patched, topk {topk}")
        pts = sorted({(r["max_bs"], r["graph_bytes_0512"] / MiB) for r in sel})
        ax.plot(
            [p[0] for p in pts], [p[1] for p in pts], "k--", lw=2, label="0.5.12, any topk\n(too small for topk > 1)"
        )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(MAX_BS, [str(b) for b in MAX_BS])
        ticks = [2.0**e for e in range(-1, 14, 2)]
        ax.set_yticks(ticks, [size_label(t) for t in ticks])
        ax.set_ylim(0.5, 2**13)
        ax.set_xlabel("max batch size of the draft CUDA graphs (max_bs)")
        ax.set_ylabel("persistent GPU memory")
        ax.set_title(
            f"FlashInfer draft kv_indices, CUDA-graph rows, context {ctx // 1024}k\n"
            f"int32, {steps} steps (bytes scale with steps); Triton/Aiter:\n"
            f"same size before and after (Triton int64: x2)",
            fontsize=10,
        )
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    ax = axes[2]
    max_bs, topk, steps = fill_setting
    mixes = list(MIXES)
    ctx = 32768
    sel = {r["mix"]: r for r in fill_raw if r["ctx"] == ctx}
    series = [
        ("patched eager row", lambda r: r["eager"], "#4c72b0"),
        ("patched graph row, full batch", lambda r: r["graph_full"], "#55a868"),
        ("patched graph row, 1/4 batch", lambda r: r["graph_quarter"], "#a6dba0"),
        ("0.5.12 FlashInfer graph row: need / width", lambda r: r["flashinfer_0512_need_over_width"][topk], "#c44e52"),
    ]
    width = 0.2
    for i, (label, value, color) in enumerate(series):
        xs = [j + (i - 1.5) * width for j in range(len(mixes))]
        ys = [value(sel[m]) * 100 for m in mixes]
        ax.bar(xs, ys, width, label=label, color=color)
        for x, y in zip(xs, ys):
            ax.text(x, y + 4, f"{y:.0f}", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.axhline(100, color="black", lw=1)
    ax.text(-0.45, 104, "100% = row full (above: writes past it)", ha="left", va="bottom", fontsize=8)
    ax.set_xticks(range(len(mixes)), [SHORT[m] for m in mixes], fontsize=8)
    ax.set_ylim(0, 470)
    ax.set_ylabel("% of the last row's width")
    ax.set_title(
        f"fill of the last draft step's kv_indices row\nmax_bs {max_bs}, topk {topk}, {steps} steps, "
        f"context {ctx // 1024}k, {max_bs} requests per mix",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, 0.93))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", type=Path, help="write a PNG here")
    parser.add_argument("--csv", type=Path, help="write the whole grid (backend x max_bs x topk x ctx x steps) here")
    parser.add_argument(
        "--fill-setting", default="64,4,5", help="max_bs,topk,steps for the fill table (default 64,4,5)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    data = grid()
    print(
        f"draft kv_indices rows, {time.strftime('%Y-%m-%d %H:%M %Z')}; GiB = 2**30 bytes; "
        f"rows = speculative_num_steps in every allocation"
    )
    print()
    print("Per backend: rows x width x dtype (0.5.12 -> patched)")
    print(
        table(
            [
                ["backend", "dtype", "eager width (both)", "graph width 0.5.12", "graph width patched"],
                ["flashinfer", "int32", "batch_size*topk*ctx", "max_bs*ctx", "max_bs*topk*ctx"],
                ["flashinfer_mla", "int32", "batch_size*topk*ctx", "max_bs*ctx", "max_bs*topk*ctx"],
                ["triton", "int64", "batch_size*topk*ctx", "max_num_tokens*ctx = max_bs*topk*ctx", "max_bs*topk*ctx"],
                ["aiter", "int32", "batch_size*topk*ctx", "max_num_tokens*ctx = max_bs*topk*ctx", "max_bs*topk*ctx"],
            ]
        )
    )
    print()
    rows = [
        [
            "max_bs",
            "topk",
            "ctx",
            "FlashInfer 3 steps: 0.5.12",
            "patched",
            "extra",
            "8 steps: 0.5.12",
            "patched",
            "extra",
            "Triton 3 / 8 steps",
            "Aiter 3 / 8 steps",
        ]
    ]
    pick = {(r["backend"], r["max_bs"], r["topk"], r["context"], r["steps"]): r for r in data}
    for max_bs in (8, 64, 256):
        for topk in TOPK:
            for ctx in (4096, 32768, 131072):
                row = [str(max_bs), str(topk), f"{ctx // 1024}k"]
                for steps in (3, 8):
                    fi = pick["flashinfer", max_bs, topk, ctx, steps]
                    row += [
                        mib(fi["graph_bytes_0512"]),
                        mib(fi["graph_bytes_patched"]),
                        "+" + mib(fi["graph_bytes_patched"] - fi["graph_bytes_0512"]),
                    ]
                for backend in ("triton", "aiter"):
                    both = [pick[backend, max_bs, topk, ctx, steps] for steps in (3, 8)]
                    assert all(r["graph_bytes_0512"] == r["graph_bytes_patched"] for r in both)
                    row.append(" / ".join(mib(r["graph_bytes_patched"]) for r in both))
                rows.append(row)
    print(
        "CUDA-graph draft kv_indices rows, MiB (persistent). FlashInfer-MLA is FlashInfer's formula, but 0.5.12 "
        "refuses topk > 1 there, so it only ever runs the topk 1 rows (no change). The eager rows at a full batch "
        "(allocated at every forward) are the size of the patched graph rows."
    )
    print(table(rows))
    print()
    largest = max(data, key=lambda r: r["graph_bytes_patched"])
    print(
        f"largest in the grid: {largest['backend']} max_bs {largest['max_bs']} topk {largest['topk']} "
        f"ctx {largest['context']} steps {largest['steps']}: {gib(largest['graph_bytes_patched'])} GiB; widest row "
        f"{draft_kv_indices_buffer_width(max(MAX_BS), max(TOPK), max(CONTEXT)):,} entries (< 2**31 = {2**31:,})"
    )
    print()
    max_bs, topk, steps = (int(x) for x in args.fill_setting.split(","))
    rows, fill_raw = fill_rows(max_bs, topk, steps)
    print(
        f"Fill of the last row (step {steps - 1}, the fullest), used_len / width: patched rows at max_bs {max_bs}, "
        f"topk {topk}, {steps} steps; {max_bs} requests drawn per mix (seeded), each clipped to ctx - steps. "
        f"'0.5.12 FI graph' = need / width of the unpatched FlashInfer(-MLA) graph row at a full batch, per topk: "
        f"above 1 it overflows."
    )
    print(table(rows))
    print()
    if args.csv:
        with args.csv.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(data[0]))
            writer.writeheader()
            writer.writerows(data)
        print(f"grid: {args.csv} ({len(data)} rows)")
    if args.plot:
        plot(data, fill_raw, (max_bs, topk, steps), args.plot)
        print(f"plot: {args.plot}")
    print(f"elapsed {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
