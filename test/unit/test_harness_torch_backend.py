"""harness/torch_backend.py: real torch as the written CPU test's harness hands it to a tree's code.

What the code builds from a value outside the path (an ``Unknown``) is unknown, as on ``check``'s
stand-in (harness/tensors.py), so the written test runs every path ``check`` runs: a size built from
a model config's field is flytiger-eco/sglang-for-sail@dfc4b9f's DeepSeek-V4
``init_forward_metadata_indexer`` (``torch.Size((n, 1, self.index_n_heads, self.index_head_dim))``),
which raised TypeError in the fork's written test while ``check`` passed it.
"""

from __future__ import annotations

import torch
from sglang_draft_layout.harness import tensors, torch_backend
from sglang_draft_layout.harness.unknown import Unknown


def test_a_size_holding_an_unknown_is_unknown_on_both_facades():
    shape = (3, 1, Unknown("model_config.hf_text_config.index_n_heads"), 128)
    assert isinstance(torch_backend.FACADE.Size(shape), Unknown)
    assert tensors.FACADE.Size(shape)[2] is shape[2]  # the stand-in's size keeps it, unknown as it is


def test_a_size_of_numbers_is_torchs_own():
    size = torch_backend.FACADE.Size((3, 1, 4))
    assert type(size) is torch.Size and size == torch.Size((3, 1, 4))
    assert isinstance(torch.zeros(2, 3).shape, torch_backend.FACADE.Size)
    assert not isinstance((2, 3), torch_backend.FACADE.Size)
    assert tuple(tensors.FACADE.Size((3, 1, 4))) == tuple(size)
