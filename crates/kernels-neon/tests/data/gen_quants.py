#!/usr/bin/env python3
"""Writes the dequantization fixtures checked by tests/it/gguf_fixture.rs and engine's tests/it/gguf_python.rs.

The independent implementation is the `gguf` Python package (llama.cpp's reference dequantizers in numpy,
`gguf.quants.dequantize`). For every weight format Sparrow reads:

* `<dir>/<format>.bin`: random blocks in llama.cpp layout (1024 elements: 32 blocks of 32, or 4 super-blocks
  of 256), followed by their 1024 dequantized values as little-endian f32. Every byte is uniformly random
  except the f16 scales (`d`, `dmin`, `m`), which are overwritten with finite random halves, so every
  quant, sign, scale and high-bit pattern occurs. Float formats (F16, BF16, F32) hold 1024 random finite
  values.
* `<gguf>`: one GGUF written by `gguf.GGUFWriter`, with for every format a tensor `<format>` (2 rows of 512
  elements) and a tensor `<format>.expected` (F32, its values as `gguf.quants.dequantize` gives them).

Run by `cargo xtask fixtures` (in a venv under target/ with `gguf==0.19.0` and numpy), or by hand:

    python3 gen_quants.py DATA_DIR GGUF_PATH
"""
import sys

import numpy as np
import gguf

T = gguf.GGMLQuantizationType

# (file name, type, byte offsets of f16 scales in a block and their magnitudes). Float formats: no offsets.
FORMATS = [
    ("f16", T.F16, None),
    ("bf16", T.BF16, None),
    ("q8_0", T.Q8_0, [(0, 0.01)]),
    ("q4_0", T.Q4_0, [(0, 0.05)]),
    ("q4_1", T.Q4_1, [(0, 0.05), (2, 0.2)]),
    ("q5_0", T.Q5_0, [(0, 0.05)]),
    ("q5_1", T.Q5_1, [(0, 0.05), (2, 0.2)]),
    ("q4_k", T.Q4_K, [(0, 0.01), (2, 0.02)]),
    ("q5_k", T.Q5_K, [(0, 0.01), (2, 0.02)]),
    ("q6_k", T.Q6_K, [(208, 0.002)]),
    ("iq4_nl", T.IQ4_NL, [(0, 0.005)]),
    ("iq4_xs", T.IQ4_XS, [(0, 0.005)]),
    # Appended (not in K-quant order) so the files above keep their bytes.
    ("q2_k", T.Q2_K, [(80, 0.01), (82, 0.02)]),
    ("q3_k", T.Q3_K, [(108, 0.005)]),
]

N_ELEMENTS = 1024
SEED = 20261125


def half_bytes(v):
    return np.array(v, dtype=np.float16).tobytes()


def random_blocks(rng, qtype, scales, n_elements):
    """Random bytes of `n_elements` elements of `qtype` with finite f16 scales."""
    if scales is None:
        vals = rng.uniform(-2, 2, size=n_elements).astype(np.float32)
        if qtype == T.F16:
            return vals.astype(np.float16).tobytes()
        if qtype == T.F32:
            return vals.astype("<f4").tobytes()
        # BF16: the top half of each f32.
        return (vals.view(np.uint32) >> 16).astype("<u2").tobytes()
    block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    nb = n_elements // block_len
    raw = bytearray(rng.integers(0, 256, size=nb * block_bytes, dtype=np.uint8).tobytes())
    for b in range(nb):
        for off, mag in scales:
            raw[b * block_bytes + off : b * block_bytes + off + 2] = half_bytes(rng.uniform(-1, 1) * mag)
    return bytes(raw)


def dequantize(raw, qtype, n_elements):
    block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(1, n_elements // block_len * block_bytes)
    out = gguf.quants.dequantize(rows, qtype).astype("<f4").reshape(-1)
    assert out.shape == (n_elements,) and np.isfinite(out).all(), qtype
    return out


def main(data_dir, gguf_path):
    rng = np.random.default_rng(SEED)
    for name, qtype, scales in FORMATS:
        raw = random_blocks(rng, qtype, scales, N_ELEMENTS)
        out = dequantize(raw, qtype, N_ELEMENTS)
        with open(f"{data_dir}/{name}.bin", "wb") as f:
            f.write(raw)
            f.write(out.tobytes())
    # F32 last, from its own seed, so that every file and tensor above keeps its bytes.
    rng_f32 = np.random.default_rng(SEED + 1)
    raw = random_blocks(rng_f32, T.F32, None, N_ELEMENTS)
    with open(f"{data_dir}/f32.bin", "wb") as f:
        f.write(raw)
        f.write(dequantize(raw, T.F32, N_ELEMENTS).tobytes())
    w = gguf.GGUFWriter(gguf_path, "sparrow-quant-fixture")
    w.add_name("SYNTHETIC quantization fixture (random blocks, gguf.quants values)")
    rows, cols = 2, 512
    for (name, qtype, scales), r in [(f, rng) for f in FORMATS] + [(("f32", T.F32, None), rng_f32)]:
        raw = random_blocks(r, qtype, scales, rows * cols)
        out = dequantize(raw, qtype, rows * cols).reshape(rows, cols)
        block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        data = np.frombuffer(raw, dtype=np.uint8).reshape(rows, cols // block_len * block_bytes)
        w.add_tensor(name, data, raw_dtype=qtype)
        w.add_tensor(f"{name}.expected", out.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
