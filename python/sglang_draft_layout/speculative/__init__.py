"""The layout helpers, mirrored from SGLang's speculative package.

These two modules are self-contained (no imports beyond ``typing``/``__future__``):
the patch inserts their functions' source into SGLang's own ``spec_utils.py`` and
``eagle_utils.py``, so what runs in SGLang is exactly what is tested here.
"""
