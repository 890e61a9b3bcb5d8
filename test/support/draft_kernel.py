"""SGLang's own ``generate_draft_decode_kv_indices`` Triton kernel, runnable on CPU.

The kernel lives in ``sglang/srt/speculative/spec_utils.py`` (0.5.3 on; ``eagle_utils.py``
before), whose imports pull in most of SGLang. Instead of importing that module, the
kernel's source is cut out of the unpacked release wheel with ``ast`` at test time,
written to a module in the cache (never into this repository) whose only imports are
``triton`` and ``triton.language as tl``, and loaded from there (Triton's ``jit`` needs
a real source file to read the function back).

``TRITON_INTERPRET=1`` is set before triton is imported here; triton 3.x then runs the
kernel with its Python interpreter on CPU torch tensors.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from sglang_draft_layout.releases import cache_dir

from .sglang_release import pristine_tree
from .wheel_source import wheel_source

KERNEL_NAME = "generate_draft_decode_kv_indices"
SPEC_UTILS = Path("sglang/srt/speculative/spec_utils.py")
#: where releases keep the kernel: spec_utils.py from 0.5.3 on, eagle_utils.py before
KERNEL_MODULES = (SPEC_UTILS, Path("sglang/srt/speculative/eagle_utils.py"))
# What the kernel may reference from its module: anything else would have to be provided.
ALLOWED_GLOBALS = {"triton", "tl"}


def kernel_source(spec_utils_file: Path) -> tuple[str, set[str]]:
    """The kernel's source (decorators included) and the module-level names it uses."""
    text = spec_utils_file.read_text()
    tree = ast.parse(text)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == KERNEL_NAME]
    if len(found) != 1:
        raise LookupError(f"{spec_utils_file}: {len(found)} top-level defs of {KERNEL_NAME}")
    fn = found[0]
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    lines = text.splitlines(keepends=True)[first - 1 : fn.end_lineno]
    source = "".join(lines)

    args = fn.args
    local = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            local.add(node.id)
    used = {
        node.id
        for node in ast.walk(ast.Module(body=[fn], type_ignores=[]))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    free = {n for n in used - local if not hasattr(builtins, n)}
    return source, free


def kernel_module(version: str) -> Path:
    """The file of sglang==version (relative to the tree) that defines the kernel."""
    for module in KERNEL_MODULES:
        file = pristine_tree(version) / module
        if file.is_file() and f"def {KERNEL_NAME}(" in file.read_text():
            return module
    raise LookupError(f"no {KERNEL_NAME} in sglang=={version}")


def load_kernel(version: str = "0.5.12"):
    """SGLang==version's kernel as a Triton function that runs under the interpreter."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language as tl  # decorates tl's own @jit helpers: must come after

    if type(tl.cdiv).__name__ != "InterpretedFunction":
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set, so triton.language's "
            "helpers (tl.cdiv, tl.sum) cannot run on CPU; set TRITON_INTERPRET=1 in the "
            "environment, or import this module before anything imports triton"
        )

    kernel_file = kernel_module(version)
    source, free = kernel_source(pristine_tree(version) / kernel_file)
    if not free <= ALLOWED_GLOBALS:
        raise LookupError(f"{KERNEL_NAME} of sglang=={version} also uses {sorted(free - ALLOWED_GLOBALS)}")

    module_text = (
        f"# Cut at test time out of sglang=={version} {kernel_file} (not part of the repo).\n"
        "import triton\nimport triton.language as tl\n\n\n" + source
    )
    digest = hashlib.sha256(module_text.encode()).hexdigest()[:12]
    folder = cache_dir() / "proof-kernels"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"draft_kernel_{version.replace('.', '_')}_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(module_text)
        os.replace(tmp, path)

    name = f"_sglang_draft_kernel_{version.replace('.', '_')}"
    if name in sys.modules:
        module = sys.modules[name]
    else:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    kernel = getattr(module, KERNEL_NAME)
    if type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError(f"{KERNEL_NAME} was built as {type(kernel).__name__}, not interpreted")
    return kernel


SENTINEL = -1  # never a KV slot: req_to_token below holds positive slots only


class DraftLaunch:
    """One launch of the kernel the way the ``*MultiStepDraftBackend.common_template``
    methods of 0.5.12 do it (flashinfer_backend.py, flashinfer_mla_backend.py,
    triton_backend.py, aiter_backend.py all pass the same arguments):

        kernel[(num_steps, num_seqs, topk)](
            req_pool_indices, req_to_token, seq_lens, kv_indices_buffer, kv_indptr,
            positions, pool_len, kv_indices_buffer.shape[1], kv_indptr.shape[1],
            next_power_of_2(num_seqs), next_power_of_2(num_steps),
            next_power_of_2(topk * num_seqs), page_size)

    with positions = seq_lens.repeat_interleave(topk) (eagle_worker.py) and kv_indptr of
    shape (num_steps, kv_indptr_cols). The rows are viewed out of the front of ONE flat
    buffer filled with SENTINEL and followed by ``guard`` more entries, so a write past a
    row lands in the next row or in the guard band, where it can be seen.
    """

    def __init__(
        self,
        *,
        seq_lens,
        topk,
        num_steps,
        page_size,
        row_width,
        max_context_len,
        kv_dtype,
        guard=256,
        kv_indptr_cols=None,
        seed=0,
    ):
        import torch

        self.seq_lens_list = [int(s) for s in seq_lens]
        self.num_seqs = len(self.seq_lens_list)
        self.topk, self.num_steps, self.page_size = topk, num_steps, page_size
        self.row_width, self.guard = row_width, guard
        self.bs = topk * self.num_seqs
        self.seq_lens_sum = sum(self.seq_lens_list)
        gen = torch.Generator().manual_seed(seed)

        # req_to_token pool: distinct positive slots, so every entry says where it came from.
        # Each row is long enough for the prefix plus every branch's draft pages.
        pages_per_topk = (page_size - 1 + num_steps + page_size - 1) // page_size
        self.pool_len = max_context_len + topk * pages_per_topk * page_size + page_size
        pool_rows = self.num_seqs + 3
        self.req_to_token = (
            (torch.randperm(pool_rows * self.pool_len, generator=gen, dtype=torch.int64) + 1)
            .to(torch.int32)
            .view(pool_rows, self.pool_len)
        )
        self.req_pool_indices = torch.randperm(pool_rows, generator=gen)[: self.num_seqs]
        self.seq_lens = torch.tensor(self.seq_lens_list, dtype=torch.int64)
        self.positions = self.seq_lens.repeat_interleave(topk)

        # The guard band always covers the furthest the kernel can write (from its
        # definition: branch offsets sum seq_len + iters), so an overrun is caught in the
        # buffer instead of landing in memory the tensor does not own.
        reach = max(i * row_width + topk * sum(s + i + 1 for s in self.seq_lens_list) for i in range(num_steps))
        self.guard = guard = max(guard, reach - num_steps * row_width + 64)
        self.flat = torch.full((num_steps * row_width + guard,), SENTINEL, dtype=kv_dtype)
        self.rows = self.flat[: num_steps * row_width].view(num_steps, row_width)
        cols = kv_indptr_cols if kv_indptr_cols is not None else self.bs + 1
        self.kv_indptr = torch.full((num_steps, cols), SENTINEL, dtype=torch.int32)

    def run(self, kernel):
        import triton

        kernel[(self.num_steps, self.num_seqs, self.topk)](
            self.req_pool_indices,
            self.req_to_token,
            self.seq_lens,
            self.rows,
            self.kv_indptr,
            self.positions,
            self.pool_len,
            self.rows.shape[1],
            self.kv_indptr.shape[1],
            triton.next_power_of_2(self.num_seqs),
            triton.next_power_of_2(self.num_steps),
            triton.next_power_of_2(self.bs),
            self.page_size,
        )
        return self

    # --- the plain-Python reference, read off the kernel's definition -----------------
    def branch_slots(self, bid: int, topk_id: int, step: int) -> list[int]:
        """KV slots branch (bid, topk_id) attends at draft step ``step`` (0-based): its
        sequence's prefix from req_to_token, then its draft tokens of steps 0..step."""
        row = self.req_to_token[int(self.req_pool_indices[bid])].tolist()
        seq_len, iters, p = self.seq_lens_list[bid], step + 1, self.page_size
        if p == 1 or self.topk == 1:
            # each branch owns num_steps consecutive slots after the prefix
            start = seq_len + topk_id * self.num_steps
        else:
            # each branch owns its own new pages after the prefix's last (partial) page,
            # and continues at the same in-page offset as the prefix
            last_page_len = seq_len % p
            new_pages = (last_page_len + self.num_steps + p - 1) // p
            start = seq_len // p * p + topk_id * new_pages * p + last_page_len
        return row[:seq_len] + row[start : start + iters]

    def expected_row(self, step: int) -> list[int]:
        out = []
        for bid in range(self.num_seqs):
            for t in range(self.topk):
                out += self.branch_slots(bid, t, step)
        return out

    def expected_indptr(self, step: int) -> list[int]:
        """kv_indptr[step][: bs + 1]: branch starts, branch-major (bid, topk_id). The
        kernel never writes entry 0 (SGLang allocates kv_indptr with torch.zeros)."""
        out, acc = [0], 0
        for bid in range(self.num_seqs):
            for _ in range(self.topk):
                acc += self.seq_lens_list[bid] + step + 1
                out.append(acc)
        return out


def kernel_source_in_wheel(version: str) -> str:
    """The kernel's source as shipped in the sglang==version wheel (eagle_utils.py before
    0.5.3; 0.5.13 moved it to speculative/triton_ops/cache_locs.py), read straight out of
    the cached wheel."""
    for name in (*(str(module) for module in KERNEL_MODULES), "sglang/srt/speculative/triton_ops/cache_locs.py"):
        try:
            text = wheel_source(version, name)
        except KeyError:  # not in this release
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name == KERNEL_NAME:
                return ast.get_source_segment(text, node)
    raise LookupError(f"no {KERNEL_NAME} in sglang=={version}")
