"""The test files ``apply`` writes into a fork's ``test/registered/`` (see ``fork_tests``).

Each module's text is the file, except for ``# sglang-draft-layout: embed MODULE`` lines,
where that package module's source goes (its imports merged into the file's own).
"""
