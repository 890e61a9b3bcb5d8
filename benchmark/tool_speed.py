"""How fast is sglang-draft-layout? ``check`` and ``apply`` on real release trees.

Measures, for each SGLang release tree 0.5.8 .. 0.5.12 (unpacked from the cached PyPI
wheels, see ``sglang_draft_layout.releases``):

* ``cli``: the command as a user runs it, a fresh ``sglang-draft-layout check|apply TREE``
  process (wall time: interpreter start, imports, work, output). The console script next to
  this Python is run directly; what a launcher in front of it costs (here: pyenv's shim,
  which is what ``sglang-draft-layout`` on PATH resolves to) is measured on its own.
* ``inproc``: ``engine.plan(target, render_changes=False)`` (what check does) and
  ``engine.apply(target)`` called in a Python process, imports excluded.
* ``breakdown``: where the time of one check and one apply goes (imports of libcst and its
  codemod/matchers, the ast index, libcst parsing of the segments, PositionProvider, rule
  matching, rendering, AddImportsVisitor, the re-check, compile, write), by timers wrapped
  around the engine's functions (exclusive time: a nested timer's time is not counted twice).

Cold and warm. cli: per rep, a fresh tree gets ``check`` (cold: the first process on it),
``check`` again (warm) and ``apply`` (warm: the tool has read this unpatched tree before);
a second fresh tree gets ``apply`` (cold). inproc: cold is the first engine call in a fresh
process (one process per rep), warm the same call after a warm-up call in that process.
``apply`` always runs on a fresh unpatched tree. A fresh tree is a hard-linked copy of the
release unpacked once per run (apply replaces files by rename, so the unpacked original is
never modified; the run checks that at the end). Nothing drops the OS page cache (a shared
machine): cold means "nothing of this tool has run on this tree / in this process yet".

Each timing is the median of --reps runs (default 5). The machine is shared: the load
average is printed with the results, and CPU time (user+sys) is shown next to wall time
for the cli runs. On an idle 2-core machine ``--part cli`` takes about 3 minutes and
``--part inproc,breakdown`` about 3 minutes (more under load); run them apart and merge:

    python benchmark/tool_speed.py --part cli --json cli.json                 # all five releases
    python benchmark/tool_speed.py --part inproc,breakdown --json inproc.json
    python benchmark/tool_speed.py --part none --from-json cli.json inproc.json --plot tool_speed.png
    # issue 39's yardstick: check and apply (cold: an empty verdict cache; warm) against the parse floor
    python benchmark/tool_speed.py --part floor --releases 0.5.12,0.5.23
    # another engine (e.g. an older commit's python/ folder) against this one, interleaved:
    python benchmark/tool_speed.py --part ab --baseline /tmp/base/python --releases 0.5.8,0.5.12
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RELEASES = ("0.5.8", "0.5.9", "0.5.10", "0.5.11", "0.5.12")
GOALS = {"check": 0.6, "apply": 2.0}  # issue 13: check <= 0.6 s, apply <= 2 s (fresh processes)
HERE = Path(__file__).resolve()


# ---- trees ----------------------------------------------------------------------


def unpack(version: str, root: Path) -> Path:
    """Unpack sglang==version once under root; returns the folder holding sglang/."""
    from sglang_draft_layout.releases import unpack_release

    dest = root / f"pristine-{version}"
    unpack_release(version, dest)
    return dest


def fresh_copy(pristine: Path, root: Path) -> Path:
    """A new tree of hard links to the pristine files (apply writes by rename: safe)."""
    dest = Path(tempfile.mkdtemp(prefix="tree-", dir=root)) / "t"
    shutil.copytree(pristine, dest, copy_function=os.link)
    return dest


# ---- child processes (in-process timings; imports measured here) ------------------


def _child(argv: list[str]) -> None:
    """Runs in a fresh interpreter; prints one JSON object."""
    mode, pristine, workdir, reps = argv[0], Path(argv[1]), Path(argv[2]), int(argv[3])
    out: dict = {}
    t0 = time.perf_counter()
    import libcst  # noqa: F401

    t1 = time.perf_counter()
    import libcst.matchers  # noqa: F401

    t2 = time.perf_counter()
    from sglang_draft_layout import cli, engine  # noqa: F401
    from sglang_draft_layout.target import resolve

    t3 = time.perf_counter()
    # what the CLI imports before it runs check (apply imports libcst.codemod when it renders)
    out["imports"] = {
        "libcst": t1 - t0,
        "libcst.matchers": t2 - t1,
        "sglang_draft_layout (cli, engine, rules)": t3 - t2,
    }
    if mode == "breakdown":
        import libcst.codemod  # noqa: F401

        out["imports"]["libcst.codemod (apply only; already in if the engine imports it)"] = time.perf_counter() - t3

    def check(tree: Path) -> float:
        target = resolve(str(tree))
        start = time.perf_counter()
        engine.plan(target, render_changes=False)
        return time.perf_counter() - start

    def apply(tree: Path) -> float:
        target = resolve(str(tree))
        start = time.perf_counter()
        engine.apply(target)
        return time.perf_counter() - start

    if mode in ("cold-check", "cold-apply"):
        tree = fresh_copy(pristine, workdir)
        out["seconds"] = (check if mode == "cold-check" else apply)(tree)
    elif mode == "warm":
        tree = fresh_copy(pristine, workdir)
        check(tree)  # warm-up: the first call pays one-time costs
        apply(fresh_copy(pristine, workdir))
        out["check"] = [check(tree) for _ in range(reps)]
        out["apply"] = [apply(fresh_copy(pristine, workdir)) for _ in range(reps)]
    elif mode == "breakdown":
        out.update(_breakdown(pristine, workdir, reps, check, apply))
    print(json.dumps(out))


def _breakdown(pristine: Path, workdir: Path, reps: int, check, apply) -> dict:
    """Exclusive time per (phase, component), for a cold and warm check and apply."""
    import ast
    from collections import defaultdict
    from pathlib import Path as _Path

    import libcst as cst
    from libcst.metadata import MetadataWrapper

    from sglang_draft_layout import engine, transaction
    from sglang_draft_layout.rules import RULES, base

    stack: list[tuple[str, str]] = []
    totals: dict[tuple[str, str], float] = defaultdict(float)
    last = [time.perf_counter()]

    def charge() -> None:
        now = time.perf_counter()
        phase = next((n for k, n in reversed(stack) if k == "phase"), "other")
        comp = next((n for k, n in reversed(stack) if k == "comp"), "other")
        totals[phase, comp] += now - last[0]
        last[0] = now

    def wrap(fn, kind: str, name: str):
        def timed(*args, **kwargs):
            charge()
            stack.append((kind, name))
            try:
                return fn(*args, **kwargs)
            finally:
                charge()
                stack.pop()

        return timed

    def patch(obj, attr: str, kind: str, name: str) -> None:
        setattr(obj, attr, wrap(getattr(obj, attr), kind, name))

    # phases (innermost wins): find sites, render, re-check, write
    patch(engine, "plan", "phase", "find sites")
    # what render does itself (the edits visitor, codegen of the segments, splicing)
    patch(engine, "render", "comp", "apply edits + codegen")
    patch(engine, "render", "phase", "render")
    patch(engine, "_check_rendered", "phase", "re-check")
    patch(engine, "write", "phase", "write")
    patch(engine, "apply", "phase", "apply (lock, other)")
    # components
    patch(_Path, "read_bytes", "comp", "read files")
    patch(ast, "parse", "comp", "ast index (ast.parse)")
    for name in ("parse_module", "parse_statement", "parse_expression"):
        patch(cst, name, "comp", "libcst parse (segments)")
    patch(MetadataWrapper, "resolve", "comp", "PositionProvider (start lines)")
    patch(MetadataWrapper, "resolve_many", "comp", "positions of the edits' anchors")
    if hasattr(base, "start_lines"):  # the engine's own start-line pass, in place of MetadataWrapper.resolve
        patch(base, "start_lines", "comp", "PositionProvider (start lines)")
    patch(MetadataWrapper, "visit", "comp", "AddImportsVisitor")
    if hasattr(engine, "add_imports"):  # AddImportsVisitor run on the header's import block only
        patch(engine, "add_imports", "comp", "AddImportsVisitor")
    engine.compile = wrap(compile, "comp", "compile")
    patch(transaction, "_replace", "comp", "write + fsync")
    for rule in RULES:
        object.__setattr__(rule, "find", wrap(rule.find, "comp", "rule matching, edits"))

    def run(kind: str, tree: Path) -> tuple[float, dict]:
        totals.clear()
        last[0] = time.perf_counter()
        seconds = (check if kind == "check" else apply)(tree)
        charge()
        return seconds, {f"{p}|{c}": t for (p, c), t in totals.items()}

    result: dict = {}
    tree = fresh_copy(pristine, workdir)
    result["cold check"] = run("check", tree)
    result["cold apply"] = run("apply", fresh_copy(pristine, workdir))
    warm_check = [run("check", tree) for _ in range(reps)]
    warm_apply = [run("apply", fresh_copy(pristine, workdir)) for _ in range(reps)]
    result["warm check"] = _median_run(warm_check)
    result["warm apply"] = _median_run(warm_apply)
    return result


def _median_run(runs: list[tuple[float, dict]]) -> tuple[float, dict]:
    """The run whose total is the median (its components stay consistent)."""
    ordered = sorted(runs, key=lambda r: r[0])
    return ordered[len(ordered) // 2]


def child(mode: str, pristine: Path, workdir: Path, reps: int = 1) -> dict:
    proc = subprocess.run(
        [sys.executable, str(HERE), "--child", mode, str(pristine), str(workdir), str(reps)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(f"child {mode} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


# ---- cli timings --------------------------------------------------------------------


def timed_process(argv: list[str], env: dict | None = None) -> tuple[float, float, int]:
    """(wall s, user+sys CPU s, exit code) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def console_script() -> str:
    script = Path(sys.executable).parent / "sglang-draft-layout"
    if not script.exists():
        raise SystemExit(f"no console script at {script}: pip install -e . first")
    return str(script)


