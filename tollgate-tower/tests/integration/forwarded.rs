//! `ForwardedIp` against a reference model of the right-most-untrusted rule,
//! on random proxy chains: whatever a client writes into the header, the key
//! is what the outermost trusted proxy saw, and a request from an untrusted
//! peer is keyed by the peer.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use http::Request;
use proptest::prelude::*;
use tollgate_tower::{Cidr, ForwardedIp, KeyExtractor};

/// Trusted proxies: 10.0.0.0/24. Others: 192.0.2.0/24.
fn addr(trusted: bool, last: u8) -> IpAddr {
    IpAddr::V4(if trusted {
        Ipv4Addr::new(10, 0, 0, last)
    } else {
        Ipv4Addr::new(192, 0, 2, last)
    })
}

/// The rule, written plainly: from an untrusted peer, the peer; otherwise
/// walk the entries from the right past trusted proxies; the first other
/// entry, or the left-most if all are trusted, or the peer if none.
fn reference(peer: IpAddr, entries: &[IpAddr], is_trusted: impl Fn(IpAddr) -> bool) -> IpAddr {
    if !is_trusted(peer) {
        return peer;
    }
    entries
        .iter()
        .rev()
        .find(|ip| !is_trusted(**ip))
        .or(entries.first())
        .copied()
        .unwrap_or(peer)
}

fn request(peer: IpAddr, header: &str, value: Option<String>) -> http::request::Parts {
    let mut builder = Request::get("/");
    if let Some(value) = value {
        builder = builder.header(header, value);
    }
    let mut request = builder.body(()).unwrap();
    request.extensions_mut().insert(SocketAddr::new(peer, 4000));
    request.into_parts().0
}

proptest! {
    #[test]
    fn the_key_is_the_right_most_untrusted_entry(
        peer_trusted: bool,
        peer_last: u8,
        chain in proptest::collection::vec((any::<bool>(), any::<u8>(), any::<bool>()), 0..6),
        forwarded: bool,
    ) {
        let trusted: Cidr = "10.0.0.0/24".parse().unwrap();
        let is_trusted = |ip: IpAddr| trusted.contains(ip);
        let peer = addr(peer_trusted, peer_last);
        let entries: Vec<IpAddr> = chain.iter().map(|(t, last, _)| addr(*t, *last)).collect();
        let (extractor, header, value) = if forwarded {
            // Some entries with ports and quotes, as RFC 7239 allows.
            let list = chain
                .iter()
                .zip(&entries)
                .map(|((_, _, port), ip)| if *port { format!("for=\"{ip}:8080\";proto=https") } else { format!("for={ip}") })
                .collect::<Vec<_>>()
                .join(", ");
            (ForwardedIp::forwarded([trusted]), "forwarded", list)
        } else {
            let list = chain
                .iter()
                .zip(&entries)
                .map(|((_, _, port), ip)| if *port { format!("{ip}:8080") } else { ip.to_string() })
                .collect::<Vec<_>>()
                .join(",");
            (ForwardedIp::x_forwarded_for([trusted]), "x-forwarded-for", list)
        };
        let value = (!entries.is_empty()).then_some(value);
        let parts = request(peer, header, value);
        prop_assert_eq!(extractor.extract(&parts).unwrap(), reference(peer, &entries, is_trusted));
    }

    #[test]
    fn an_untrusted_peer_is_its_own_key_whatever_it_sends(header in "[ -~]{0,80}", last: u8) {
        let peer = addr(false, last);
        let parts = request(peer, "x-forwarded-for", Some(header.clone()));
        prop_assert_eq!(ForwardedIp::x_forwarded_for(["10.0.0.0/24".parse().unwrap()]).extract(&parts).unwrap(), peer);
        let parts = request(peer, "forwarded", Some(header));
        prop_assert_eq!(ForwardedIp::forwarded(["10.0.0.0/24".parse().unwrap()]).extract(&parts).unwrap(), peer);
    }

    #[test]
    fn garbage_from_a_trusted_proxy_is_an_error_never_a_panic(header in "[ -~]{0,80}") {
        let parts = request(addr(true, 1), "forwarded", Some(header.clone()));
        let _ = ForwardedIp::forwarded(["10.0.0.0/24".parse().unwrap()]).extract(&parts);
        let parts = request(addr(true, 1), "x-forwarded-for", Some(header));
        let _ = ForwardedIp::x_forwarded_for(["10.0.0.0/24".parse().unwrap()]).extract(&parts);
    }
}
