//! Known-value and error tests.

use half::{bf16, f16};
use kernels_neon::*;

pub(crate) fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn all_paths_dequant(format: WeightFormat, src: &[u8], n: usize) -> Vec<f32> {
    let mut first: Option<Vec<f32>> = None;
    for path in available_paths() {
        let mut out = vec![f32::NAN; n];
        dequantize_row_with(path, format, src, &mut out).unwrap();
        if let Some(f) = &first {
            assert_eq!(f, &out, "{path:?} differs");
        } else {
            first = Some(out);
        }
    }
    first.unwrap()
}

#[test]
fn dequant_q8_0_known() {
    let mut blk = h(0.5).to_vec();
    blk.extend((0..32).map(|j| (j as i8 - 16) as u8));
    let out = all_paths_dequant(WeightFormat::Q8_0, &blk, 32);
    for (j, v) in out.iter().enumerate() {
        assert_eq!(*v, 0.5 * (j as f32 - 16.0));
    }
    // -128 is a valid byte too.
    let mut blk = h(1.0).to_vec();
    blk.extend([0x80u8; 32]);
    assert_eq!(
        all_paths_dequant(WeightFormat::Q8_0, &blk, 32),
        vec![-128.0; 32]
    );
}

#[test]
fn dequant_q4_0_known() {
    let mut blk = h(2.0).to_vec();
    // qs[j] = low nibble j, high nibble 15 - j
    blk.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let out = all_paths_dequant(WeightFormat::Q4_0, &blk, 32);
    for j in 0..16 {
        assert_eq!(out[j], 2.0 * (j as f32 - 8.0));
        assert_eq!(out[j + 16], 2.0 * ((15 - j) as f32 - 8.0));
    }
}

#[test]
fn dequant_q4_1_known() {
    let mut blk = h(0.25).to_vec();
    blk.extend(h(-1.0));
    blk.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let out = all_paths_dequant(WeightFormat::Q4_1, &blk, 32);
    for j in 0..16 {
        assert_eq!(out[j], 0.25 * j as f32 - 1.0);
        assert_eq!(out[j + 16], 0.25 * (15 - j) as f32 - 1.0);
    }
}

/// Hand-built Q5 tail (after `d`, `m`): `qh = 0xA5C3_0F69` (little-endian),
/// `qs[j]` = low nibble `j`, high nibble `15 - j`.
fn q5_tail() -> Vec<u8> {
    let mut t = 0xA5C3_0F69u32.to_le_bytes().to_vec();
    t.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    t
}

/// The unsigned 5-bit quants of [`q5_tail`], written as llama.cpp's
/// `dequantize_row_q5_0` computes them (`xh_1` shifted by `j + 12`, masked with 0x10).
fn q5_tail_quants() -> [i32; 32] {
    let qh = 0xA5C3_0F69u32;
    let mut q = [0i32; 32];
    for j in 0..16u32 {
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        q[j as usize] = ((j & 0xF) | xh_0) as i32;
        q[j as usize + 16] = ((15 - j) | xh_1) as i32;
    }
    q
}

#[test]
fn dequant_q5_0_known() {
    let mut blk = h(0.5).to_vec();
    blk.extend(q5_tail());
    assert_eq!(blk.len(), 22);
    let out = all_paths_dequant(WeightFormat::Q5_0, &blk, 32);
    let q = q5_tail_quants();
    for j in 0..32 {
        assert_eq!(out[j], 0.5 * (q[j] - 16) as f32, "element {j}");
    }
    // Spot values: element 0 has qh bit 0 = 1 -> (0 | 16) - 16 = 0; element 16
    // has qh bit 16 = 1 -> (15 | 16) - 16 = 15; element 3 (bit 3 = 1) -> 3.
    assert_eq!((out[0], out[16], out[3]), (0.0, 7.5, 1.5));
    // Element 1: bit 1 = 0 -> 1 - 16 = -15.
    assert_eq!(out[1], -7.5);
}

#[test]
fn dequant_q5_1_known() {
    let mut blk = h(0.25).to_vec();
    blk.extend(h(-1.0));
    blk.extend(q5_tail());
    assert_eq!(blk.len(), 24);
    let out = all_paths_dequant(WeightFormat::Q5_1, &blk, 32);
    let q = q5_tail_quants();
    for j in 0..32 {
        assert_eq!(out[j], 0.25 * q[j] as f32 - 1.0, "element {j}");
    }
    assert_eq!(
        (out[0], out[1], out[31]),
        (0.25 * 16.0 - 1.0, 0.25 - 1.0, 0.25 * 16.0 - 1.0)
    );
}

