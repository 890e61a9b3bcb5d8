"""rules/kv_indices_graph_width.py: the CUDA-graph kv_indices row width of init_cuda_graph_state.

``max_bs * self.max_context_len`` (FlashInfer, FlashInfer-MLA: topk missing) and
``max_num_tokens * self.max_context_len`` (Triton, Aiter) become
``kv_indices_width = draft_kv_indices_buffer_width(max_bs, self.topk, self.max_context_len)``.
"""

from __future__ import annotations

import pytest

from rule_test_support import (
    AITER,
    COMMON_TEMPLATE,
    EAGER,
    FLASHINFER,
    FLASHINFER_MLA,
    GRAPH,
    INIT,
    TRITON,
    assert_refused,
    backend_header,
    backend_module,
    line_of,
    method_source,
    rule,
    write_bystanders,
)
from sglang_draft_layout.rules.base import State

CLS = "FlashInferMultiStepDraftBackend"
SCOPE = f"{CLS}.init_cuda_graph_state"
RULE = rule("graph-width:flashinfer")
HEADER_AFTER = backend_header("draft_kv_indices_buffer_width")

AFTER = """\
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        kv_indices_width = draft_kv_indices_buffer_width(
            max_bs, self.topk, self.max_context_len
        )
        self.cuda_graph_kv_indices = torch.zeros(
            (self.speculative_num_steps, kv_indices_width),
            dtype=torch.int32,
            device="cuda",
        )

        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_cuda_graph_state(
                max_bs, max_num_tokens, kv_indices_buf=self.cuda_graph_kv_indices[i]
            )
"""


def test_before_after_whole_file(sglang_tree):
    before = backend_module(CLS)
    sglang_tree.write(FLASHINFER, before)

    plan = sglang_tree.apply([RULE])

    [finding] = plan.findings
    assert (finding.state, finding.line) == (
        State.TO_PATCH,
        line_of(before, "self.cuda_graph_kv_indices = torch.zeros("),
    )
    after = sglang_tree.read(FLASHINFER)
    assert method_source(after, SCOPE) == AFTER
    assert after == backend_module(CLS, INIT, COMMON_TEMPLATE, EAGER, AFTER, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])
    assert sglang_tree.read(FLASHINFER) == after


@pytest.mark.parametrize(
    "rule_id, relative, cls, rows, dtype, device",
    [
        ("graph-width:flashinfer", FLASHINFER, "FlashInferMultiStepDraftBackend", "max_bs", "torch.int32", '"cuda"'),
        (
            "graph-width:flashinfer_mla",
            FLASHINFER_MLA,
            "FlashInferMLAMultiStepDraftBackend",
            "max_bs",
            "torch.int32",
            '"cuda"',
        ),
        ("graph-width:triton", TRITON, "TritonMultiStepDraftBackend", "max_num_tokens", "torch.int64", "self.device"),
        ("graph-width:aiter", AITER, "AiterMultiStepDraftBackend", "max_num_tokens", "torch.int32", "self.device"),
    ],
)
def test_every_backend_sizes_by_max_bs_and_keeps_dtype_and_device(
    sglang_tree, rule_id, relative, cls, rows, dtype, device
):
    def site(text):
        return text.replace("dtype=torch.int32", f"dtype={dtype}").replace('device="cuda"', f"device={device}")

    sglang_tree.write(relative, backend_module(cls, INIT, site(GRAPH.replace("max_bs * self", f"{rows} * self"))))
    sglang_tree.apply([rule(rule_id)])
    assert sglang_tree.read(relative) == backend_module(cls, INIT, site(AFTER), header=HEADER_AFTER)
    sglang_tree.assert_idempotent([rule(rule_id)])


def test_with_the_eager_rule_one_import(sglang_tree):
    rules = [rule("eager-width:flashinfer"), RULE]
    sglang_tree.write(FLASHINFER, backend_module(CLS))
    sglang_tree.apply(rules)
    after = sglang_tree.read(FLASHINFER)
    assert after.startswith(HEADER_AFTER)
    assert after.count("import draft_kv_indices_buffer_width") == 1
    assert method_source(after, SCOPE) == AFTER
    sglang_tree.assert_idempotent(rules)


def width_stmt(num_seqs="max_bs"):
    return (
        f"        kv_indices_width = draft_kv_indices_buffer_width(\n"
        f"            {num_seqs}, self.topk, self.max_context_len\n"
        f"        )\n"
    )


