"""The two bugs, on SGLang's own methods: present unpatched, gone once patched.

The methods run as the release wrote them (see test/support/real_methods.py): the
FlashInfer draft backend's real __init__, init_cuda_graph_state, common_template and
replay path with SGLang's own kernel under TRITON_INTERPRET, on one release of each
family whose methods and kernel differ (0.4.8 to 0.5.12; every other release from
0.4.6.post5 on is shown to have one family's methods and kernel, by their ast); the
one-parameter ``init_cuda_graph_state`` of 0.4.6.post5 to 0.4.7.post1 holding every step
unpatched (not affected); DeepSeek-V4's real init_forward_metadata and
init_forward_metadata_decode (0.5.12).
"""

from __future__ import annotations

import ast
import inspect
import shutil
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from support.draft_kernel import KERNEL_NAME, DraftLaunch, load_kernel  # noqa: E402
from support.real_methods import (  # noqa: E402
    GUARD_FILL,
    fake_sglang_module,
    guarded_torch,
    load_methods,
    top_level_function,
)
from support.sglang_release import pristine_tree  # noqa: E402

from sglang_draft_layout import engine  # noqa: E402
from sglang_draft_layout.releases import release_wheel  # noqa: E402
from sglang_draft_layout.target import resolve  # noqa: E402

RELEASE = "0.5.12"
SRT = Path("sglang/srt")
FLASHINFER = SRT / "layers/attention/flashinfer_backend.py"
FLASHINFER_MLA = SRT / "layers/attention/flashinfer_mla_backend.py"
DSV4 = SRT / "layers/attention/deepseek_v4_backend.py"
SPEC_UTILS = SRT / "speculative/spec_utils.py"
EAGLE_UTILS = SRT / "speculative/eagle_utils.py"
WORKER_V2 = SRT / "speculative/eagle_worker_v2.py"
DRAFT_METHODS = (
    "__init__",
    "common_template",
    "init_cuda_graph_state",
    "init_forward_metadata",
    "init_forward_metadata_replay_cuda_graph",
)


#: one release per family of FlashInfer draft-backend methods (the ast of DRAFT_METHODS and
#: of the kernel), and the releases of that family (test_every_release_has_a_proven_familys_code)
FAMILIES = {
    # init_cuda_graph_state(self, max_bs): rows per branch; 0.4.6.post5 and 0.4.7 each with a
    # kernel of its own (draft slots step-major, as their draft_forward splits out_cache_loc)
    "0.4.6.post5": ["0.4.6.post5"],
    "0.4.7": ["0.4.7"],
    "0.4.7.post1": ["0.4.7.post1"],
    "0.4.8": [
        "0.4.8",
        "0.4.8.post1",
        "0.4.9",
        "0.4.9.post1",
        "0.4.9.post2",
        "0.4.9.post3",
        "0.4.9.post4",
        "0.4.9.post5",
        "0.4.9.post6",
        "0.4.10",
        "0.4.10.post1",
        "0.4.10.post2",
        "0.5.0rc0",
    ],
    "0.5.2": ["0.5.0rc1", "0.5.0rc2", "0.5.1", "0.5.1.post1", "0.5.1.post2", "0.5.1.post3", "0.5.2"],
    "0.5.3": ["0.5.3", "0.5.3.post1"],
    RELEASE: [
        "0.5.3.post2",
        "0.5.3.post3",
        "0.5.4",
        "0.5.4.post1",
        "0.5.4.post2",
        "0.5.4.post3",
        "0.5.5",
        "0.5.5.post1",
        "0.5.5.post2",
        "0.5.5.post3",
        "0.5.6",
        "0.5.6.post1",
        "0.5.6.post2",
        "0.5.7",
        "0.5.8",
        "0.5.8.post1",
        "0.5.9",
        "0.5.10",
        "0.5.10.post1",
        "0.5.11",
        "0.5.12",
        "0.5.12.post1",
    ],
}
PER_BRANCH = ["0.4.6.post5", "0.4.7", "0.4.7.post1"]
NARROW_ROW = [version for version in FAMILIES if version not in PER_BRANCH]