#[test]
fn q5_matvec_one_hot_every_path_and_precision() {
    // Two blocks per row (the second with d and m changed), one-hot
    // activations: every path and precision returns the element.
    for (format, head2) in [
        (WeightFormat::Q5_0, vec![h(0.5), h(-0.75)]),
        (WeightFormat::Q5_1, vec![h(0.25), h(-1.0), h(-0.5), h(2.0)]),
    ] {
        let per = head2.len() / 2;
        let mut row: Vec<u8> = head2[..per].concat();
        row.extend(q5_tail());
        row.extend(head2[per..].concat());
        row.extend(q5_tail());
        let w = QMatrix::new(format, 1, 64, &row).unwrap();
        let mut elems = vec![0f32; 64];
        dequantize_row_with(KernelPath::Scalar, format, &row, &mut elems).unwrap();
        for k in [0usize, 1, 15, 16, 17, 31, 32, 40, 63] {
            let mut x = vec![0f32; 64];
            x[k] = 1.0;
            for path in available_paths() {
                for precision in [Precision::Exact, Precision::Fast, Precision::Int8] {
                    let mut y = [f32::NAN; 1];
                    matvec_with(path, &w, &x, &mut y, precision).unwrap();
                    assert!(
                        (y[0] - elems[k]).abs() <= 1e-4,
                        "{format:?} {path:?} {precision:?} k={k}: {} vs {}",
                        y[0],
                        elems[k]
                    );
                }
            }
        }
    }
}

#[test]
fn dequant_float_formats_known() {
    let vals: Vec<f32> = (0..19).map(|j| j as f32 * 0.5 - 3.0).collect();
    let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16b: Vec<u8> = vals.iter().flat_map(|v| h(*v)).collect();
    let bf16b: Vec<u8> = vals
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    assert_eq!(all_paths_dequant(WeightFormat::F32, &f32b, 19), vals);
    assert_eq!(all_paths_dequant(WeightFormat::F16, &f16b, 19), vals);
    assert_eq!(all_paths_dequant(WeightFormat::BF16, &bf16b, 19), vals);
}

#[test]
fn format_sizes() {
    use WeightFormat::*;
    assert_eq!(Q4_1.row_bytes(576), Some(18 * 20));
    assert_eq!(Q8_0.row_bytes(64), Some(68));
    assert_eq!(Q4_0.row_bytes(33), None);
    assert_eq!(F16.row_bytes(3), Some(6));
    assert_eq!(F32.block_len(), 1);
    assert_eq!(Q4_0.block_bytes(), 18);
    assert_eq!((Q4_K.block_len(), Q4_K.block_bytes()), (256, 144));
    assert_eq!((Q6_K.block_len(), Q6_K.block_bytes()), (256, 210));
    assert_eq!(Q4_K.row_bytes(512), Some(288));
    assert_eq!(Q6_K.row_bytes(768), Some(630));
    assert_eq!(Q4_K.row_bytes(576), None);
    assert!(Q4_K.is_quantized() && Q6_K.is_k_quant() && !Q8_0.is_k_quant());
    assert!(matches!(
        QMatrix::new(Q6_K, 1, 32, &[0u8; 210]).map_err(KernelError::from),
        Err(KernelError::Layout(LayoutError::RaggedCols {
            block_len: 256,
            ..
        }))
    ));
}

/// Hand-built Q4_K super-block: d = 0.5, dmin = 0.25, 12 scale bytes chosen
/// so that the `j >= 4` branch of `get_scale_min_k4` takes high bits from
/// bytes 0..8, `qs[b] = (b & 0xF) | ((7b & 0xF) << 4)`.
fn q4_k_block() -> Vec<u8> {
    let mut blk = h(0.5).to_vec();
    blk.extend(h(0.25));
    blk.extend([
        0xC3, 0x05, 0x07, 0x49, 0x82, 0x01, 0x00, 0x04, 0x21, 0x3A, 0x00, 0xF2,
    ]);
    blk.extend((0..128u32).map(|b| ((b & 0xF) | (((7 * b) & 0xF) << 4)) as u8));
    assert_eq!(blk.len(), 144);
    blk
}

