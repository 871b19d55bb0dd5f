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

/// Forwards `Hasher::write_*` for each `(method, type)` to aHash.
macro_rules! forward_writes {
    ($($write:ident: $int:ty),*) => {$(
        #[inline]
        fn $write(&mut self, i: $int) {
            self.0.$write(i)
        }
    )*};
}

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
    forward_writes!(
        write_u8: u8,
        write_u16: u16,
        write_u32: u32,
        write_u64: u64,
        write_u128: u128,
        write_usize: usize
    );
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