@pytest.fixture(scope="module")
def release_trees(tmp_path_factory):
    """release_trees(version) -> the unpatched release and a copy patched by this project's engine."""
    made: dict[str, dict[str, Path]] = {}

    def get(version: str) -> dict[str, Path]:
        if version not in made:
            unpatched = pristine_tree(version)
            patched = tmp_path_factory.mktemp(f"patched-{version}")
            shutil.copytree(unpatched / "sglang", patched / "sglang")
            engine.apply(resolve(str(patched)))
            made[version] = {"unpatched": unpatched, "patched": patched}
        return made[version]

    return get


@pytest.fixture(scope="module")
def trees(release_trees) -> dict[str, Path]:
    return release_trees(RELEASE)


class RecordingAttnBackend:
    """Stands in for the per-step FlashInfer backends: records the kv_indices each step gets."""

    def __init__(self, model_runner, **_):
        self.max_context_len = model_runner.context_len
        self.seen: list = []

    def init_cuda_graph_state(self, *args, **kwargs):
        pass

    def _record(self, *args, spec_info=None, **kwargs):
        self.seen.append(spec_info.kv_indices.clone())

    init_forward_metadata_replay_cuda_graph = _record


def draft_backend(
    tree: Path,
    file: Path,
    class_name: str,
    launch: DraftLaunch,
    *,
    topk,
    steps,
    max_bs,
    context_len,
    monkeypatch,
    allocations,
    version=RELEASE,
):
    """The release's multi-step draft backend, built by its real __init__ around stubs."""
    kernel = load_kernel(version)
    for module in ("spec_utils", "eagle_utils"):  # __init__ imports the kernel from either
        fake_sglang_module(monkeypatch, f"sglang.srt.speculative.{module}", generate_draft_decode_kv_indices=kernel)
    namespace = {
        "torch": guarded_torch(allocations),
        "next_power_of_2": lambda n: 1 << (n - 1).bit_length() if n > 0 else 1,
        "FlashInferAttnBackend": RecordingAttnBackend,
        "FlashInferMLAAttnBackend": RecordingAttnBackend,
        "ForwardMode": SimpleNamespace(DECODE="decode"),
        "global_override_indptr_cpu": None,
        "EagleDraftInput": SimpleNamespace,  # common_template asserts isinstance before 0.5.3
    }
    for helper in ("draft_kv_indices_buffer_width", "draft_kv_indices_used_len"):
        if helper in (tree / file).read_text():  # the patched tree imports the helpers
            top_level_function(tree / SPEC_UTILS, helper, namespace)
    cls = load_methods(tree / file, class_name, DRAFT_METHODS, namespace)
    model_runner = SimpleNamespace(
        page_size=launch.page_size,
        device="cpu",
        context_len=context_len,
        server_args=SimpleNamespace(page_size=launch.page_size),
        req_to_token_pool=SimpleNamespace(size=max_bs, req_to_token=launch.req_to_token),
    )
    return cls(model_runner, topk, steps)


def replay_batch(launch: DraftLaunch):
    return SimpleNamespace(
        batch_size=launch.num_seqs,
        seq_lens_sum=launch.seq_lens_sum,
        seq_lens=launch.seq_lens,
        seq_lens_cpu=launch.seq_lens,
        req_pool_indices=launch.req_pool_indices,
        positions=launch.positions,
        req_to_token_pool=SimpleNamespace(req_to_token=launch.req_to_token),
        spec_info=SimpleNamespace(kv_indptr=None, kv_indices=None, is_draft_input=lambda: True),
    )


