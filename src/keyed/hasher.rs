//! The default hasher of [`Keyed`](super::Keyed) maps.

use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// The hasher a [`Keyed`](super::Keyed) limiter uses unless given another:
/// aHash, keyed per map with random seeds from the operating system.
///
/// Keys come from clients (addresses, API keys, user names), so the map's
/// hash must resist *flooding*: a client that sends keys chosen to collide
/// would otherwise put them all on one probe sequence and make every lookup
/// slow. aHash is a keyed hash: without the map's seeds, which never leave
/// the process, a client cannot tell which keys collide. std's SipHash-1-3
/// `RandomState` gives the same protection at several times the cost per
/// key; pass it (or any other hasher) to
/// [`with_clock_and_hasher`](super::Keyed::with_clock_and_hasher) to use it
/// instead.
///
/// ```
/// use std::hash::{BuildHasher, Hasher};
/// use tollgate::keyed::KeyHasher;
///
/// let (a, b) = (KeyHasher::new(), KeyHasher::new());
/// // Each map gets its own seeds: the same key hashes differently.
/// assert_eq!(a.hash_one(7u64), a.hash_one(7u64));
/// assert_ne!(a.hash_one(7u64), b.hash_one(7u64));
/// ```
#[derive(Clone)]
pub struct KeyHasher(ahash::RandomState);

impl KeyHasher {
    /// A hasher with fresh random seeds.
    ///
    /// ```
    /// let hasher = tollgate::keyed::KeyHasher::new();
    /// # let _ = hasher;
    /// ```
    pub fn new() -> Self {
        KeyHasher(ahash::RandomState::new())
    }
}

impl Default for KeyHasher {
    /// The same as [`KeyHasher::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl BuildHasher for KeyHasher {
    type Hasher = KeyHash;

    #[inline]
    fn build_hasher(&self) -> KeyHash {
        KeyHash(self.0.build_hasher())
    }
}

/// One hash computation of a [`KeyHasher`] (what its
/// [`build_hasher`](BuildHasher::build_hasher) returns): aHash, behind a type
/// of tollgate's own so that the hash function can change without changing
/// the API.
///
/// ```
/// use std::hash::{BuildHasher, Hasher};
/// use tollgate::keyed::KeyHasher;
///
/// let hasher = KeyHasher::new();
/// let mut one = hasher.build_hasher();
/// one.write_u64(7);
/// assert_eq!(one.finish(), hasher.hash_one(7u64));
/// ```
#[derive(Clone)]
pub struct KeyHash(ahash::AHasher);

/// Every method forwards, so aHash's fast paths for integers stay in use.
impl Hasher for KeyHash {
    #[inline]
    fn finish(&self) -> u64 {
        self.0.finish()
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes)
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0.write_u8(i)
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.0.write_u16(i)
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.0.write_u32(i)
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0.write_u64(i)
    }
    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.0.write_u128(i)
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.0.write_usize(i)
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHash")
    }
}

impl fmt::Debug for KeyHasher {
    /// Never prints the seeds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHasher")
    }
}