def cli_part(pristine: dict[str, Path], work: Path, reps: int) -> dict:
    """Per rep: a fresh tree T gets check (cold), check again (warm), then apply (warm: the
    tool has read this unpatched tree already), then check of the patched tree; a second
    fresh tree U gets apply (cold)."""
    script = console_script()
    results: dict = {}
    for version, tree0 in pristine.items():
        runs: dict[str, list[tuple[float, float]]] = {
            "check cold": [],
            "check warm": [],
            "apply cold": [],
            "apply warm": [],
            "check patched": [],
        }
        for _ in range(reps):
            tree = fresh_copy(tree0, work)
            for key, command, expected in (
                ("check cold", "check", 1),
                ("check warm", "check", 1),
                ("apply warm", "apply", 0),
                ("check patched", "check", 0),
            ):
                wall, cpu, rc = timed_process([script, command, str(tree)])
                assert rc == expected, f"{command} {version}: exit {rc}, expected {expected}"
                runs[key].append((wall, cpu))
            wall, cpu, rc = timed_process([script, "apply", str(fresh_copy(tree0, work))])
            assert rc == 0, f"apply {version}: exit {rc}"
            runs["apply cold"].append((wall, cpu))
        results[version] = {
            key: {
                "wall": statistics.median(r[0] for r in rs),
                "cpu": statistics.median(r[1] for r in rs),
                "walls": [r[0] for r in rs],
            }
            for key, rs in runs.items()
        }
        print(
            f"  cli {version}: " + ", ".join(f"{k} {v['wall']:.2f}s" for k, v in results[version].items()), flush=True
        )
    return results


