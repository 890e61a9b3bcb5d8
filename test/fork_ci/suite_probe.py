"""What a fork's own test/run_suite.py selects, without running a test (plain python, stdlib).

    python suite_probe.py FORK HW SUITE [CI_REGISTER]

Loads FORK/test/run_suite.py as a module (not as __main__) with the fork's own
python/sglang/test/ci/ci_register.py (or CI_REGISTER) as ``sglang.test.ci.ci_register``.
run_suite.py's two other imports, ``tabulate`` and ``sglang.test.ci.ci_utils``, serve only
printing and running and are stood in. Then does what every era's run_a_suite does before
running anything: ``collect_tests`` over test/registered/**/*.py (strict; and, where its
run_a_suite globs them, python/sglang/jit_kernel's tests and benchmarks), the file's own
``validate_all_suites`` where it has one, and its ``filter_tests`` for HW and SUITE. Prints
one line, ``SUITE-PROBE {json}``: the selected files (relative to FORK) and whether it
validated; an error of the fork's own code exits 1 with its message.
"""

import glob
import importlib.util
import json
import os
import sys
import types


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main(fork, hw, suite, ci_register=None):
    for package in ("sglang", "sglang.test", "sglang.test.ci"):
        sys.modules[package] = types.ModuleType(package)
    load(
        "sglang.test.ci.ci_register",
        ci_register or os.path.join(fork, "python", "sglang", "test", "ci", "ci_register.py"),
    )
    stand_ins = {"tabulate": ("tabulate",), "sglang.test.ci.ci_utils": ("run_unittest_files", "TestFile")}
    for name, attributes in stand_ins.items():
        module = types.ModuleType(name)
        for attribute in attributes:
            setattr(module, attribute, None)
        sys.modules[name] = module
    path = os.path.join(fork, "test", "run_suite.py")
    run_suite = load("fork_run_suite", path)
    files = sorted(
        f
        for f in glob.glob(os.path.join(fork, "test", "registered", "**", "*.py"), recursive=True)
        if os.path.basename(f) not in ("conftest.py", "__init__.py")
    )
    with open(path) as source:
        if "jit_kernel_dir" in source.read():
            jit_kernel = os.path.join(fork, "python", "sglang", "jit_kernel")
            files += glob.glob(os.path.join(jit_kernel, "tests", "**", "test_*.py"), recursive=True)
            files += glob.glob(os.path.join(jit_kernel, "benchmark", "**", "bench_*.py"), recursive=True)
    all_tests = run_suite.collect_tests(files, sanity_check=True)
    validated = hasattr(run_suite, "validate_all_suites")
    if validated:
        run_suite.validate_all_suites(all_tests)
    enabled, _skipped = run_suite.filter_tests(all_tests, run_suite.HW_MAPPING[hw], suite)
    selected = sorted(os.path.relpath(t.filename, fork) for t in enabled)
    print("SUITE-PROBE " + json.dumps({"selected": selected, "validated": validated}))


if __name__ == "__main__":
    main(*sys.argv[1:])
