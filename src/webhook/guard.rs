//! The target address guard (docs/api.md, "Where deliveries may go"): which
//! addresses a webhook may be delivered to. Checked at registration for an
//! address written in the URL, and for every address a host name resolves
//! to before each attempt.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What an address is, for the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// Link-local, unspecified, cloud metadata, multicast, reserved: never.
    Forbidden,
    /// Loopback and private ranges: only with `webhooks.allow_private_targets`.
    Private,
    /// Everything else.
    Public,
}

impl AddressClass {
    /// Whether a delivery may go to an address of this class.
    pub fn allowed(self, allow_private: bool) -> bool {
        match self {
            AddressClass::Forbidden => false,
            AddressClass::Private => allow_private,
            AddressClass::Public => true,
        }
    }
}

/// Classifies an address; an IPv6 address that embeds an IPv4 one is
/// judged by the IPv4 address.
pub fn classify(address: IpAddr) -> AddressClass {
    match address {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => classify_v4(v4),
            None => classify_v6(v6),
        },
    }
}

fn classify_v4(address: Ipv4Addr) -> AddressClass {
    let [a, b, ..] = address.octets();
    // Cloud metadata first: 100.100.100.200 lies inside the CGNAT range.
    if address == Ipv4Addr::new(169, 254, 169, 254) || address == Ipv4Addr::new(100, 100, 100, 200) {
        return AddressClass::Forbidden;
    }
    let forbidden = a == 0 // unspecified, "this network"
        || (a == 169 && b == 254) // link-local
        || (224..=239).contains(&a) // multicast
        || a >= 240; // reserved, broadcast
    if forbidden {
        return AddressClass::Forbidden;
    }
    let private = a == 127 // loopback
        || a == 10
        || (a == 172 && (16..=31).contains(&b))
        || (a == 192 && b == 168)
        || (a == 100 && (64..=127).contains(&b)); // shared address space (CGNAT)
    if private { AddressClass::Private } else { AddressClass::Public }
}

fn classify_v6(address: Ipv6Addr) -> AddressClass {
    let segments = address.segments();
    if address == "fd00:ec2::254".parse::<Ipv6Addr>().expect("a valid literal") {
        return AddressClass::Forbidden;
    }
    if address.is_unspecified() || (segments[0] & 0xffc0) == 0xfe80 || (segments[0] & 0xff00) == 0xff00 {
        return AddressClass::Forbidden;
    }
    if address.is_loopback() || (segments[0] & 0xfe00) == 0xfc00 {
        return AddressClass::Private;
    }
    AddressClass::Public
}

/// The IPv4 address an IPv6 one carries: IPv4-mapped (`::ffff:0:0/96`),
/// IPv4-compatible (`::/96`, deprecated, but routed by some stacks), NAT64
/// (`64:ff9b::/96`, `64:ff9b:1::/48`) and 6to4 (`2002::/16`).
fn embedded_v4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = address.segments();
    let last32 = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff {
        return Some(last32());
    }
    // `::` and `::1` are IPv6's own unspecified and loopback addresses.
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return Some(last32());
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) {
        return Some(last32());
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_of_address_is_judged_as_documented() {
        use AddressClass::*;
        let table: &[(&str, AddressClass)] = &[
            // never
            ("169.254.1.1", Forbidden),
            ("169.254.169.254", Forbidden),
            ("100.100.100.200", Forbidden),
            ("0.0.0.0", Forbidden),
            ("0.1.2.3", Forbidden),
            ("224.0.0.1", Forbidden),
            ("239.255.255.255", Forbidden),
            ("240.0.0.1", Forbidden),
            ("255.255.255.255", Forbidden),
            ("fe80::1", Forbidden),
            ("febf::1", Forbidden),
            ("::", Forbidden),
            ("fd00:ec2::254", Forbidden),
            ("ff02::1", Forbidden),
            // only with allow_private_targets
            ("127.0.0.1", Private),
            ("127.255.0.9", Private),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.0.10", Private),
            ("100.64.0.1", Private),
            ("100.127.255.255", Private),
            ("::1", Private),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            // embedded IPv4, judged by it
            ("::ffff:127.0.0.1", Private),
            ("::ffff:169.254.169.254", Forbidden),
            ("::ffff:8.8.8.8", Public),
            ("::127.0.0.1", Private),
            ("64:ff9b::10.0.0.1", Private),
            ("64:ff9b::169.254.169.254", Forbidden),
            ("64:ff9b:1::a00:1", Private),
            ("2002:a9fe:a9fe::1", Forbidden),
            ("2002:0a00:0001::1", Private),
            ("2002:0808:0808::1", Public),
            // everything else
            ("8.8.8.8", Public),
            ("172.32.0.1", Public),
            ("100.128.0.1", Public),
            ("169.255.0.1", Public),
            ("2606:4700::1111", Public),
        ];
        for (text, expected) in table {
            let address: IpAddr = text.parse().unwrap();
            assert_eq!(classify(address), *expected, "{text}");
        }
        assert!(Private.allowed(true) && !Private.allowed(false));
        assert!(!Forbidden.allowed(true) && Public.allowed(false));
    }
}
