"""Proof on probe arrays: the fork's code and the rewritten code run from the draft call path.

``validate`` proves each rewrite (translation validation) and asks the split-once verdict
(``split_once``) of each per-step backend that ``baking`` names; ``interpret``, ``world``, ``paths`` and
``arrays`` run the code. Imported by module, so that ``baking`` (``ast`` only) loads without numpy.
"""
