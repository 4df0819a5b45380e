//! GPT-2 byte-level alphabet: every byte maps to one printable `char` and back.

use std::sync::OnceLock;

struct Tables {
    /// `char` (as produced by the byte-level pre-tokenizer) -> original byte.
    char_to_byte: std::collections::HashMap<char, u8>,
    /// original byte -> `char`.
    byte_to_char: [char; 256],
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut byte_to_char = ['\0'; 256];
        let mut n = 0u32;
        for b in 0u32..256 {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            let c = if printable {
                b
            } else {
                n += 1;
                255 + n
            };
            // All values are < 0x200, hence valid scalar values.
            byte_to_char[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
        }
        let char_to_byte = byte_to_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        Tables {
            char_to_byte,
            byte_to_char,
        }
    })
}

/// The byte-level `char` standing for byte `b` (e.g. `b' '` -> `'Ġ'`).
pub(crate) fn byte_to_char(b: u8) -> char {
    tables().byte_to_char[b as usize]
}

/// Appends the bytes a byte-level token stands for to `out`.
///
/// Mirrors the `tokenizers` ByteLevel decoder: if every char of the piece belongs to the
/// byte-level alphabet the mapped bytes are used, otherwise the piece's own UTF-8 bytes.
pub(crate) fn piece_bytes(piece: &str, out: &mut Vec<u8>) {
    let t = tables();
    let start = out.len();
    for c in piece.chars() {
        match t.char_to_byte.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(piece.as_bytes());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "duplicate char for byte {b}");
            let mut out = Vec::new();
            piece_bytes(&c.to_string(), &mut out);
            assert_eq!(out, vec![b]);
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
    }

    #[test]
    fn foreign_chars_fall_back_to_raw_bytes() {
        let mut out = Vec::new();
        piece_bytes("a b", &mut out);
        assert_eq!(out, b"a b");
    }
}