#[test]
fn dequant_q4_k_known() {
    // Scales/mins decoded by hand from the bytes above:
    // j < 4:  sc = q[j] & 63, m = q[j+4] & 63
    //   sc = 0xC3&63 = 3, 5, 7, 0x49&63 = 9;  m = 0x82&63 = 2, 1, 0, 4
    // j >= 4: sc = (q[j+4] & 0xF) | (q[j-4] >> 6) << 4, m = (q[j+4] >> 4) | (q[j] >> 6) << 4
    //   j=4: sc = 1 | 3<<4 = 49, m = 2 | 2<<4 = 34
    //   j=5: sc = 10 | 0 = 10,   m = 3 | 0 = 3
    //   j=6: sc = 0,             m = 0
    //   j=7: sc = 2 | 1<<4 = 18, m = 15 | 0 = 15
    const SC: [f32; 8] = [3.0, 5.0, 7.0, 9.0, 49.0, 10.0, 0.0, 18.0];
    const M: [f32; 8] = [2.0, 1.0, 0.0, 4.0, 34.0, 3.0, 0.0, 15.0];
    let blk = q4_k_block();
    let out = all_paths_dequant(WeightFormat::Q4_K, &blk, 256);
    // Specific elements computed by hand:
    // 0: sub 0, q = qs[0] & 0xF = 0 -> 0.5*3*0 - 0.25*2 = -0.5
    assert_eq!(out[0], -0.5);
    // 133: sub 4 (group 2, low), q = qs[69] & 0xF = 5 -> 0.5*49*5 - 0.25*34 = 114
    assert_eq!(out[133], 114.0);
    // 162: sub 5 (group 2, high), q = qs[66] >> 4 = 462 & 15 = 14 -> 70 - 0.75
    assert_eq!(out[162], 69.25);
    // 200: sub 6 (sc = m = 0) -> 0
    assert_eq!(out[200], 0.0);
    // 255: sub 7 (group 3, high), q = qs[127] >> 4 = 889 & 15 = 9 -> 81 - 3.75
    assert_eq!(out[255], 77.25);
    // 40: sub 1 (group 0, high), q = qs[8] >> 4 = 56 & 15 = 8 -> 0.5*5*8 - 0.25
    assert_eq!(out[40], 19.75);
    // Every element from the llama.cpp loop written out directly.
    for j in (0..8).step_by(2) {
        for l in 0..32 {
            let q = blk[16 + 16 * j + l];
            let lo = 0.5 * SC[j] * f32::from(q & 0xF) - 0.25 * M[j];
            let hi = 0.5 * SC[j + 1] * f32::from(q >> 4) - 0.25 * M[j + 1];
            assert_eq!(out[32 * j + l], lo, "element {}", 32 * j + l);
            assert_eq!(out[32 * j + 32 + l], hi, "element {}", 32 * j + 32 + l);
        }
    }
}

/// Hand-built Q6_K super-block: `ql[i] = i`, `qh[i] = 37 i mod 256`,
/// scales with negative values (and -128, 127), d = 0.25.
fn q6_k_block() -> Vec<u8> {
    let mut blk: Vec<u8> = (0..128u32).map(|i| i as u8).collect();
    blk.extend((0..64u32).map(|i| (i * 37) as u8));
    let sc: [i8; 16] = [
        1, -2, 3, -4, 5, -6, 7, -8, -128, 127, -1, 0, 10, -10, 20, -20,
    ];
    blk.extend(sc.iter().map(|&v| v as u8));
    blk.extend(h(0.25));
    assert_eq!(blk.len(), 210);
    blk
}