#: a fresh Python parsing the target files: every .py under the draft folders that names speculative_num_steps
PARSE_FLOOR = """import ast, sys
from pathlib import Path
package = Path(sys.argv[1]) / "sglang"
for folder in ("srt/layers/attention", "srt/speculative"):
    for path in sorted((package / folder).rglob("*.py")):
        text = path.read_text()
        if "speculative_num_steps" in text:
            ast.parse(text)
"""


def floor_part(pristine: dict[str, Path], work: Path, reps: int) -> dict:
    """Issue 39's yardstick, side by side: per rep (the floor first on even reps, last on odd ones) a fresh
    Python parsing the target files (PARSE_FLOOR), ``check`` with an empty verdict cache (cold) and again with the
    one it filled (warm), ``apply`` on a fresh tree with an empty cache (cold) and on a fresh copy after a
    ``check`` of it (warm: the verdicts of the tree as it is are kept); each a fresh
    ``python -m sglang_draft_layout`` process. Wall seconds; the ratio to the floor is taken rep by rep."""
    results: dict = {}
    for version, tree0 in pristine.items():
        runs: dict[str, list[float]] = {
            k: [] for k in ("floor", "check cold", "check warm", "apply cold", "apply warm")
        }

        def tool(command: str, tree: Path, cache: Path, expected: int) -> float:
            env = {**os.environ, "SGLANG_DRAFT_LAYOUT_CACHE": str(cache)}
            wall, _cpu, rc = timed_process([sys.executable, "-m", "sglang_draft_layout", command, str(tree)], env)
            assert rc == expected, f"{command} {version}: exit {rc}, expected {expected}"
            return wall

        warm_up = [sys.executable, "-m", "sglang_draft_layout", "check", str(tree0)]
        expected = timed_process(warm_up, {**os.environ, "SGLANG_DRAFT_LAYOUT_CACHE": tempfile.mkdtemp(dir=work)})[2]
        assert expected in (0, 1), f"check {version}: exit {expected}"
        for rep in range(reps):
            if rep % 2 == 0:
                runs["floor"].append(timed_process([sys.executable, "-c", PARSE_FLOOR, str(tree0)])[0])
            cache = Path(tempfile.mkdtemp(dir=work))
            tree = fresh_copy(tree0, work)
            runs["check cold"].append(tool("check", tree, cache, expected))
            runs["check warm"].append(tool("check", tree, cache, expected))
            runs["apply warm"].append(tool("apply", tree, cache, 0))
            runs["apply cold"].append(tool("apply", fresh_copy(tree0, work), Path(tempfile.mkdtemp(dir=work)), 0))
            if rep % 2 == 1:
                runs["floor"].append(timed_process([sys.executable, "-c", PARSE_FLOOR, str(tree0)])[0])
        results[version] = {key: {"wall": statistics.median(walls), "walls": walls} for key, walls in runs.items()} | {
            f"{key} / floor": statistics.median(w / f for w, f in zip(runs[key], runs["floor"]))
            for key in runs
            if key != "floor"
        }
        print(f"  floor {version}: " + ", ".join(f"{k} {v['wall']:.2f}s" for k, v in results[version].items()
              if isinstance(v, dict)), flush=True)  # fmt: skip
    return results


