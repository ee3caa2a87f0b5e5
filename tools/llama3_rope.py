"""Llama 3's RoPE scaling as GGUF files carry it (a `rope_freqs` tensor): the divisor of each
frequency pair. Shared by tools/make_arch_fixtures.py and tools/shape_model.py; Python's
standard library alone."""

import math


def divisors(head_dim, theta, factor, low, high, original):
    """The divisor of each of the `head_dim / 2` frequencies: 1 for wavelengths under
    `original / high`, `factor` over `original / low`, a smooth blend between (as llama.cpp's
    converter stores them)."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out