#[test]
fn dequant_q6_k_known() {
    let blk = q6_k_block();
    let out = all_paths_dequant(WeightFormat::Q6_K, &blk, 256);
    // 0: ql[0] = 0, qh[0] = 0 -> q = -32, sc[0] = 1 -> -8
    assert_eq!(out[0], -8.0);
    // 130: half 1, l = 2, q1: ql[66] & 0xF = 2, qh[34] = 234 & 3 = 2
    //   -> q = 34 - 32 = 2, sc[8] = -128 -> 0.25 * -128 * 2 = -64
    assert_eq!(out[130], -64.0);
    // 145: half 1, l = 17, q1: ql[81] & 0xF = 1, qh[49] = 21 & 3 = 1
    //   -> q = 17 - 32 = -15, sc[9] = 127 -> -476.25
    assert_eq!(out[145], -476.25);
    // 200: half 1, l = 8, q3: ql[72] >> 4 = 4, (qh[40] = 200) >> 4 & 3 = 0
    //   -> q = -28, sc[12] = 10 -> -70
    assert_eq!(out[200], -70.0);
    // 250: half 1, l = 26, q4: ql[122] >> 4 = 7, (qh[58] = 98) >> 6 & 3 = 1
    //   -> q = 23 - 32 = -9, sc[15] = -20 -> 45
    assert_eq!(out[250], 45.0);
    // Every element from the llama.cpp loop written out directly.
    let sc: Vec<f32> = blk[192..208].iter().map(|&b| f32::from(b as i8)).collect();
    for n in 0..2 {
        let (ql, qh, s) = (&blk[64 * n..], &blk[128 + 32 * n..], &sc[8 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let y = &out[128 * n..];
            assert_eq!(y[l], 0.25 * s[is] * f32::from(q1));
            assert_eq!(y[l + 32], 0.25 * s[is + 2] * f32::from(q2));
            assert_eq!(y[l + 64], 0.25 * s[is + 4] * f32::from(q3));
            assert_eq!(y[l + 96], 0.25 * s[is + 6] * f32::from(q4));
        }
    }
}

/// `qs[b] = 29b + 7` (mod 256): the 64 2-bit-plane bytes of the Q2_K and Q3_K blocks below.
fn k23_qs() -> impl Iterator<Item = u8> {
    (0..64u32).map(|b| (29 * b + 7) as u8)
}

/// Hand-built Q2_K super-block: `scales[s] = (s + 1) & 15 | (3s & 15) << 4`
/// (sc = 0 for s = 15), `qs` from [`k23_qs`], d = 0.5, dmin = 0.25.
fn q2_k_block() -> Vec<u8> {
    let mut blk: Vec<u8> = (0..16u32)
        .map(|s| (((s + 1) & 15) | (((3 * s) & 15) << 4)) as u8)
        .collect();
    blk.extend(k23_qs());
    blk.extend(h(0.5));
    blk.extend(h(0.25));
    assert_eq!(blk.len(), 84);
    blk
}

#[test]
fn dequant_q2_k_known() {
    let blk = q2_k_block();
    let out = all_paths_dequant(WeightFormat::Q2_K, &blk, 256);
    // 0: qs[0] = 7, bits 0..2 = 3; sub 0: sc = 1, m = 0 -> 0.5*3
    assert_eq!(out[0], 1.5);
    // 45: plane 1 of qs[13] = 128 -> 0; sub 2: sc = 3, m = 6 -> -0.25*6
    assert_eq!(out[45], -1.5);
    // 133: half 1, plane 0 of qs[37] = 56 -> 0; sub 8: m = 24 & 15 = 8 -> -2
    assert_eq!(out[133], -2.0);
    // 255: half 1, plane 3 of qs[63] = 42 -> 0; sub 15: sc = 0, m = 13 -> -3.25
    assert_eq!(out[255], -3.25);
    // Every element from llama.cpp's `dequantize_row_q2_K` loop written out directly.
    let (d, dmin) = (0.5f32, 0.25f32);
    let mut y = Vec::new();
    let mut is = 0;
    for n in 0..2 {
        let q = &blk[16 + 32 * n..];
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let sc = blk[is];
                is += 1;
                let (dl, ml) = (d * f32::from(sc & 0xF), dmin * f32::from(sc >> 4));
                for l in 0..16 {
                    y.push(dl * f32::from((q[l + 16 * half] >> shift) & 3) - ml);
                }
            }
        }
    }
    assert_eq!(out, y);
}

/// Hand-built Q3_K super-block: `hmask[b] = 73b + 11`, `qs` from
/// [`k23_qs`], 12 scale bytes whose 6-bit scales include 0 (-32), d = 0.25.
fn q3_k_block() -> Vec<u8> {
    let mut blk: Vec<u8> = (0..32u32).map(|b| (73 * b + 11) as u8).collect();
    blk.extend(k23_qs());
    blk.extend([
        0x10, 0xF2, 0x3F, 0x85, 0x00, 0xFF, 0x7A, 0x31, 0xE4, 0x1B, 0x00, 0xFF,
    ]);
    blk.extend(h(0.25));
    assert_eq!(blk.len(), 110);
    blk
}

