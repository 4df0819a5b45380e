#!/usr/bin/env python3
"""Generates the K-quant fixtures used by tests/gguf_fixture.rs (run once).

Each output file `<type>.bin` holds N random super-blocks in llama.cpp
layout followed by their N*256 dequantized values as little-endian f32,
computed by the independent `gguf` Python package
(`gguf.quants.dequantize`). The f16 scales (`d`, `dmin`) are overwritten
with finite random halves (all other bytes are uniformly random, so every
scale/min/sign/bit pattern occurs).

    python3 gen_kquant.py   # from this directory; needs `pip install gguf numpy` (made with gguf 0.19.0)
"""
import numpy as np
import gguf

N = 4
rng = np.random.default_rng(20261122)

def half_bytes(v):
    return np.array(v, dtype=np.float16).tobytes()

for name, qtype, size, doff in [
    ("q4_k", gguf.GGMLQuantizationType.Q4_K, 144, [(0, 0.01), (2, 0.02)]),
    ("q6_k", gguf.GGMLQuantizationType.Q6_K, 210, [(208, 0.002)]),
]:
    raw = bytearray(rng.integers(0, 256, size=N * size, dtype=np.uint8).tobytes())
    for b in range(N):
        for off, scale in doff:
            raw[b * size + off : b * size + off + 2] = half_bytes(rng.uniform(-1, 1) * scale)
    blocks = np.frombuffer(bytes(raw), dtype=np.uint8).reshape(N, size)
    out = gguf.quants.dequantize(blocks, qtype).astype("<f4").reshape(-1)
    assert out.shape == (N * 256,) and np.isfinite(out).all()
    with open(f"{name}.bin", "wb") as f:
        f.write(bytes(raw))
        f.write(out.tobytes())
    print(name, len(raw) + out.nbytes, "bytes")
