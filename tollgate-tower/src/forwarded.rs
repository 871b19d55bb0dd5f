//! The client's address behind trusted reverse proxies: `X-Forwarded-For`
//! and `Forwarded` (RFC 7239), believed only when the connection comes from a
//! proxy the server was told to trust.
//!
//! Each proxy appends the address it received the request from, so a list
//! reads `client, proxy1, proxy2` — but everything left of what the first
//! trusted proxy appended was written by the client and may be anything. The
//! only safe reading is the **right-most entry that is not a trusted proxy**:
//! walk the list from the right, skip the addresses of trusted proxies, and
//! the first other address is the one the outermost trusted proxy saw.
//! (`tower_governor`'s `SmartIp` takes the *left-most* entry, which any
//! client can set.) A request from an untrusted peer is keyed by the peer's
//! own address whatever headers it sends.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use http::StatusCode;
use http::header::{FORWARDED, HeaderName};
use http::request::Parts;

use crate::key::{KeyError, KeyExtractor, peer_addr};

/// A block of addresses in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`, or a
/// single address), for the trusted-proxy list.
///
/// ```
/// use tollgate_tower::Cidr;
/// let private: Cidr = "10.0.0.0/8".parse().unwrap();
/// assert!(private.contains("10.1.2.3".parse().unwrap()));
/// assert!(!private.contains("11.0.0.1".parse().unwrap()));
/// assert!("10.0.0.0/33".parse::<Cidr>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is inside the block (an IPv4-mapped IPv6 address counts
    /// as its IPv4 address).
    ///
    /// ```
    /// use tollgate_tower::Cidr;
    /// let one: Cidr = "192.0.2.1".parse().unwrap();
    /// assert!(one.contains("::ffff:192.0.2.1".parse().unwrap()));
    /// ```
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Why a [`Cidr`] did not parse.
///
/// ```
/// use tollgate_tower::Cidr;
/// let err = "10.0.0.0/40".parse::<Cidr>().unwrap_err();
/// assert_eq!(err.to_string(), "invalid CIDR block \"10.0.0.0/40\": prefix longer than the address");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseCidrError {
    input: String,
    why: &'static str,
}

impl fmt::Display for ParseCidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid CIDR block {:?}: {}", self.input, self.why)
    }
}

impl std::error::Error for ParseCidrError {}

impl FromStr for Cidr {
    type Err = ParseCidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = |why| ParseCidrError {
            input: s.to_owned(),
            why,
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let network = IpAddr::from_str(addr.trim())
            .map_err(|_| error("not an IP address"))?
            .to_canonical();
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .map_err(|_| error("the prefix is not a number"))?,
        };
        if prefix > max {
            return Err(error("prefix longer than the address"));
        }
        Ok(Cidr { network, prefix })
    }
}

impl From<IpAddr> for Cidr {
    fn from(ip: IpAddr) -> Self {
        let ip = ip.to_canonical();
        Cidr {
            network: ip,
            prefix: if ip.is_ipv4() { 32 } else { 128 },
        }
    }
}

/// Which forwarding header a [`ForwardedIp`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    XForwardedFor,
    Forwarded,
}

