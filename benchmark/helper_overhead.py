"""Does the patched code run as fast? The three layout helpers against the inline code they replace.

For a few (bs, topk, steps) settings, each helper and each patched site is timed against
the inline expression of unpatched SGLang 0.5.12, and its torch.profiler trace is counted:

* out_cache_loc layout (draft_forward, DSv4): ``per_step_draft_out_cache_loc(x, bs, topk, steps)``
  against ``x = x.reshape(bs, topk, steps); x = x.permute((2, 0, 1)).reshape(steps, -1)``;
* row width: ``draft_kv_indices_buffer_width(num_seqs, topk, ctx)`` against ``num_seqs * topk * ctx``;
* used length: ``draft_kv_indices_used_len(seq_lens_sum, topk, bs, i + 1)`` against
  ``seq_lens_sum * topk + bs * (i + 1)``;
* the sites as SGLang runs them: the per-step slice ``buf[i][: used_len(...)]`` and the eager
  row allocation ``torch.empty((steps, width(...)), dtype=torch.int32, device=...)``;
* the capacity check the patch adds to FlashInfer's ``common_template`` (used length against the
  row's width, ``assert ... <= buf.shape[1]``) against nothing (0.5.12 has none).

Per decode iteration: the sum of the differences a draft forward of ``steps`` steps runs on the
triton or FlashInfer path (what the patched 0.5.12 calls each iteration: the layout once in the
worker's draft_forward, the row width once in init_forward_metadata, the used length steps - 1
times in common_template, and on FlashInfer the capacity check once), the bound on the patch's
host cost that docs/performance.md sets against a decode iteration's time.

Time per call: ``timeit`` with the statement inline (no wrapper function around either side),
calibrated to about 2 ms per batch, 41 rounds alternating inline / helper; the table gives
the median per-call time of each side, their difference, the median of the per-round ratios,
and the noise (the inline side's own spread over the rounds, (p75 - p25) / median).
Ops: ``torch.profiler`` over 10 calls; aten ops (all levels, and top-level only) and, with
--device cuda, device kernels (CUDA events), each per call.

    python benchmark/helper_overhead.py                  # CPU
    python benchmark/helper_overhead.py --device cuda    # a CUDA GPU (guarded: exits 0 with a note without one)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import timeit

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from sglang_draft_layout.speculative.eagle_utils import per_step_draft_out_cache_loc
from sglang_draft_layout.speculative.spec_utils import draft_kv_indices_buffer_width, draft_kv_indices_used_len

#: (bs = num_seqs, topk, steps, max_context_len for the allocation, mean seq_len)
SETTINGS = [(1, 1, 3, 4096, 1000), (8, 4, 4, 4096, 2000), (32, 8, 5, 2048, 1500), (64, 1, 8, 4096, 3000)]
ROUNDS = 41
PROFILED_CALLS = 10


def cases(bs: int, topk: int, steps: int, ctx: int, seq_len: int, device: str) -> list[tuple[str, str, str, dict]]:
    """(name, inline statement, helper statement, namespace) for one setting."""
    branches = bs * topk  # SGLang's `bs` in common_template
    ns = {
        "torch": torch,
        "per_step_draft_out_cache_loc": per_step_draft_out_cache_loc,
        "draft_kv_indices_buffer_width": draft_kv_indices_buffer_width,
        "draft_kv_indices_used_len": draft_kv_indices_used_len,
        "x": torch.arange(bs * topk * steps, dtype=torch.int64, device=device),
        "bs": bs,
        "topk": topk,
        "steps": steps,
        "num_seqs": bs,
        "ctx": ctx,
        "branches": branches,
        "seq_lens_sum": bs * seq_len,
        "i": steps - 2,
        "device": device,
        "buf": torch.zeros((steps, bs * topk * ctx), dtype=torch.int32, device=device),
    }
    return [
        (
            "out_cache_loc layout",
            "o = x.reshape(bs, topk, steps); o = o.permute((2, 0, 1)).reshape(steps, -1)",
            "o = per_step_draft_out_cache_loc(x, bs, topk, steps)",
            ns,
        ),
        ("row width (int)", "w = num_seqs * topk * ctx", "w = draft_kv_indices_buffer_width(num_seqs, topk, ctx)", ns),
        (
            "used length (int)",
            "n = seq_lens_sum * topk + branches * (i + 1)",
            "n = draft_kv_indices_used_len(seq_lens_sum, topk, branches, i + 1)",
            ns,
        ),
        (
            "site: per-step slice",
            "r = buf[i][: seq_lens_sum * topk + branches * (i + 1)]",
            "r = buf[i][: draft_kv_indices_used_len(seq_lens_sum, topk, branches, i + 1)]",
            ns,
        ),
        (
            "site: eager row alloc",
            "b = torch.empty((steps, num_seqs * topk * ctx), dtype=torch.int32, device=device)",
            "b = torch.empty((steps, draft_kv_indices_buffer_width(num_seqs, topk, ctx)), dtype=torch.int32, device=device)",
            ns,
        ),
        (
            "site: capacity check",
            "pass",
            "n = draft_kv_indices_used_len(seq_lens_sum, topk, branches, steps)\n"
            "assert n <= buf.shape[1], f'row too small: need {n} > width {buf.shape[1]}'",
            ns,
        ),
    ]


def per_iteration_ns(diffs: dict[str, float], steps: int) -> dict[str, float]:
    """The patch's host-code change per decode iteration (ns) on each path, from the per-call
    differences (helper - inline) of the int helpers, the layout and the capacity check."""
    triton = diffs["out_cache_loc layout"] + diffs["row width (int)"] + (steps - 1) * diffs["used length (int)"]
    return {"triton": triton, "flashinfer": triton + diffs["site: capacity check"]}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def per_call_times(inline: str, helper: str, ns: dict, device: str) -> tuple[list[float], list[float]]:
    timers = [timeit.Timer(inline, globals=ns), timeit.Timer(helper, globals=ns)]
    number, elapsed = timers[0].autorange()  # takes at least 0.2 s
    number = max(1, round(number * 0.002 / elapsed))  # about 2 ms per batch
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(ROUNDS):
        for side, timer in enumerate(timers):
            sync(device)
            start = time.perf_counter()
            timer.timeit(number)
            sync(device)
            samples[side].append((time.perf_counter() - start) / number)
    return samples


@contextlib.contextmanager
def quiet_stderr():
    """The profiler's C++ side logs a line to fd 2 at every start and stop."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def op_counts(statement: str, ns: dict, device: str) -> tuple[float, float, float, str]:
    """(aten ops per call, top-level aten ops per call, device kernels per call, the ops of one call)."""
    code = compile(statement, "<stmt>", "exec")
    exec(code, ns)  # warm up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync(device)
    with quiet_stderr(), profile(activities=activities) as prof:
        for _ in range(PROFILED_CALLS):
            exec(code, ns)
        sync(device)
    events = prof.events()
    aten = [e for e in events if e.name.startswith("aten::") and e.device_type == DeviceType.CPU]
    top = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    per_call = len(top) // PROFILED_CALLS
    names = ", ".join(
        e.name + (f" > {'+'.join(c.name for c in e.cpu_children)}" if e.cpu_children else "") for e in top[:per_call]
    )
    return len(aten) / PROFILED_CALLS, len(top) / PROFILED_CALLS, len(kernels) / PROFILED_CALLS, names