def _graph(allocation: str, params="self, max_bs: int, max_num_tokens: int") -> str:
    return f"    def init_cuda_graph_state({params}):\n{allocation}        self.ready = True\n"


def one_line(width="kv_indices_width", target="self.cuda_graph_kv_indices"):
    return f"        {target} = torch.zeros((self.speculative_num_steps, {width}), dtype=torch.int32)\n"


STRUCTURAL = {
    "max_context_len first": (_graph(one_line("self.max_context_len * max_bs")), _graph(width_stmt() + one_line())),
    "topk already there": (
        _graph(one_line("max_bs * self.topk * self.max_context_len")),
        _graph(width_stmt() + one_line()),
    ),
    "topk first": (_graph(one_line("self.topk * max_bs * self.max_context_len")), _graph(width_stmt() + one_line())),
    "parenthesised": (_graph(one_line("(max_bs) * (self.max_context_len)")), _graph(width_stmt() + one_line())),
    "max_num_tokens rows": (
        _graph(one_line("max_num_tokens * self.max_context_len")),
        _graph(width_stmt() + one_line()),
    ),
    "renamed parameters": (
        _graph(one_line("tokens_cap * self.max_context_len"), params="self, bs_cap, tokens_cap"),
        _graph(width_stmt("bs_cap") + one_line(), params="self, bs_cap, tokens_cap"),
    ),
    "renamed buffer and a local": (
        _graph(one_line("max_bs * self.max_context_len", target="rows")),
        _graph(width_stmt() + one_line(target="rows")),
    ),
    "comment and blank line above": (
        _graph(
            "        n = 1\n\n        # Rows the draft CUDA graphs capture.\n"
            + one_line("max_bs * self.max_context_len")
        ),
        _graph("        n = 1\n\n        # Rows the draft CUDA graphs capture.\n" + width_stmt() + one_line()),
    ),
    "multi-line shape": (
        _graph(
            "        self.cuda_graph_kv_indices = torch.zeros(\n"
            "            (\n"
            "                self.speculative_num_steps,\n"
            "                max_bs\n"
            "                * self.max_context_len,\n"
            "            ),\n"
            "            dtype=torch.int32,\n"
            "        )\n"
        ),
        _graph(
            width_stmt() + "        self.cuda_graph_kv_indices = torch.zeros(\n"
            "            (self.speculative_num_steps, kv_indices_width),\n"
            "            dtype=torch.int32,\n"
            "        )\n"
        ),
    ),
}


@pytest.mark.parametrize("before, after", STRUCTURAL.values(), ids=STRUCTURAL.keys())
def test_structural_variants(sglang_tree, before, after):
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, before))
    assert sglang_tree.apply([RULE]).findings[0].state is State.TO_PATCH
    assert sglang_tree.read(FLASHINFER) == backend_module(CLS, INIT, after, header=HEADER_AFTER)
    sglang_tree.assert_idempotent([RULE])


def test_method_moved_first_in_the_class(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module(CLS, GRAPH, INIT, COMMON_TEMPLATE, EAGER))
    sglang_tree.apply([RULE])
    assert sglang_tree.read(FLASHINFER) == backend_module(CLS, AFTER, INIT, COMMON_TEMPLATE, EAGER, header=HEADER_AFTER)


@pytest.mark.parametrize(
    "allocation",
    [
        width_stmt() + one_line(),
        "        w = draft_kv_indices_buffer_width(max_bs, self.topk, self.max_context_len)\n" + one_line("w"),
        one_line("draft_kv_indices_buffer_width(max_bs, self.topk, self.max_context_len)"),
    ],
    ids=["0.5.13 kv_indices_width", "other local name", "inline call"],
)
def test_already_upstream_is_patched_and_unchanged(sglang_tree, allocation):
    text = backend_module(CLS, INIT, _graph(allocation), header=HEADER_AFTER)
    sglang_tree.write(FLASHINFER, text)
    plan = sglang_tree.plan([RULE])
    assert [(f.state, f.line) for f in plan.findings] == [
        (State.PATCHED, line_of(text, "self.cuda_graph_kv_indices = torch.zeros("))
    ]
    assert plan.changes == ()


REFUSED = {
    "constant factor": "max_bs * 2 * self.max_context_len",
    "attribute, not the parameter": "self.max_bs * self.max_context_len",
    "unknown local": "num_rows * self.max_context_len",
    "only max_context_len": "self.max_context_len",
    "a sum": "max_bs * self.max_context_len + 1",
    "no max_context_len": "max_bs * self.topk * 4096",
    "a local not bound to the helper": "width",
}