/// The key is the client's IP address as the outermost trusted proxy saw it:
/// the right-most entry of `X-Forwarded-For` (or the `for=` parameters of
/// `Forwarded`, RFC 7239) that is not itself a trusted proxy — read only when
/// the connection's peer is a trusted proxy. Any other request is keyed by
/// its peer address, whatever it claims.
///
/// Each proxy appends the address it received the request from, so a list
/// reads `client, proxy1, proxy2` — but everything left of what the first
/// trusted proxy appended was written by the client and may be anything. The
/// only safe reading is the right-most entry that is not a trusted proxy.
/// (`tower_governor`'s `SmartIp` takes the left-most entry, which any client
/// can set.) When every entry is a trusted proxy the left-most is taken; with
/// no header, the trusted peer itself is the key.
///
/// Errors: the peer address is missing (`500`, as for
/// [`PeerIp`](crate::PeerIp)); a trusted proxy forwarded an entry that is
/// not an address — `unknown`, an obfuscated identifier, garbage — where the
/// client should be (`400`: the request cannot be attributed to anyone, and
/// keying it by the proxy would throttle every client behind it together).
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use tollgate_tower::{ForwardedIp, KeyExtractor};
///
/// let keys = ForwardedIp::x_forwarded_for(["10.0.0.0/8".parse().unwrap()]);
/// let request = |peer: &str, xff: &str| {
///     let mut request = Request::get("/").header("x-forwarded-for", xff).body(()).unwrap();
///     request.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
///     request.into_parts().0
/// };
/// // Through the proxy at 10.0.0.2: the client is the right-most untrusted entry.
/// let via_proxy = request("10.0.0.2:1", "6.6.6.6, 203.0.113.9, 10.0.0.7");
/// assert_eq!(keys.extract(&via_proxy).unwrap().to_string(), "203.0.113.9");
/// // Straight from a client: its header is ignored.
/// let spoofed = request("198.51.100.4:1", "1.2.3.4");
/// assert_eq!(keys.extract(&spoofed).unwrap().to_string(), "198.51.100.4");
/// ```
#[derive(Debug, Clone)]
pub struct ForwardedIp {
    trusted: Vec<Cidr>,
    scheme: Scheme,
}

impl ForwardedIp {
    /// Reads `X-Forwarded-For` from peers in `trusted`.
    ///
    /// ```
    /// use tollgate_tower::ForwardedIp;
    /// let _ = ForwardedIp::x_forwarded_for(["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()]);
    /// ```
    pub fn x_forwarded_for(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        ForwardedIp {
            trusted: trusted.into_iter().collect(),
            scheme: Scheme::XForwardedFor,
        }
    }

    /// Reads the `for=` parameters of `Forwarded` (RFC 7239) from peers in
    /// `trusted`.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use http::Request;
    /// use tollgate_tower::{ForwardedIp, KeyExtractor};
    ///
    /// let keys = ForwardedIp::forwarded(["10.0.0.0/8".parse().unwrap()]);
    /// let mut request = Request::get("/")
    ///     .header("forwarded", r#"for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711""#)
    ///     .body(())
    ///     .unwrap();
    /// request.extensions_mut().insert("10.0.0.2:1".parse::<SocketAddr>().unwrap());
    /// let (parts, ()) = request.into_parts();
    /// assert_eq!(keys.extract(&parts).unwrap().to_string(), "2001:db8:cafe::17");
    /// ```
    pub fn forwarded(trusted: impl IntoIterator<Item = Cidr>) -> Self {
        ForwardedIp {
            trusted: trusted.into_iter().collect(),
            scheme: Scheme::Forwarded,
        }
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }

    fn header(&self) -> HeaderName {
        match self.scheme {
            Scheme::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            Scheme::Forwarded => FORWARDED,
        }
    }
}

impl KeyExtractor for ForwardedIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        let peer = peer_addr(parts)?;
        if !self.is_trusted(peer) {
            return Ok(peer);
        }
        // Every instance of the header, in order, as one list (RFC 9110 §5.3).
        let mut entries = Vec::new();
        for value in parts.headers.get_all(self.header()) {
            let value = value
                .to_str()
                .map_err(|_| bad("a forwarding header is not ASCII"))?;
            match self.scheme {
                Scheme::XForwardedFor => {
                    entries.extend(value.split(',').map(|e| e.trim().to_owned()))
                }
                Scheme::Forwarded => forwarded_for(value, &mut entries)?,
            }
        }
        // The peer is trusted: walk back from it through trusted proxies.
        let mut client = peer;
        for entry in entries.iter().rev() {
            let ip = parse_node(entry).ok_or_else(|| {
                bad(&format!(
                    "a trusted proxy forwarded {entry:?}, not an IP address, as the client"
                ))
            })?;
            client = ip;
            if !self.is_trusted(ip) {
                break;
            }
        }
        Ok(client)
    }
}