def run_graph_replay(
    tree, file, class_name, *, seq_lens, topk, steps, max_bs, context_len, monkeypatch, version=RELEASE
):
    launch = DraftLaunch(
        seq_lens=seq_lens,
        topk=topk,
        num_steps=steps,
        page_size=1,
        row_width=1,
        max_context_len=context_len,
        kv_dtype=torch.int32,
    )
    allocations: list = []
    backend = draft_backend(
        tree,
        file,
        class_name,
        launch,
        topk=topk,
        steps=steps,
        max_bs=max_bs,
        context_len=context_len,
        monkeypatch=monkeypatch,
        allocations=allocations,
        version=version,
    )
    if len(inspect.signature(backend.init_cuda_graph_state).parameters) == 1:
        backend.init_cuda_graph_state(max_bs * topk)  # the draft graph runner's max_num_token (before 0.4.8)
    else:
        backend.init_cuda_graph_state(max_bs, max_bs * topk)
    rows = backend.cuda_graph_kv_indices
    flat = next(a for a in allocations if a.data_ptr() == rows.data_ptr())
    backend.init_forward_metadata_replay_cuda_graph(replay_batch(launch), launch.num_seqs)
    # before 0.5.4 a per-step backend is built for the last step too, which never runs
    seen = [b.seen[0].tolist() for b in backend.attn_backends if b.seen]
    overflow = int((flat[rows.numel() :] != GUARD_FILL).sum())
    return launch, rows, seen, overflow


# 3 sequences of 5, 9 and 4 tokens, topk 2, 3 steps, a 15-token context, graphs for 3 sequences:
# 0.5.12 sizes FlashInfer's graph rows max_bs * max_context_len = 45; step i needs 42, 48, 54.
LONG = dict(seq_lens=[5, 9, 4], topk=2, steps=3, max_bs=3, context_len=15)


@pytest.mark.parametrize("version", NARROW_ROW)
def test_unpatched_flashinfer_graph_rows_overflow(release_trees, monkeypatch, version):
    launch, rows, seen, overflow = run_graph_replay(
        release_trees(version)["unpatched"],
        FLASHINFER,
        "FlashInferMultiStepDraftBackend",
        monkeypatch=monkeypatch,
        version=version,
        **LONG,
    )
    assert rows.shape == (3, 45)
    assert overflow > 0  # the last row's writes ran past the buffer
    assert [len(s) for s in seen] == [42, 45]  # step 1 needs 48 entries: the row cut it short
    assert seen[1] != launch.expected_row(1)


@pytest.mark.parametrize("version", NARROW_ROW)
def test_patched_flashinfer_graph_rows_hold_every_step(release_trees, monkeypatch, version):
    launch, rows, seen, overflow = run_graph_replay(
        release_trees(version)["patched"],
        FLASHINFER,
        "FlashInferMultiStepDraftBackend",
        monkeypatch=monkeypatch,
        version=version,
        **LONG,
    )
    assert rows.shape == (3, 90)  # draft_kv_indices_buffer_width(3, 2, 15)
    assert overflow == 0
    assert seen == [launch.expected_row(0), launch.expected_row(1)]


@pytest.mark.parametrize("version", PER_BRANCH)
def test_one_parameter_graph_rows_hold_every_step_unpatched(release_trees, monkeypatch, version):
    """init_cuda_graph_state(self, max_bs) gets max_bs * topk branches from the draft graph
    runner: its max_bs * max_context_len rows already fit (not affected), and apply leaves
    the tree as it is. 0.4.7.post1 writes 0.5.8's layout; the two before it their own
    (step-major draft slots), of the same lengths."""
    trees = release_trees(version)
    assert all(
        (trees["patched"] / f).read_bytes() == (trees["unpatched"] / f).read_bytes()
        for f in (FLASHINFER, FLASHINFER_MLA)
    )
    assert not (trees["patched"] / SPEC_UTILS).exists()
    launch, rows, seen, overflow = run_graph_replay(
        trees["unpatched"],
        FLASHINFER,
        "FlashInferMultiStepDraftBackend",
        monkeypatch=monkeypatch,
        version=version,
        **LONG,
    )
    assert rows.shape == (3, 90)  # (max_bs * topk) * max_context_len
    assert overflow == 0
    assert [len(s) for s in seen] == [42, 48]  # draft_kv_indices_used_len(18, 2, 6, i + 1): not cut short
    expected = launch.expected_row if version == "0.4.7.post1" else step_major_row(launch)
    assert seen == [expected(0), expected(1)]


