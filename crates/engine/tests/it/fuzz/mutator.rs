//! A small deterministic byte mutator (AFL "havoc" in miniature): every case is a pure function of
//! the seed input and the RNG state, so a finding is reproduced from `SPARROW_FUZZ_SEED` alone.

/// xorshift64*: tiny, seedable, good enough to pick offsets and operations.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability 1/`n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// Values that break length and offset arithmetic, written little-endian.
const INTERESTING: [u64; 4] = [1 << 31, u32::MAX as u64, 1 << 60, u64::MAX];
/// Bytes that break signed/unsigned and boundary checks.
const BYTES: [u8; 4] = [0, 0xFF, 0x7F, 0x80];

/// An offset in `0..len` (`len` > 0), half the time in the first 512 bytes where headers lie.
fn offset(rng: &mut Rng, len: usize) -> usize {
    if rng.one_in(2) {
        rng.below(len.min(512))
    } else {
        rng.below(len)
    }
}

/// Applies one to four random mutations to `data` in place. `dict` holds format tokens (JSON or
/// Jinja syntax, keywords) that are inserted or written over the input, as a text-aware fuzzer would.
pub fn mutate(data: &mut Vec<u8>, rng: &mut Rng, dict: &[&[u8]]) {
    let n = 1 + rng.below(4);
    for _ in 0..n {
        mutate_once(data, rng, dict);
    }
}

fn mutate_once(data: &mut Vec<u8>, rng: &mut Rng, dict: &[&[u8]]) {
    if data.is_empty() {
        data.extend_from_slice(&rng.next().to_le_bytes()[..1 + rng.below(8)]);
        return;
    }
    let len = data.len();
    match rng.below(if dict.is_empty() { 8 } else { 10 }) {
        // A bit flip.
        0 => {
            let at = offset(rng, len);
            data[at] ^= 1 << rng.below(8);
        }
        // A byte set to a boundary value.
        1 => {
            let at = offset(rng, len);
            data[at] = BYTES[rng.below(BYTES.len())];
        }
        // A random byte.
        2 => {
            let at = offset(rng, len);
            data[at] = rng.next() as u8;
        }
        // Truncation.
        3 => data.truncate(rng.below(len)),
        // A span duplicated at another place.
        4 => {
            let from = rng.below(len);
            let span = 1 + rng.below((len - from).min(256));
            let copy = data[from..from + span].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, copy);
        }
        // A little-endian boundary value inserted (u32 or u64 wide).
        5 | 6 => {
            let v = INTERESTING[rng.below(INTERESTING.len())];
            let bytes = v.to_le_bytes();
            let w = if rng.one_in(2) { 4 } else { 8 };
            let at = offset(rng, len + 1).min(len);
            if rng.one_in(2) {
                data.splice(at..at, bytes[..w].iter().copied());
            } else {
                // Or written over what is there (keeps every later offset in place).
                let end = (at + w).min(len);
                data[at..end].copy_from_slice(&bytes[..end - at]);
            }
        }
        // A span deleted.
        7 => {
            let from = rng.below(len);
            let span = 1 + rng.below((len - from).min(64));
            data.drain(from..from + span);
        }
        // A dictionary token inserted or written over.
        _ => {
            let tok = dict[rng.below(dict.len())];
            let at = rng.below(len + 1);
            if rng.one_in(2) {
                data.splice(at..at, tok.iter().copied());
            } else {
                let end = (at + tok.len()).min(len);
                data.splice(at..end, tok.iter().copied());
            }
        }
    }
}