fn bad(why: &str) -> KeyError {
    KeyError::new(StatusCode::BAD_REQUEST, why)
}

/// An address as forwarding headers write it: `192.0.2.1`, `192.0.2.1:80`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:443`.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    if let Some(rest) = node.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.starts_with(':')) {
            return None;
        }
        return Ipv6Addr::from_str(ip)
            .ok()
            .map(|ip| IpAddr::V6(ip).to_canonical());
    }
    if let Ok(ip) = IpAddr::from_str(node) {
        return Some(ip.to_canonical());
    }
    // `a.b.c.d:port`
    let (ip, port) = node.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    Ipv4Addr::from_str(ip).ok().map(IpAddr::V4)
}

/// Appends the `for=` value of every element of one `Forwarded` field value
/// (RFC 7239 §4: elements separated by `,`, pairs by `;`, values tokens or
/// quoted strings, parameter names case-insensitive). An element without
/// `for=` contributes an empty entry, which is not an address.
fn forwarded_for(value: &str, out: &mut Vec<String>) -> Result<(), KeyError> {
    let malformed = || bad("malformed Forwarded header");
    let mut chars = value.chars().peekable();
    let mut element_for: Option<String> = None;
    let mut element_seen = false;
    loop {
        // A pair: name '=' value.
        while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ';' || c == ',' {
                break;
            }
            name.push(c);
            chars.next();
        }
        let name = name.trim().to_ascii_lowercase();
        let mut val = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            if chars.peek() == Some(&'"') {
                chars.next();
                let mut closed = false;
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => val.push(chars.next().ok_or_else(malformed)?),
                        '"' => {
                            closed = true;
                            break;
                        }
                        c => val.push(c),
                    }
                }
                if !closed {
                    return Err(malformed());
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ';' || c == ',' {
                        break;
                    }
                    val.push(c);
                    chars.next();
                }
            }
        } else if !name.is_empty() {
            return Err(malformed());
        }
        if !name.is_empty() {
            element_seen = true;
            if name == "for" {
                if element_for.is_some() {
                    return Err(malformed());
                }
                element_for = Some(val.trim().to_owned());
            }
        }
        while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            chars.next();
        }
        match chars.next() {
            Some(';') => {}
            Some(',') | None => {
                if element_seen {
                    out.push(element_for.take().unwrap_or_default());
                }
                element_seen = false;
                if chars.peek().is_none() {
                    return Ok(());
                }
            }
            Some(_) => return Err(malformed()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_in_every_written_form() {
        for (node, ip) in [
            ("192.0.2.1", "192.0.2.1"),
            ("192.0.2.1:80", "192.0.2.1"),
            ("2001:db8::1", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("::ffff:192.0.2.1", "192.0.2.1"),
        ] {
            assert_eq!(parse_node(node), Some(ip.parse().unwrap()), "{node}");
        }
        for node in [
            "unknown",
            "_hidden",
            "",
            "[2001:db8::1]x",
            "1.2.3.4:port",
            "[1.2.3.4]",
        ] {
            assert_eq!(parse_node(node), None, "{node}");
        }
    }

    #[test]
    fn forwarded_elements() {
        let mut out = Vec::new();
        forwarded_for(
            r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711", proto=https"#,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, ["192.0.2.60", "[2001:db8:cafe::17]:4711", ""]);
        let mut out = Vec::new();
        forwarded_for(r#"for="a,b";by=x"#, &mut out).unwrap();
        assert_eq!(out, ["a,b"]);
        for bad in [r#"for="unterminated"#, "for=1.2.3.4;for=5.6.7.8", "for"] {
            assert!(forwarded_for(bad, &mut Vec::new()).is_err(), "{bad}");
        }
    }

    #[test]
    fn cidr_edges() {
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("255.1.2.3".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
        assert!("nonsense/8".parse::<Cidr>().is_err());
        assert!("10.0.0.0/x".parse::<Cidr>().is_err());
    }
}
