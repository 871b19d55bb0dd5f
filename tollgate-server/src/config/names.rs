//! The strings a match produces: the state key, the stat name, and the
//! wildcard patterns that decide both.

/// A value with `*` in it: each `*` matches any run of characters, the
/// empty one too, as in envoyproxy/ratelimit.
#[derive(Debug)]
pub(super) struct Pattern {
    /// The value as written, `*` included: what a shared threshold's key and
    /// the stat name show.
    pub(super) text: Box<str>,
    /// The literal pieces between the `*`s, at least two (split once, at
    /// load, so that matching allocates nothing).
    parts: Box<[Box<str>]>,
}

impl Pattern {
    pub(super) fn new(text: &str) -> Pattern {
        Pattern {
            text: text.into(),
            parts: text.split('*').map(Box::from).collect(),
        }
    }

    pub(super) fn matches(&self, value: &str) -> bool {
        let (first, rest) = self.parts.split_first().expect("a pattern has a `*`");
        let (last, middle) = rest.split_last().expect("a pattern has a `*`");
        if value.len() < first.len() + last.len()
            || !value.starts_with(&**first)
            || !value.ends_with(&**last)
        {
            return false;
        }
        // Leftmost matches of the middle pieces are enough: taking a piece
        // as early as possible leaves the most room for the ones after it.
        let mut between = &value[first.len()..value.len() - last.len()];
        for piece in middle {
            match between.find(&**piece) {
                Some(at) => between = &between[at + piece.len()..],
                None => return false,
            }
        }
        true
    }
}

/// Appends one length-prefixed part, `<bytes>:<part>`: no content can end a
/// part early, so two different lists of parts never give the same key.
pub(super) fn push_part(key: &mut String, part: &str) {
    push_decimal(key, part.len());
    key.push(':');
    key.push_str(part);
}

fn push_decimal(out: &mut String, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        // n % 10 < 10: always one ASCII digit.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &digit in &digits[at..] {
        out.push(char::from(digit));
    }
}

/// The key's length for `domain` and entries of `text_bytes` bytes in all,
/// near enough to allocate once.
pub(super) fn key_capacity(domain: &str, entries: usize, text_bytes: usize) -> usize {
    domain.len() + text_bytes + 4 + entries * 10
}

/// envoyproxy/ratelimit's `SanitizeStatName`: `:` and `|` become `_`, and so
/// do the dots of anything that looks like an IPv4 address (four runs of
/// digits joined by dots, as its regular expression
/// `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` finds them).
pub(super) fn sanitize_stat_name(name: &mut String) {
    let mut bytes = std::mem::take(name).into_bytes();
    for byte in &mut bytes {
        if *byte == b':' || *byte == b'|' {
            *byte = b'_';
        }
    }
    let mut at = 0;
    while at < bytes.len() {
        match ipv4_at(&bytes, at) {
            Some(end) => {
                for byte in &mut bytes[at..end] {
                    if *byte == b'.' {
                        *byte = b'_';
                    }
                }
                at = end;
            }
            None => at += 1,
        }
    }
    // Only ASCII bytes were replaced, by ASCII bytes: still UTF-8.
    *name = String::from_utf8(bytes).expect("ASCII replaced by ASCII");
}

/// The end of the regular expression's match starting at `start`, if any.
/// Each of the first three runs must be followed by a dot, so only a whole
/// run of one to three digits can be; the last takes up to three digits,
/// greedily.
fn ipv4_at(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start;
    for group in 0..4 {
        let digits = bytes[at..]
            .iter()
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        if group < 3 {
            if digits > 3 || bytes.get(at + digits) != Some(&b'.') {
                return None;
            }
            at += digits + 1;
        } else {
            at += digits.min(3);
        }
    }
    Some(at)
}