def ab_part(pristine: dict[str, Path], work: Path, reps: int, baseline: Path) -> dict:
    """The console script with the engine under --baseline (on PYTHONPATH) against this
    checkout's, interleaved (alternating which goes first) so both see the same load."""
    script = console_script()
    sides = {"baseline": {**os.environ, "PYTHONPATH": str(baseline)}, "this": dict(os.environ)}
    results: dict = {}
    for version, tree0 in pristine.items():
        runs = {(side, cmd): [] for side in sides for cmd in ("check", "apply")}
        for rep in range(reps):
            order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
            for command, expected in (("check", 1), ("apply", 0)):
                for side in order:
                    wall, cpu, rc = timed_process([script, command, str(fresh_copy(tree0, work))], sides[side])
                    assert rc == expected, f"{side} {command} {version}: exit {rc}"
                    runs[side, command].append((wall, cpu))
        results[version] = {
            f"{side} {cmd}": {"wall": statistics.median(r[0] for r in rs), "cpu": statistics.median(r[1] for r in rs)}
            for (side, cmd), rs in runs.items()
        }
        print(f"  ab {version}: " + ", ".join(f"{k} {v['wall']:.2f}s" for k, v in results[version].items()), flush=True)
    return results


#: the least a check could cost without libcst: start Python, read and hash the files the
#: rules read (what a findings cache keyed on file contents would have to do on a hit)
FLOOR = """
import hashlib, sys
from pathlib import Path
package = Path(sys.argv[1]) / "sglang"
files = ["_version.py", "srt/speculative/spec_utils.py", "srt/speculative/eagle_utils.py",
         "srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py"] + [
         f"srt/layers/attention/{b}_backend.py" for b in ("flashinfer", "flashinfer_mla", "triton", "aiter", "deepseek_v4")]
for name in files:
    path = package / name
    if path.exists():
        hashlib.sha256(path.read_bytes()).hexdigest()
"""


