"""The multi-step EAGLE draft layout forms, recognised in Python's own ``ast``.

What SGLang's draft attention backends and EAGLE workers compute about the draft layout,
written out inline or through upstream's helpers; the patch rules use these patterns to find
their sites. Standard library only (``ast``, ``typing``). Import each name from its submodule:

- ``ast_walk``: generic ``ast`` helpers (source-order walks, source ranges, methods, ``self`` calls);
- ``helper_names``: the names of upstream's helpers and of the draft kv_indices kernel;
- ``kv_indices``: the kv_indices row, width, used-length and kernel-launch spellings;
- ``out_cache_loc``: the per-step out_cache_loc split spellings;
- ``keep``: the keep pragma and where it is looked for;
- ``forms``: the forms a method holds and the reports over a module's classes.
"""
