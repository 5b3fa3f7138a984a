//! The slots a session holds: a bitmap per run of [`CHUNK`] slots that holds any,
//! kept sorted. A session's slots come in runs (an add's pages land side by side), so
//! this costs about a bit per slot (72 bytes a chunk) where a hash set costs 5 to 9
//! bytes; it is bounded by the store's size whatever the client asks (a store of 4
//! GiB: at most 2048 chunks); and a lookup's pages, which mostly fall in the chunk of
//! the page before, cost a bit test each, no hashing.

/// Slots per chunk.
const CHUNK: u32 = 512;
const WORDS: usize = CHUNK as usize / 64;

#[derive(Debug, Default)]
pub(crate) struct SlotSet {
    /// (first slot / CHUNK, bits), sorted by the first; only chunks with a slot in them.
    chunks: Vec<(u32, [u64; WORDS])>,
    /// Index of the chunk the last insert went to.
    last: usize,
}

impl SlotSet {
    /// Adds `slot`; false when it was there already.
    pub(crate) fn insert(&mut self, slot: u32) -> bool {
        let key = slot / CHUNK;
        let at = match self.chunks.get(self.last) {
            Some(&(k, _)) if k == key => self.last,
            _ => match self.chunks.binary_search_by_key(&key, |c| c.0) {
                Ok(i) => i,
                Err(i) => {
                    self.chunks.insert(i, (key, [0; WORDS]));
                    i
                }
            },
        };
        self.last = at;
        let (word, bit) = ((slot % CHUNK / 64) as usize, slot % 64);
        let w = &mut self.chunks[at].1[word];
        let new = *w & 1 << bit == 0;
        *w |= 1 << bit;
        new
    }

    /// Whether `slot` is in.
    pub(crate) fn contains(&self, slot: u32) -> bool {
        let (word, bit) = ((slot % CHUNK / 64) as usize, slot % 64);
        self.chunks.binary_search_by_key(&(slot / CHUNK), |c| c.0).is_ok_and(|i| self.chunks[i].1[word] & 1 << bit != 0)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The slots, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.chunks.iter().flat_map(|&(key, bits)| {
            bits.into_iter().enumerate().flat_map(move |(w, mut word)| {
                std::iter::from_fn(move || {
                    let bit = (word != 0).then(|| word.trailing_zeros())?;
                    word &= word - 1;
                    Some(key * CHUNK + w as u32 * 64 + bit)
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_missing(set: &std::collections::BTreeSet<u32>) -> u32 {
        (0..).find(|s| !set.contains(s)).unwrap()
    }

    /// Against a set, over runs and scattered slots, repeated.
    #[test]
    fn it_holds_what_a_set_holds() {
        let mut oracle = std::collections::BTreeSet::new();
        let mut set = SlotSet::default();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let slot = match round % 3 {
                0 => round / 3,                       // a run
                1 => (x % 1_000_000) as u32,          // scattered
                _ => u32::MAX - 63 + (x % 64) as u32, // the top of the range
            };
            assert_eq!(set.insert(slot), oracle.insert(slot), "slot {slot}");
        }
        assert!(set.iter().eq(oracle.iter().copied()));
        assert!(oracle.iter().all(|&s| set.contains(s)) && !set.contains(round_missing(&oracle)));
        assert!(SlotSet::default().is_empty() && SlotSet::default().iter().next().is_none());
    }
}