def launcher_overhead(tree: Path, reps: int) -> dict:
    """Interpreter start, the console script's imports, and a launcher in front of it (pyenv's shim here)."""
    script = console_script()
    rows = {
        "python -c pass (interpreter start)": [sys.executable, "-c", "pass"],
        "python: read + sha256 the target files (no libcst)": [sys.executable, "-c", FLOOR, str(tree)],
        f"{script} --help (no libcst)": [script, "--help"],
    }
    # other launchers of the same name on PATH (pyenv puts its version's bin/ first for the
    # processes it starts, so shutil.which alone would find the script itself)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        launcher = Path(folder) / "sglang-draft-layout"
        if launcher.is_file() and os.access(launcher, os.X_OK) and launcher.resolve() != Path(script).resolve():
            rows[f"{launcher} --help (launcher on PATH)"] = [str(launcher), "--help"]
    return {label: statistics.median(timed_process(argv)[0] for _ in range(reps)) for label, argv in rows.items()}


def inproc_part(pristine: dict[str, Path], work: Path, reps: int) -> dict:
    results: dict = {}
    for version, tree0 in pristine.items():
        cold_check = [child("cold-check", tree0, work) for _ in range(reps)]
        cold_apply = [child("cold-apply", tree0, work) for _ in range(reps)]
        warm = child("warm", tree0, work, reps)
        imports = [sum(c["imports"].values()) for c in cold_check + cold_apply]
        results[version] = {
            "check cold": statistics.median(c["seconds"] for c in cold_check),
            "check warm": statistics.median(warm["check"]),
            "apply cold": statistics.median(c["seconds"] for c in cold_apply),
            "apply warm": statistics.median(warm["apply"]),
            "imports": statistics.median(imports),
        }
        print(f"  inproc {version}: " + ", ".join(f"{k} {v:.2f}s" for k, v in results[version].items()), flush=True)
    return results


# ---- output -----------------------------------------------------------------------


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def mark(seconds: float, command: str) -> str:
    return f"{seconds:.2f}" + ("" if seconds <= GOALS[command] else " !")