@pytest.mark.parametrize("width", REFUSED.values(), ids=REFUSED.keys())
def test_unknown_width_is_unrecognised(sglang_tree, width):
    text = backend_module(CLS, INIT, _graph(one_line(width)))
    sglang_tree.write(FLASHINFER, text)
    plan = sglang_tree.plan([RULE])
    [finding] = plan.findings
    assert (finding.state, finding.line, finding.detail) == (
        State.UNRECOGNISED,
        line_of(text, "self.cuda_graph_kv_indices = torch.zeros("),
        f"row width `{width}` is no known form",
    )
    assert plan.changes == ()


def test_no_row_allocation_is_unrecognised_at_the_def(sglang_tree):
    text = backend_module(CLS, INIT, _graph("        self.cuda_graph_kv_indices = None\n"))
    sglang_tree.write(FLASHINFER, text)
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.line) == (State.UNRECOGNISED, line_of(text, "def init_cuda_graph_state"))


def test_apply_refuses_and_writes_nothing(sglang_tree):
    cls = "FlashInferMLAMultiStepDraftBackend"
    graph = GRAPH.replace("max_bs * self.max_context_len", "max_bs * 2 * self.max_context_len")
    text = backend_module(cls, INIT, COMMON_TEMPLATE, EAGER, graph)
    sglang_tree.write(FLASHINFER_MLA, text)
    write_bystanders(sglang_tree, besides=FLASHINFER_MLA)
    assert_refused(
        sglang_tree,
        FLASHINFER_MLA,
        line_of(text, "self.cuda_graph_kv_indices = torch.zeros("),
        f"{cls}.init_cuda_graph_state",
        "CUDA-graph kv_indices row width",
        "row width `max_bs * 2 * self.max_context_len` is no known form",
    )


def test_class_absent(sglang_tree):
    sglang_tree.write(TRITON, backend_module("TritonAttnBackend"))
    [finding, *guarded] = sglang_tree.plan([rule("graph-width:triton")]).findings
    assert (finding.state, finding.detail) == (State.ABSENT, "no class TritonMultiStepDraftBackend")
    # the renamed class holds the draft layout: the structural guard reports it
    assert guarded and {f.rule.scope.split(".")[0] for f in guarded} == {"TritonAttnBackend"}


def test_class_without_the_method_is_unrecognised(sglang_tree):
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, COMMON_TEMPLATE, EAGER))
    [finding] = sglang_tree.plan([RULE]).findings
    assert (finding.state, finding.detail) == (State.UNRECOGNISED, f"class {CLS} has no init_cuda_graph_state()")


def test_comment_inside_the_shape_tuple_is_kept(sglang_tree):
    allocation = (
        "        self.cuda_graph_kv_indices = torch.zeros(\n"
        "            (\n"
        "                self.speculative_num_steps,\n"
        "                # topk is missing here (upstream 27338)\n"
        "                max_bs * self.max_context_len,\n"
        "            ),\n"
        "        )\n"
    )
    sglang_tree.write(FLASHINFER, backend_module(CLS, INIT, _graph(allocation)))
    sglang_tree.apply([RULE])
    after = method_source(sglang_tree.read(FLASHINFER), SCOPE)
    assert "kv_indices_width = draft_kv_indices_buffer_width(" in after
    assert after.count("# topk is missing here (upstream 27338)\n") == 1


#: a fork's own per-step indptr allocated before the rows (the shape of SGLang-FluentLLM's draft backends'
#: ``(self.speculative_num_steps, max_bs + 1)``, meituan-longcat/SGLang-FluentLLM@a9db4a83, flashinfer_backend.py)
INDPTR_FIRST = """\
        self.cuda_graph_kv_indptr = torch.zeros(
            (self.speculative_num_steps, max_bs + 1),
            dtype=torch.int32,
            device="cuda",
        )
"""


def test_the_site_is_the_rows_not_an_indptr_allocated_before_them(sglang_tree):
    head = "    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):\n"
    before = backend_module(CLS, INIT, GRAPH.replace(head, head + INDPTR_FIRST))
    sglang_tree.write(FLASHINFER, before)
    [finding] = sglang_tree.apply([RULE]).findings
    assert (finding.state, finding.line) == (
        State.TO_PATCH,
        line_of(before, "self.cuda_graph_kv_indices = torch.zeros("),
    )
    assert method_source(sglang_tree.read(FLASHINFER), SCOPE) == AFTER.replace(head, head + INDPTR_FIRST)
