//! [`Pieces`]: every id's vocabulary string, in one buffer.

/// The raw vocabulary string of every id (`None` for holes in a tokenizer.json vocabulary), held
/// as one text buffer and a span per id: 8 bytes an id and the text itself, where a `String` per
/// id took about 48 (7 MB for a 151,936-token vocabulary, against about 2 MB).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Pieces {
    text: String,
    /// Per id: the start and end of its string in `text`; `(HOLE, HOLE)` for a hole.
    spans: Vec<(u32, u32)>,
}

const HOLE: u32 = u32::MAX;

impl Pieces {
    /// The pieces of ids `0..`, in order. Panics if their text reaches 4 GiB.
    pub(crate) fn new<'a>(pieces: impl IntoIterator<Item = Option<&'a str>>) -> Pieces {
        let mut p = Pieces::default();
        for piece in pieces {
            let span = match piece {
                Some(s) => {
                    let start = p.text.len();
                    p.text.push_str(s);
                    let pos = |n: usize| u32::try_from(n).ok().filter(|&n| n != HOLE);
                    (pos(start), pos(p.text.len()))
                }
                None => (Some(HOLE), Some(HOLE)),
            };
            match span {
                (Some(a), Some(b)) => p.spans.push((a, b)),
                _ => panic!("a vocabulary of more than 4 GiB of text"),
            }
        }
        p.text.shrink_to_fit();
        p.spans.shrink_to_fit();
        p
    }

    /// The string of `id`; `None` past the end or for a hole.
    pub(crate) fn get(&self, id: u32) -> Option<&str> {
        match *self.spans.get(id as usize)? {
            (HOLE, _) => None,
            (a, b) => self.text.get(a as usize..b as usize),
        }
    }

    /// Number of ids (holes included).
    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_give_back_every_piece_and_hole() {
        let want = [
            Some("a"),
            None,
            Some(""),
            Some("Ġthé"),
            None,
            Some("<|im_end|>"),
        ];
        let p = Pieces::new(want);
        assert_eq!(p.len(), want.len());
        for (id, w) in want.iter().enumerate() {
            assert_eq!(p.get(id as u32), *w, "id {id}");
        }
        assert_eq!(p.get(want.len() as u32), None);
        assert_eq!(Pieces::new([]).len(), 0);
    }
}