def step_major_row(launch: DraftLaunch):
    """Row i as 0.4.6.post5's and 0.4.7's kernel fills it: per branch the prefix, then the
    draft slots of steps 0..i, step-major in the pool (seq_len + step * topk + branch)."""

    def row(step: int) -> list[int]:
        out = []
        for bid, seq_len in enumerate(launch.seq_lens_list):
            pool = launch.req_to_token[int(launch.req_pool_indices[bid])].tolist()
            for t in range(launch.topk):
                out += pool[:seq_len] + [pool[seq_len + j * launch.topk + t] for j in range(step + 1)]
        return out

    return row


def family_code(version: str) -> tuple[str, str]:
    """The ast of the kernel and of the FlashInfer draft backend's DRAFT_METHODS in the wheel."""
    with zipfile.ZipFile(release_wheel(version)) as wheel:
        names = set(wheel.namelist())
        kernels = [
            node
            for module in ("spec_utils", "eagle_utils")
            if f"sglang/srt/speculative/{module}.py" in names
            for node in ast.parse(wheel.read(f"sglang/srt/speculative/{module}.py")).body
            if isinstance(node, ast.FunctionDef) and node.name == KERNEL_NAME
        ]
        tree = ast.parse(wheel.read(f"{FLASHINFER}"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FlashInferMultiStepDraftBackend")
    methods = [ast.dump(n) for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in DRAFT_METHODS]
    assert len(kernels) == 1 and len(methods) == len(DRAFT_METHODS), version
    return ast.dump(kernels[0]), "\n".join(methods)


def test_every_release_has_a_proven_familys_code():
    """Each release from 0.4.6.post5 to 0.5.12.post1 runs the kernel and FlashInfer draft
    methods of the release its family's proof above ran (the same ast), and the families differ."""
    codes = {version: family_code(version) for version in FAMILIES}
    assert len(set(codes.values())) == len(FAMILIES)
    for representative, members in FAMILIES.items():
        for version in members:
            assert family_code(version) == codes[representative], (version, representative)


def test_patched_flashinfer_mla_graph_rows_hold_every_step(trees, monkeypatch):
    """FlashInfer-MLA drafts allow topk 1 only in 0.5.12, where the missing factor is 1."""
    mla = dict(seq_lens=[5, 9, 4], topk=1, steps=4, max_bs=3, context_len=15)
    launch, rows, seen, overflow = run_graph_replay(
        trees["patched"], FLASHINFER_MLA, "FlashInferMLAMultiStepDraftBackend", monkeypatch=monkeypatch, **mla
    )
    assert rows.shape == (4, 45)
    assert overflow == 0
    assert seen == [launch.expected_row(i) for i in range(3)]


def test_patched_capacity_check_names_the_numbers(trees, monkeypatch):
    launch = DraftLaunch(
        seq_lens=[5, 9, 4], topk=2, num_steps=3, page_size=1, row_width=1, max_context_len=15, kv_dtype=torch.int32
    )
    backend = draft_backend(
        trees["patched"],
        FLASHINFER,
        "FlashInferMultiStepDraftBackend",
        launch,
        topk=2,
        steps=3,
        max_bs=3,
        context_len=15,
        monkeypatch=monkeypatch,
        allocations=[],
    )
    too_small = torch.zeros((3, 45), dtype=torch.int32)
    with pytest.raises(
        AssertionError, match=r"need 54 > width 45 \(topk=2, num_seqs=3, seq_lens_sum=18, num_steps=3\)"
    ):
        backend.common_template(replay_batch(launch), too_small, lambda i, fb: None)
    assert int((too_small != 0).sum()) == 0  # refused before the kernel ran


# ---- DeepSeek-V4 eager multi-step draft ----------------------------------------------


def dsv4_backend(tree: Path, *, topk, steps, step_id):
    namespace = {
        "torch": torch,
        "SWA_WINDOW": 128,
        "envs": SimpleNamespace(SGLANG_PREP_IN_CUDA_GRAPH=SimpleNamespace(get=lambda: True)),
        "DSV4RawDecodeMetadata": SimpleNamespace,
    }
    if "per_step_draft_out_cache_loc" in (tree / DSV4).read_text():
        top_level_function(tree / EAGLE_UTILS, "per_step_draft_out_cache_loc", namespace)
    cls = load_methods(
        tree / DSV4, "DeepseekV4AttnBackend", ("init_forward_metadata", "init_forward_metadata_decode"), namespace
    )
    backend = cls()
    backend.mtp_enabled, backend.topk, backend.speculative_num_steps = True, topk, steps
    backend.speculative_step_id, backend.swa_page_size, backend.page_size = step_id, 128, 128
    backend.req_to_token = object()
    return backend


def draft_decode_batch(backend, *, bs, out_cache_loc):
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False, is_decode_or_idle=lambda: True),
        req_pool_indices=torch.arange(bs),
        seq_lens=torch.full((bs,), 7),
        seq_lens_cpu=torch.full((bs,), 7),
        req_to_token_pool=SimpleNamespace(req_to_token=backend.req_to_token),
        batch_size=bs,
        out_cache_loc=out_cache_loc,
    )


