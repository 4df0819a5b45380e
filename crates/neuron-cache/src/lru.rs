//! Intrusive doubly linked LRU lists over a slab: O(1) insert, move-to-front, unlink, and a map from keys.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

const NIL: u32 = u32::MAX;

pub(crate) struct Entry<K> {
    pub key: K,
    pub data: Arc<[u8]>,
    pub pins: u32,
    pub list: usize,
    prev: u32,
    next: u32,
}

/// `L` lists sharing one slab and key map; list heads are most recently used.
pub(crate) struct Lists<K, const L: usize> {
    slots: Vec<Option<Entry<K>>>,
    free: Vec<u32>,
    map: HashMap<K, u32>,
    head: [u32; L],
    tail: [u32; L],
    bytes: [usize; L],
    len: [usize; L],
    pinned_bytes: usize,
}

impl<K: Copy + Eq + Hash, const L: usize> Lists<K, L> {
    pub fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            map: HashMap::new(),
            head: [NIL; L],
            tail: [NIL; L],
            bytes: [0; L],
            len: [0; L],
            pinned_bytes: 0,
        }
    }

    pub fn find(&self, key: &K) -> Option<u32> {
        self.map.get(key).copied()
    }

    pub fn entry(&self, idx: u32) -> &Entry<K> {
        self.slots[idx as usize].as_ref().expect("live slot")
    }

    fn entry_mut(&mut self, idx: u32) -> &mut Entry<K> {
        self.slots[idx as usize].as_mut().expect("live slot")
    }

    pub fn bytes(&self, list: usize) -> usize {
        self.bytes[list]
    }

    pub fn total_bytes(&self) -> usize {
        self.bytes.iter().sum()
    }

    pub fn total_len(&self) -> usize {
        self.len.iter().sum()
    }

    pub fn pinned_bytes(&self) -> usize {
        self.pinned_bytes
    }

    pub fn tail(&self, list: usize) -> Option<u32> {
        (self.tail[list] != NIL).then_some(self.tail[list])
    }

    pub fn prev(&self, idx: u32) -> Option<u32> {
        let p = self.entry(idx).prev;
        (p != NIL).then_some(p)
    }

    fn link_front(&mut self, idx: u32, list: usize) {
        let old = self.head[list];
        let size = {
            let e = self.entry_mut(idx);
            e.list = list;
            e.prev = NIL;
            e.next = old;
            e.data.len()
        };
        if old != NIL {
            self.entry_mut(old).prev = idx;
        } else {
            self.tail[list] = idx;
        }
        self.head[list] = idx;
        self.bytes[list] += size;
        self.len[list] += 1;
    }

    fn unlink(&mut self, idx: u32) {
        let (list, prev, next, size) = {
            let e = self.entry(idx);
            (e.list, e.prev, e.next, e.data.len())
        };
        if prev != NIL {
            self.entry_mut(prev).next = next;
        } else {
            self.head[list] = next;
        }
        if next != NIL {
            self.entry_mut(next).prev = prev;
        } else {
            self.tail[list] = prev;
        }
        self.bytes[list] -= size;
        self.len[list] -= 1;
    }

    /// Inserts a new key (not present) at the head of `list`.
    pub fn insert_front(&mut self, list: usize, key: K, data: Arc<[u8]>) -> u32 {
        let e = Entry {
            key,
            data,
            pins: 0,
            list,
            prev: NIL,
            next: NIL,
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(e);
                i
            }
            None => {
                self.slots.push(Some(e));
                (self.slots.len() - 1) as u32
            }
        };
        self.map.insert(key, idx);
        self.link_front(idx, list);
        idx
    }

    pub fn move_front(&mut self, idx: u32, list: usize) {
        self.unlink(idx);
        self.link_front(idx, list);
    }

    pub fn remove(&mut self, idx: u32) -> Entry<K> {
        self.unlink(idx);
        let e = self.slots[idx as usize].take().expect("live slot");
        if e.pins > 0 {
            self.pinned_bytes -= e.data.len();
        }
        self.map.remove(&e.key);
        self.free.push(idx);
        e
    }

    pub fn pin(&mut self, idx: u32) {
        let e = self.entry_mut(idx);
        e.pins += 1;
        if e.pins == 1 {
            let n = e.data.len();
            self.pinned_bytes += n;
        }
    }

    /// Returns false if the entry was not pinned.
    pub fn unpin(&mut self, idx: u32) -> bool {
        let e = self.entry_mut(idx);
        if e.pins == 0 {
            return false;
        }
        e.pins -= 1;
        if e.pins == 0 {
            let n = e.data.len();
            self.pinned_bytes -= n;
        }
        true
    }

    /// The least recently used unpinned entry of `list`.
    pub fn lru_unpinned(&self, list: usize) -> Option<u32> {
        let mut at = self.tail(list);
        while let Some(i) = at {
            if self.entry(i).pins == 0 {
                return Some(i);
            }
            at = self.prev(i);
        }
        None
    }

    /// Keys of `list`, most recently used first.
    pub fn keys(&self, list: usize) -> Vec<K> {
        let mut out = Vec::with_capacity(self.len[list]);
        let mut at = self.head[list];
        while at != NIL {
            let e = self.entry(at);
            out.push(e.key);
            at = e.next;
        }
        out
    }

    /// Checks links, counters and the key map; describes the first inconsistency.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = 0;
        let mut pinned = 0;
        for list in 0..L {
            let (mut at, mut prev, mut n, mut bytes) = (self.head[list], NIL, 0, 0);
            while at != NIL {
                let e = self
                    .slots
                    .get(at as usize)
                    .and_then(|s| s.as_ref())
                    .ok_or("dangling link")?;
                if e.list != list || e.prev != prev {
                    return Err(format!(
                        "list {list}: bad back link or list tag at slot {at}"
                    ));
                }
                if self.map.get(&e.key) != Some(&at) {
                    return Err(format!("list {list}: key map disagrees at slot {at}"));
                }
                if e.pins > 0 {
                    pinned += e.data.len();
                }
                n += 1;
                bytes += e.data.len();
                prev = at;
                at = e.next;
                if n > self.slots.len() {
                    return Err(format!("list {list}: cycle"));
                }
            }
            if self.tail[list] != prev || n != self.len[list] || bytes != self.bytes[list] {
                return Err(format!("list {list}: tail/len/bytes counters wrong"));
            }
            seen += n;
        }
        if seen != self.map.len() || pinned != self.pinned_bytes {
            let (mapped, counted) = (self.map.len(), self.pinned_bytes);
            return Err(format!(
                "{seen} linked vs {mapped} mapped entries; pinned {pinned} vs {counted}"
            ));
        }
        Ok(())
    }
}