def quartile_spread(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def fmt_ns(seconds: float) -> str:
    return f"{seconds * 1e9:.0f}"


def fmt_count(count: float) -> str:
    return f"{count:g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print(
            f"--device cuda: no CUDA device visible to torch {torch.__version__} "
            f"(torch.version.cuda={torch.version.cuda}); nothing measured"
        )
        return 0
    started = time.perf_counter()
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} torch threads"
    print(
        f"device: {device} ({name}), torch {torch.__version__}, python {sys.version.split()[0]}, "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}"
    )
    header = [
        "case",
        "bs,topk,steps",
        "inline ns",
        "helper ns",
        "diff ns",
        "ratio",
        "noise",
        "ratio of mins",
        "aten ops (top) inline",
        "aten ops (top) helper",
    ]
    if device == "cuda":
        header += ["kernels inline", "kernels helper"]
    rows = [header]
    op_names: dict[str, tuple[str, str]] = {}
    per_iteration: list[str] = []
    for setting in SETTINGS:
        bs, topk, steps = setting[:3]
        diffs: dict[str, float] = {}
        for case, inline, helper, ns in cases(*setting, device=device):
            exec(inline, ns)
            expected = {k: ns[k] for k in ("o", "w", "n", "r", "b") if k in ns}
            exec(helper, ns)
            for key, value in expected.items():  # both sides give the same result
                if key == "b":  # torch.empty: same shape and dtype, contents undefined
                    assert (value.shape, value.dtype) == (ns[key].shape, ns[key].dtype), case
                elif isinstance(value, torch.Tensor):
                    assert torch.equal(value, ns[key]) and value.stride() == ns[key].stride(), case
                else:
                    assert value == ns[key], case
            t_inline, t_helper = per_call_times(inline, helper, ns, device)
            ratio = statistics.median(h / i for i, h in zip(t_inline, t_helper))
            diffs[case] = (statistics.median(t_helper) - statistics.median(t_inline)) * 1e9
            ops_inline, ops_helper = op_counts(inline, ns, device), op_counts(helper, ns, device)
            op_names.setdefault(case, (ops_inline[3], ops_helper[3]))
            row = [
                case,
                f"{bs},{topk},{steps}",
                fmt_ns(statistics.median(t_inline)),
                fmt_ns(statistics.median(t_helper)),
                f"{diffs[case]:+.0f}",
                f"{ratio:.2f}",
                f"{quartile_spread(t_inline) * 100:.0f}%",
                f"{min(t_helper) / min(t_inline):.2f}",
                f"{fmt_count(ops_inline[0])} ({fmt_count(ops_inline[1])})",
                f"{fmt_count(ops_helper[0])} ({fmt_count(ops_helper[1])})",
            ]
            if device == "cuda":
                row += [fmt_count(ops_inline[2]), fmt_count(ops_helper[2])]
            rows.append(row)
            for key in ("o", "w", "n", "r", "b"):
                ns.pop(key, None)
        paths = per_iteration_ns(diffs, steps)
        per_iteration.append(
            f"  {bs},{topk},{steps}: " + ", ".join(f"{path} {ns_:+.0f} ns" for path, ns_ in paths.items())
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths))))
        if index == 0:
            print("  ".join("-" * w for w in widths))
    print(
        "ns: median time per call; diff: helper - inline; ratio: median of the per-round helper/inline ratios; "
        "noise: the inline side's (p75 - p25) / median over the rounds; ratio of mins: fastest round against fastest round; "
        "aten ops: all (top-level) per call" + ("; kernels: CUDA kernels per call" if device == "cuda" else "")
    )
    print()
    print("aten ops of one call (top-level > nested):")
    for case, (inline_ops, helper_ops) in op_names.items():
        print(f"  {case}: inline [{inline_ops or '-'}]  helper [{helper_ops or '-'}]")
    print()
    print(
        "per decode iteration, helper - inline (layout + width + (steps - 1) x used length [+ FlashInfer's capacity check]):"
    )
    print("\n".join(per_iteration))
    print(f"elapsed {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