#[test]
fn dequant_q3_k_known() {
    let blk = q3_k_block();
    let out = all_paths_dequant(WeightFormat::Q3_K, &blk, 256);
    // Scales by hand: low 4 bits in nibble s / 8 of byte s % 8, high 2 bits at bit 2(s / 4) of
    // byte 8 + s % 4: s = 0: 0x10 & 15 = 0, 0xE4 & 3 = 0 -> -32; s = 2: 15, 0 -> -17;
    // s = 12: 0x00 >> 4 = 0, 0xE4 >> 6 = 3 -> 48 - 32 = 16; s = 15: 0x31 >> 4 = 3, 0xFF >> 6 = 3 -> 19.
    // 0: plane 0 of qs[0] = 7 -> 3, bit 0 of hmask[0] = 11 set -> q = 3; 0.25 * -32 * 3
    assert_eq!(out[0], -24.0);
    // 45: plane 1 of qs[13] = 128 -> 0, bit 1 of hmask[13] = 192 clear -> q = -4; 0.25 * -17 * -4
    assert_eq!(out[45], 17.0);
    // 201: plane 2 of qs[41] = 172 -> 2, bit 6 of hmask[9] = 156 clear -> q = -2; 0.25 * 16 * -2
    assert_eq!(out[201], -8.0);
    // 250: plane 3 of qs[58] = 153 -> 2, bit 7 of hmask[26] = 117 clear -> q = -2; 0.25 * 19 * -2
    assert_eq!(out[250], -9.5);
    // Every element from llama.cpp's `dequantize_row_q3_K` loop (kmask1/kmask2 scale shuffle)
    // written out directly.
    let a = |i: usize| u32::from_le_bytes(blk[96 + 4 * i..100 + 4 * i].try_into().unwrap());
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let (a0, a1, tmp) = (a(0), a(1), a(2));
    let aux = [
        (a0 & k2) | ((tmp & k1) << 4),
        (a1 & k2) | (((tmp >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ];
    let scales: Vec<i8> = aux
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .map(|b| b as i8)
        .collect();
    let (hm, d) = (&blk[..32], 0.25f32);
    let mut y = Vec::new();
    let (mut is, mut m) = (0, 1u8);
    for n in 0..2 {
        let q = &blk[32 + 32 * n..];
        for shift in [0, 2, 4, 6] {
            for half in 0..2 {
                let dl = d * f32::from(scales[is] - 32);
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let off = if hm[l] & m != 0 { 0 } else { 4 };
                    y.push(dl * f32::from(((q[l] >> shift) & 3) as i8 - off));
                }
            }
            m <<= 1;
        }
    }
    assert_eq!(out, y);
}

#[test]
fn k_quant_matvec_one_hot_every_path_and_precision() {
    // A 2-row matrix (Q4_K block, then the same block with d negated) and
    // one-hot activations: every path and precision returns the element.
    for (format, blk) in [
        (WeightFormat::Q4_K, q4_k_block()),
        (WeightFormat::Q6_K, q6_k_block()),
        (WeightFormat::Q2_K, q2_k_block()),
        (WeightFormat::Q3_K, q3_k_block()),
    ] {
        let mut data = blk.clone();
        data.extend(&blk);
        let w = QMatrix::new(format, 2, 256, &data).unwrap();
        let mut elems = vec![0f32; 256];
        dequantize_row_with(KernelPath::Scalar, format, &blk, &mut elems).unwrap();
        for k in [0usize, 40, 133, 145, 162, 200, 250, 255] {
            let mut x = vec![0f32; 256];
            x[k] = 1.0;
            for path in available_paths() {
                for precision in [Precision::Exact, Precision::Fast, Precision::Int8] {
                    let mut y = [f32::NAN; 2];
                    matvec_with(path, &w, &x, &mut y, precision).unwrap();
                    for v in y {
                        assert!(
                            (v - elems[k]).abs() <= 1e-4,
                            "{format:?} {path:?} {precision:?} k={k}: {v} vs {}",
                            elems[k]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matvec_known_values_every_path() {
    // Q4_1 row: d = 1, m = 0.5, all nibbles 3 -> every weight 3.5
    let mut row = h(1.0).to_vec();
    row.extend(h(0.5));
    row.extend([0x33u8; 16]);
    let w = QMatrix::new(WeightFormat::Q4_1, 1, 32, &row).unwrap();
    let x = vec![1.0f32; 32];
    for path in available_paths() {
        for p in [Precision::Exact, Precision::Fast, Precision::Int8] {
            let mut y = [0f32];
            matvec_with(path, &w, &x, &mut y, p).unwrap();
            assert!((y[0] - 112.0).abs() < 1e-4, "{path:?} {p:?}: {}", y[0]);
        }
    }
}