def report(data: dict) -> str:
    out = [
        f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}; goals: check <= {GOALS['check']:g} s, "
        f"apply <= {GOALS['apply']:g} s (! = missed); every timing is a median"
    ]
    for run in data.get("runs", []):
        out.append(
            f"run {run['date']}: parts {','.join(run['parts'])}, releases {','.join(run['releases'])}, "
            f"reps {run['reps']}, load average (1/5/15 min) before {run['load_before']}, after "
            f"{run.get('load_after')}, {run.get('elapsed_s')} s, engine {run['engine']}"
        )
    out.append("")
    if "launcher" in data:
        out += [
            "Launcher and interpreter (wall s, median)",
            table([["command", "wall s"]] + [[k, f"{v:.2f}"] for k, v in data["launcher"].items()]),
            "",
        ]
    if "cli" in data:
        rows = [
            [
                "release",
                "check cold",
                "check warm",
                "check patched",
                "apply cold",
                "apply warm",
                "cpu: check",
                "cpu: apply",
            ]
        ]
        for version, res in data["cli"].items():
            patched = mark(res["check patched"]["wall"], "check") if "check patched" in res else "-"
            rows.append(
                [
                    version,
                    mark(res["check cold"]["wall"], "check"),
                    mark(res["check warm"]["wall"], "check"),
                    patched,
                    mark(res["apply cold"]["wall"], "apply"),
                    mark(res["apply warm"]["wall"], "apply"),
                    f"{res['check warm']['cpu']:.2f}",
                    f"{res['apply warm']['cpu']:.2f}",
                ]
            )
        out += [
            "As the user runs it: fresh `sglang-draft-layout check|apply TREE` process (wall s; cpu = user+sys, warm)",
            table(rows),
            "",
        ]
    if "floor" in data:
        keys = ("check cold", "check warm", "apply cold", "apply warm")
        rows = [["release", "floor s", *(f"{k} s (x floor)" for k in keys)]]
        for version, r in data["floor"].items():
            rows.append(
                [
                    version,
                    f"{r['floor']['wall']:.3f}",
                    *(f"{r[k]['wall']:.3f} ({r[k + ' / floor']:.2f}x)" for k in keys),
                ]
            )
        out += [
            "Against the parse floor (fresh processes, wall s, median; ratio: median of rep-by-rep ratios; "
            "issue 39's goals: check <= 2x, apply <= 3x)",
            table(rows),
            "",
        ]
    if "ab" in data:
        rows = [
            [
                "release",
                "check: baseline",
                "this",
                "cpu baseline",
                "cpu this",
                "apply: baseline",
                "this",
                "cpu baseline",
                "cpu this",
            ]
        ]
        for version, res in data["ab"].items():
            row = [version]
            for command in ("check", "apply"):
                base, this = res[f"baseline {command}"], res[f"this {command}"]
                row += [
                    mark(base["wall"], command),
                    mark(this["wall"], command),
                    f"{base['cpu']:.2f}",
                    f"{this['cpu']:.2f}",
                ]
            rows.append(row)
        out += [
            f"Baseline engine ({data['baseline']}) against this checkout's, same trees, interleaved; "
            "fresh console-script process, cold (wall s and user+sys s, median)",
            table(rows),
            "",
        ]
    if "inproc" in data:
        rows = [["release", "imports", "check cold", "check warm", "apply cold", "apply warm"]]
        for version, res in data["inproc"].items():
            rows.append(
                [version, f"{res['imports']:.2f}"]
                + [f"{res[k]:.2f}" for k in ("check cold", "check warm", "apply cold", "apply warm")]
            )
        out += [
            "In-process: engine.plan(render_changes=False) / engine.apply(target) (s; imports: libcst + this package in a fresh process)",
            table(rows),
            "",
        ]
    if "breakdown" in data:
        bd = data["breakdown"]
        out += [
            f"Where the time goes, {data['breakdown_release']} (exclusive s; cold = the first check, then the first "
            "apply, of a fresh process; warm = the run with the median total of the --reps runs after them)"
        ]
        imports = bd["imports"]
        rows = [["imports (fresh process)", "s"]] + [[k, f"{v:.3f}"] for k, v in imports.items()]
        rows.append(["total imports", f"{sum(imports.values()):.3f}"])
        out += [table(rows), ""]
        runs = ["cold check", "warm check", "cold apply", "warm apply"]
        keys = sorted({k for r in runs for k in bd[r][1]}, key=lambda k: -bd["cold apply"][1].get(k, 0))
        rows = [["phase | component"] + runs]
        for key in keys:
            if max(bd[r][1].get(key, 0) for r in runs) < 0.0005:
                continue
            rows.append([key.replace("|", " | ")] + [f"{bd[r][1].get(key, 0):.3f}" for r in runs])
        rows.append(["total (timed call)"] + [f"{bd[r][0]:.3f}" for r in runs])
        out += [table(rows), ""]
        comps: dict[str, list[float]] = {}
        for r_i, r in enumerate(runs):
            for key, t in bd[r][1].items():
                comps.setdefault(key.split("|")[1], [0.0] * len(runs))[r_i] += t
        rows = [["component (all phases)"] + runs]
        for comp, ts in sorted(comps.items(), key=lambda kv: -kv[1][2]):
            rows.append([comp] + [f"{t:.3f}" for t in ts])
        out += [table(rows), ""]
    return "\n".join(out)


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in ("cli", "ab", "breakdown") if p in data]
    ratios = {"cli": 3, "ab": 2, "breakdown": 2}
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(5.5 * len(panels) + 2, 5.2),
        gridspec_kw={"width_ratios": [ratios[p] for p in panels]},
        squeeze=False,
    )
    axes = dict(zip(panels, axes[0]))

    def goals(ax) -> None:
        for command, color in (("check", "#4c72b0"), ("apply", "#dd8452")):
            ax.axhline(GOALS[command], color=color, ls="--", lw=1, label=f"{command} goal {GOALS[command]:g} s")

    if "cli" in axes:
        ax = axes["cli"]
        versions = list(data["cli"])
        keys = ["check cold", "check warm", "apply cold", "apply warm"]
        colors = ["#4c72b0", "#8fb0e0", "#dd8452", "#f2b98c"]
        width = 0.2
        for i, (key, color) in enumerate(zip(keys, colors)):
            xs = [j + (i - 1.5) * width for j in range(len(versions))]
            ax.bar(xs, [data["cli"][v][key]["wall"] for v in versions], width, label=f"{key}: process", color=color)
            if "inproc" in data:
                ax.bar(
                    xs,
                    [data["inproc"][v][key] for v in versions if v in data["inproc"]],
                    width * 0.45,
                    color="black",
                    alpha=0.55,
                    label="engine call (inproc part)" if i == 0 else None,
                )
        goals(ax)
        ax.set_xticks(range(len(versions)), [f"sglang {v}" for v in versions])
        ax.set_ylabel("wall time, s (median)")
        ax.set_title(
            "sglang-draft-layout check / apply on a whole release tree\n"
            "fresh process (bar); the engine call alone, measured in the inproc part (dark)",
            fontsize=10,
        )
        ax.legend(fontsize=8, loc="upper left", ncols=2)
        ax.set_ylim(0, max(GOALS["apply"] * 1.3, ax.get_ylim()[1] * 1.15))
    if "ab" in axes:
        ax = axes["ab"]
        versions = list(data["ab"])
        width = 0.2
        series = [
            ("baseline check", "#9aa7b8"),
            ("this check", "#4c72b0"),
            ("baseline apply", "#d9b99b"),
            ("this apply", "#dd8452"),
        ]
        for i, (key, color) in enumerate(series):
            xs = [j + (i - 1.5) * width for j in range(len(versions))]
            ax.bar(
                xs,
                [data["ab"][v][key]["wall"] for v in versions],
                width,
                color=color,
                label=key.replace("this", "optimised engine").replace("baseline", "engine before"),
            )
        goals(ax)
        ax.set_xticks(range(len(versions)), [f"sglang {v}" for v in versions])
        ax.set_ylabel("wall time, s (median)")
        ax.set_title("engine before and after the speed-up\n(same trees, runs interleaved, cold process)", fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
        ax.set_ylim(0, max(GOALS["apply"] * 1.3, ax.get_ylim()[1] * 1.15))
    if "breakdown" in axes:
        ax = axes["breakdown"]
        bd = data["breakdown"]
        runs = ["warm check", "warm apply"]
        comps: dict[str, list[float]] = {"imports (libcst etc.)": [sum(bd["imports"].values())] * len(runs)}
        for r_i, r in enumerate(runs):
            for key, t in bd[r][1].items():
                comps.setdefault(key.split("|")[1], [0.0] * len(runs))[r_i] += t
        order = ["imports (libcst etc.)"] + sorted(
            (c for c in comps if c != "imports (libcst etc.)"), key=lambda c: -comps[c][1]
        )
        bottom = [0.0] * len(runs)
        cmap = plt.get_cmap("tab20")
        for i, comp in enumerate(order):
            ax.bar(runs, comps[comp], bottom=bottom, label=comp, color=cmap(i), width=0.6)
            bottom = [b + v for b, v in zip(bottom, comps[comp])]
        ax.set_title(
            f"where the time goes, sglang {data['breakdown_release']}\n(imports + engine call; "
            f"no interpreter start)",
            fontsize=10,
        )
        ax.set_ylabel("s")
        ax.set_xlim(-0.5, 2.6)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", default=",".join(RELEASES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--part",
        default="cli",
        help="any of cli, inproc, breakdown, ab, floor (check and apply against a fresh Python parsing the "
        "same files: --part floor --releases 0.5.12,0.5.23), comma-separated, or none "
        "(only merge --from-json); default cli. cli and inproc,breakdown take about 3 minutes "
        "each on an idle 2-core machine: run them as two commands",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="for --part ab: a folder holding the sglang_draft_layout package to compare against, "
        "e.g. from `git archive <commit> python | tar -x -C /tmp/base` -> /tmp/base/python",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        nargs="*",
        default=[],
        help="merge earlier --json results (e.g. the other part) into the report and plot",
    )
    parser.add_argument("--breakdown-release", default="0.5.12")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    args = parser.parse_args()
    parts = set(args.part.split(",")) - {"none", ""}
    versions = args.releases.split(",")
    started = time.perf_counter()
    import sglang_draft_layout

    # each timed process loads the tool's bytecode, as an install has it, never its sources compiled anew (with
    # PYTHONDONTWRITEBYTECODE set, Python writes none, and a stale file is compiled again in every process)
    for folder in [Path(sglang_draft_layout.__file__).parent, *([args.baseline] if args.baseline else [])]:
        compileall.compile_dir(folder, quiet=1)
    run = {
        "parts": sorted(parts),
        "releases": versions,
        "reps": args.reps,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "engine": str(Path(sglang_draft_layout.__file__).parent),
    }
    data: dict = {}
    if parts:
        with tempfile.TemporaryDirectory(prefix="tool-speed-") as scratch:
            work = Path(scratch)
            needed = set(versions) | ({args.breakdown_release} if "breakdown" in parts else set())
            pristine = {v: unpack(v, work) for v in [*RELEASES, *versions] if v in needed}
            if "cli" in parts:
                data["launcher"] = launcher_overhead(pristine[versions[-1]], args.reps)
                data["cli"] = cli_part({v: pristine[v] for v in versions}, work, args.reps)
            if "ab" in parts:
                if not args.baseline:
                    raise SystemExit("--part ab needs --baseline DIR (a folder holding another sglang_draft_layout)")
                data["baseline"] = str(args.baseline)
                data["ab"] = ab_part({v: pristine[v] for v in versions}, work, args.reps, args.baseline)
            if "floor" in parts:
                data["floor"] = floor_part({v: pristine[v] for v in versions}, work, args.reps)
            if "inproc" in parts:
                data["inproc"] = inproc_part({v: pristine[v] for v in versions}, work, args.reps)
            if "breakdown" in parts:
                data["breakdown_release"] = args.breakdown_release
                data["breakdown"] = child("breakdown", pristine[args.breakdown_release], work, args.reps)
            # the pristine trees must still be unpatched (fresh copies are hard links)
            from sglang_draft_layout import engine
            from sglang_draft_layout.target import resolve

            for version, tree in pristine.items():
                if version not in RELEASES:  # a release with the fix: its sites are patched as released
                    continue
                plan = engine.plan(resolve(str(tree)), render_changes=False)
                assert plan.count(engine.State.PATCHED) == 0, f"pristine {version} was modified"
        run["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        run["elapsed_s"] = round(time.perf_counter() - started)
        data["runs"] = [run]
    for earlier in args.from_json:
        for key, value in json.loads(earlier.read_text()).items():
            if key == "runs":
                data.setdefault("runs", []).extend(value)
            else:
                data.setdefault(key, value)
    print()
    print(report(data))
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    if args.plot:
        plot(data, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
