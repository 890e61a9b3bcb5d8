"""A stand-in for `tabulate` where the machine lacks it: a fork's test/run_suite.py prints its
header table with it (run_fork_gpu_test.sh puts this folder on PYTHONPATH only then)."""


def tabulate(rows, headers=(), tablefmt=None):
    """The rows as plain `|`-separated lines under the headers (tablefmt is ignored)."""
    return "\n".join(" | ".join(str(cell) for cell in row) for row in [list(headers), *rows])
