"""benchmark/gpu/exact_8b.py on CPU: the rule its 8B-shaped weights carry (at the real hidden size
and head layout, with a smaller vocabulary and MLP so that it runs in seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark" / "gpu"))
import exact_8b  # noqa: E402


@pytest.fixture
def small_vocab(monkeypatch):
    monkeypatch.setattr(exact_8b, "V", 2000)
    monkeypatch.setattr(exact_8b, "I", 256)


def weights():
    with torch.no_grad():
        return exact_8b.rule_weights(torch.Generator("cpu").manual_seed(exact_8b.SEED), "cpu")


def test_positional_pattern_peaks_at_the_previous_token():
    assert exact_8b.positional_gap() >= 20
    assert exact_8b.positional_gap(max_offset=exact_8b.CTX) >= exact_8b.positional_gap()


def test_rule_layers_predict_the_rule_at_every_position(small_vocab):
    E, sigma, layers = weights()
    assert E.shape == (2000, 4096)
    assert layers[0]["q"].shape == (32 * 128, 4096) and layers[0]["k"].shape == (8 * 128, 4096)
    assert torch.allclose(E.pow(2).mean(1), torch.ones(2000), atol=1e-4)  # rms 1: the draft's layer 0 has no input norm
    assert exact_8b.check_rule(E, sigma, layers, n=128) == 0


def test_a_broken_copy_head_is_caught(small_vocab):
    E, sigma, layers = weights()
    layers[0]["o"].zero_()  # layer 0 no longer writes the previous token back
    # layer 1 alone adds e(x_i-1) with about the weight of e(x_i): about half the positions go wrong
    assert exact_8b.check_rule(E, sigma, layers, n=128) > 30


def test_zero_layers_work_but_add_nothing(small_vocab):
    L = exact_8b.zero_layer(torch.Generator("cpu").manual_seed(1), "cpu")
    assert L["o"].abs().sum() == 0 and L["down"].abs().sum() == 0
    assert L["q"].std() > 0.01 and L["gate"].std() > 0.01 and L["up"].shape == (256, 4096)
