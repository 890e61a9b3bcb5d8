"""The written CPU test's check of the per-step out_cache_loc paths, run here on a tree: each DeepSeek-V4-like
path of the tree run by the harness (``harness.judged.judge_tree``, on the torch stand-in as ``check``
runs it), and who splits on those that do not give upstream's values (``rules.who_splits``)."""

from __future__ import annotations

from pathlib import Path

from sglang_draft_layout import engine
from sglang_draft_layout.harness.invariant import guarded_modules
from sglang_draft_layout.harness.judged import judge_tree
from sglang_draft_layout.harness.paths import STEPS
from sglang_draft_layout.harness.tensors import FACADE
from sglang_draft_layout.rules.base import Source, State
from sglang_draft_layout.rules.who_splits import CALLER, EAGER, IN_GRAPH, NONE, PER_STEP, _read
from sglang_draft_layout.target import resolve


def not_split_once(package: Path) -> list[tuple[str, str]]:
    """(per-step class, who splits: "never", "twice", "wrong") of each per-step out_cache_loc path under
    ``package`` (the sglang folder) that does not hand each step upstream's row, split once; a path whose
    class the fork keeps (``check``'s kept sites) is not run, as the written test leaves it out."""
    plan = engine.plan(resolve(str(package)), render_changes=False, tests=False)
    kept = {(f.rule.file, f.rule.scope.split(".")[0]) for f in plan.findings if f.state is State.KEPT}
    modules = guarded_modules(package)
    texts = {m: (package / m).read_text(encoding="utf-8") for m in modules}
    found = judge_tree(package, FACADE, texts, [m for m, t in texts.items() if "speculative_num_steps" in t])
    problems = []
    for path, verdict in found.items():
        if any((path.module, name) in kept for name in (path.cls, *path.per_step)):
            continue
        if path.kind != STEPS or not (verdict.judged or verdict.problems):  # as the written test: no layout, no run
            continue
        phases = [EAGER] + [IN_GRAPH] * any(p == IN_GRAPH for p, _who in verdict.split)
        for phase in phases:
            who = _read(Source(path.module, texts[path.module]), verdict, phase).who
            if who not in (CALLER, PER_STEP, NONE):  # NONE: no step bakes it, nothing to split
                problems.append((path.per_step[0] if path.per_step else path.cls, who))
                break
    return problems