def worker_step_slots(tree: Path, out_cache_loc, bs, topk, steps):
    """Row i = the slots EagleDraftWorker.draft_forward (0.5.12, unpatched) writes at step i."""
    text = (tree / WORKER_V2).read_text()
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "EagleDraftWorker")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "draft_forward")
    layout = [
        s
        for s in method.body
        if isinstance(s, ast.Assign) and ("out_cache_loc.reshape" in ast.unparse(s) or "permute" in ast.unparse(s))
    ]
    assert len(layout) == 2, [ast.unparse(s) for s in layout]
    scope = {
        "out_cache_loc": out_cache_loc,
        "forward_batch": SimpleNamespace(batch_size=bs),
        "self": SimpleNamespace(topk=topk, speculative_num_steps=steps),
    }
    for stmt in layout:
        exec(compile(ast.Module([stmt], []), "draft_forward", "exec"), {}, scope)
    return scope["out_cache_loc"]


def test_unpatched_dsv4_multi_step_draft_fails_the_shape_assertion(trees):
    backend = dsv4_backend(trees["unpatched"], topk=1, steps=3, step_id=0)
    batch = draft_decode_batch(backend, bs=2, out_cache_loc=torch.arange(100, 106))
    with pytest.raises(
        AssertionError,
        match=r"req_pool_indices.shape=torch.Size\(\[2\]\) "
        r"seq_lens.shape=torch.Size\(\[2\]\) out_cache_loc.shape=torch.Size\(\[6\]\)",
    ):
        backend.init_forward_metadata(batch)


@pytest.mark.parametrize("steps", [2, 3, 5])
def test_patched_dsv4_gets_the_slots_the_worker_writes_at_each_step(trees, steps):
    bs, topk = 3, 1
    out_cache_loc = torch.randperm(bs * topk * steps) + 1000
    written = worker_step_slots(trees["unpatched"], out_cache_loc, bs, topk, steps)
    for step_id in range(steps):
        backend = dsv4_backend(trees["patched"], topk=topk, steps=steps, step_id=step_id)
        backend.init_forward_metadata(draft_decode_batch(backend, bs=bs, out_cache_loc=out_cache_loc))
        assert backend.forward_metadata.out_cache_loc.tolist() == written[step_id].tolist()


def test_patched_dsv4_single_step_and_target_decode_keep_the_whole_buffer(trees):
    backend = dsv4_backend(trees["patched"], topk=1, steps=1, step_id=0)
    out_cache_loc = torch.arange(200, 203)
    backend.init_forward_metadata(draft_decode_batch(backend, bs=3, out_cache_loc=out_cache_loc))
    assert backend.forward_metadata.out_cache_loc is out_cache_loc
