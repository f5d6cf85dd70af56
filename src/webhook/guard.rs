//! The target address guard (docs/api.md, "Where deliveries may go"): which
//! addresses a webhook may be delivered to. Checked at registration for an
//! address written in the URL, and for every address a host name resolves
//! to before each attempt.
//!
//! Three classes. Forbidden addresses are never a receiver of one's own, or
//! reach something no webhook should: link-local and cloud metadata,
//! unspecified, multicast and broadcast, and every range set aside for
//! documentation, benchmarking, protocol assignments or future use (nothing
//! answers there on purpose; on a network that routes them anyway, whatever
//! answers is not what the operator meant by "private"). Private addresses
//! are networks an operator may run receivers on: loopback, the RFC 1918
//! ranges, shared address space (CGNAT), unique-local and the deprecated
//! site-local IPv6 ranges, and the local-use NAT64 prefix; they are opened by
//! `webhooks.allow_private_targets`. Everything else is public.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What an address is, for the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// Link-local, unspecified, cloud metadata, multicast, broadcast,
    /// documentation, benchmarking, protocol assignments, reserved, Teredo:
    /// never.
    Forbidden,
    /// Loopback and private networks: only with
    /// `webhooks.allow_private_targets`.
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
/// judged by the IPv4 address, but the local-use NAT64 prefix is judged
/// whole (`classify_nat64_local`).
pub fn classify(address: IpAddr) -> AddressClass {
    match address {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(class) = classify_nat64_local(v6) {
                return class;
            }
            match embedded_v4(v6) {
                Some(v4) => classify_v4(v4),
                None => classify_v6(v6),
            }
        }
    }
}

/// IPv4 ranges other than the public internet, first match wins: the cloud
/// metadata addresses come before the ranges that hold them.
const V4_RANGES: &[([u8; 4], u8, AddressClass)] = {
    use AddressClass::*;
    &[
        ([169, 254, 169, 254], 32, Forbidden), // cloud metadata
        ([100, 100, 100, 200], 32, Forbidden), // cloud metadata (inside CGNAT)
        ([0, 0, 0, 0], 8, Forbidden),          // unspecified, "this network"
        ([169, 254, 0, 0], 16, Forbidden),     // link-local
        ([192, 0, 0, 0], 24, Forbidden),       // IETF protocol assignments
        ([192, 0, 2, 0], 24, Forbidden),       // documentation (TEST-NET-1)
        ([198, 51, 100, 0], 24, Forbidden),    // documentation (TEST-NET-2)
        ([203, 0, 113, 0], 24, Forbidden),     // documentation (TEST-NET-3)
        ([198, 18, 0, 0], 15, Forbidden),      // benchmarking
        ([192, 88, 99, 0], 24, Forbidden),     // 6to4 relay anycast (deprecated)
        ([224, 0, 0, 0], 4, Forbidden),        // multicast
        ([240, 0, 0, 0], 4, Forbidden),        // reserved, and broadcast
        ([127, 0, 0, 0], 8, Private),          // loopback
        ([10, 0, 0, 0], 8, Private),           // private (RFC 1918)
        ([172, 16, 0, 0], 12, Private),        // private (RFC 1918)
        ([192, 168, 0, 0], 16, Private),       // private (RFC 1918)
        ([100, 64, 0, 0], 10, Private),        // shared address space (CGNAT)
    ]
};

fn classify_v4(address: Ipv4Addr) -> AddressClass {
    let bits = u32::from(address);
    V4_RANGES
        .iter()
        .find(|(network, length, _)| {
            (bits ^ u32::from_be_bytes(*network)).checked_shr(32 - u32::from(*length)).unwrap_or(0) == 0
        })
        .map_or(AddressClass::Public, |(_, _, class)| *class)
}

/// IPv6 ranges, for an address that carries no IPv4 one; first match wins.
/// Outside these, only global unicast (`2000::/3`) is public: the rest of
/// the space is unassigned or reserved.
const V6_RANGES: &[(u128, u8, AddressClass)] = {
    use AddressClass::*;
    &[
        (0xfd00_0ec2_0000_0000_0000_0000_0000_0254, 128, Forbidden), // cloud metadata
        (0, 128, Forbidden),                                         // unspecified
        (1, 128, Private),                                           // loopback
        (0xfe80 << 112, 10, Forbidden),                              // link-local
        (0xfec0 << 112, 10, Private),                                // site-local (deprecated)
        (0xfc00 << 112, 7, Private),                                 // unique local
        (0xff00 << 112, 8, Forbidden),                               // multicast
        // IETF protocol assignments: Teredo (`2001::/32`, refused whole
        // rather than judged by the client address it carries, which any
        // relay may reach), benchmarking (`2001:2::/48`), ORCHID, anycast.
        (0x2001 << 112, 23, Forbidden),
        (0x2001_0db8 << 96, 32, Forbidden), // documentation
        (0x3fff << 112, 20, Forbidden),     // documentation
        (0x5f00 << 112, 16, Forbidden),     // SRv6 segment identifiers
        (0x2000 << 112, 3, Public),         // global unicast
    ]
};

fn classify_v6(address: Ipv6Addr) -> AddressClass {
    let bits = u128::from(address);
    V6_RANGES
        .iter()
        .find(|(network, length, _)| (bits ^ network).checked_shr(128 - u32::from(*length)).unwrap_or(0) == 0)
        .map_or(AddressClass::Forbidden, |(_, _, class)| *class)
}

/// The local-use NAT64 prefix, `64:ff9b:1::/48` (RFC 8215), holds an
/// operator's own translation prefixes of any length from /48 to /96, so the
/// IPv4 address inside cannot be told apart from the prefix: the whole range
/// is private, and forbidden if any RFC 6052 layout that fits in it (/48,
/// /56, /64, /96) carries a link-local or cloud metadata IPv4 address.
fn classify_nat64_local(address: Ipv6Addr) -> Option<AddressClass> {
    let b = address.octets();
    if b[..6] != [0, 0x64, 0xff, 0x9b, 0, 1] {
        return None;
    }
    let layouts = [
        [b[6], b[7], b[9], b[10]],
        [b[7], b[9], b[10], b[11]],
        [b[9], b[10], b[11], b[12]],
        [b[12], b[13], b[14], b[15]],
    ];
    let reaches_link_local = layouts.iter().any(|&octets| {
        let v4 = Ipv4Addr::from(octets);
        v4.is_link_local() || v4 == Ipv4Addr::new(100, 100, 100, 200)
    });
    Some(if reaches_link_local { AddressClass::Forbidden } else { AddressClass::Private })
}

/// The IPv4 address an IPv6 one carries: IPv4-mapped (`::ffff:0:0/96`),
/// IPv4-translated (SIIT, `::ffff:0:0:0/96`), IPv4-compatible (`::/96`,
/// deprecated, but routed by some stacks), NAT64 (`64:ff9b::/96`) and 6to4
/// (`2002::/16`). The local-use NAT64 prefix is judged whole
/// (`classify_nat64_local`), and Teredo is refused whole (`V6_RANGES`).
fn embedded_v4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = address.segments();
    let last32 = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff {
        return Some(last32());
    }
    if s[..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0 {
        return Some(last32());
    }
    // `::` and `::1` are IPv6's own unspecified and loopback addresses.
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return Some(last32());
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
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
            ("169.254.0.0", Forbidden),
            ("169.254.1.1", Forbidden),
            ("169.254.169.254", Forbidden),
            ("169.254.255.255", Forbidden),
            ("100.100.100.200", Forbidden),
            ("0.0.0.0", Forbidden),
            ("0.1.2.3", Forbidden),
            ("0.255.255.255", Forbidden),
            ("224.0.0.0", Forbidden),
            ("224.0.0.1", Forbidden),
            ("239.255.255.255", Forbidden),
            ("240.0.0.0", Forbidden),
            ("240.0.0.1", Forbidden),
            ("255.255.255.254", Forbidden),
            ("255.255.255.255", Forbidden),
            ("fe80::1", Forbidden),
            ("febf::1", Forbidden),
            ("::", Forbidden),
            ("fd00:ec2::254", Forbidden),
            ("ff00::", Forbidden),
            ("ff02::1", Forbidden),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Forbidden),
            // never: IETF protocol assignments
            ("192.0.0.0", Forbidden),
            ("192.0.0.9", Forbidden),
            ("192.0.0.170", Forbidden),
            ("192.0.0.255", Forbidden),
            // never: documentation (TEST-NET-1, -2, -3)
            ("192.0.2.0", Forbidden),
            ("192.0.2.1", Forbidden),
            ("192.0.2.255", Forbidden),
            ("198.51.100.0", Forbidden),
            ("198.51.100.7", Forbidden),
            ("198.51.100.255", Forbidden),
            ("203.0.113.0", Forbidden),
            ("203.0.113.50", Forbidden),
            ("203.0.113.255", Forbidden),
            // never: benchmarking
            ("198.18.0.0", Forbidden),
            ("198.18.5.1", Forbidden),
            ("198.19.255.255", Forbidden),
            // never: deprecated 6to4 relay anycast
            ("192.88.99.0", Forbidden),
            ("192.88.99.255", Forbidden),
            // never: IPv6 documentation
            ("2001:db8::", Forbidden),
            ("2001:db8::1", Forbidden),
            ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", Forbidden),
            ("3fff::", Forbidden),
            ("3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", Forbidden),
            // never: Teredo, whole, whatever client address it carries
            ("2001::", Forbidden),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Forbidden),
            ("2001:0:4136:e378:8000:63bf:f5ff:fffe", Forbidden),
            ("2001:0:ffff:ffff:ffff:ffff:ffff:ffff", Forbidden),
            // never: other IPv6 protocol assignments (benchmarking, ORCHID)
            ("2001:2::", Forbidden),
            ("2001:2:0:ffff:ffff:ffff:ffff:ffff", Forbidden),
            ("2001:20::1", Forbidden),
            ("2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", Forbidden),
            // never: IPv6 outside global unicast, not otherwise assigned
            ("100::1", Forbidden),
            ("::2:0:0:1:2", Forbidden),
            ("64:ff9b:0:0:1::1", Forbidden),
            ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Forbidden),
            ("4000::1", Forbidden),
            ("5f00::1", Forbidden),
            ("fb00::1", Forbidden),
            // only with allow_private_targets
            ("127.0.0.0", Private),
            ("127.0.0.1", Private),
            ("127.255.0.9", Private),
            ("127.255.255.255", Private),
            ("10.0.0.0", Private),
            ("10.1.2.3", Private),
            ("10.255.255.255", Private),
            ("172.16.0.0", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.0.0", Private),
            ("192.168.0.10", Private),
            ("192.168.255.255", Private),
            ("::1", Private),
            ("fc00::", Private),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Private),
            // only with allow_private_targets: shared address space (CGNAT)
            ("100.64.0.0", Private),
            ("100.64.0.1", Private),
            ("100.100.100.199", Private),
            ("100.127.255.255", Private),
            // only with allow_private_targets: site-local (deprecated)
            ("fec0::", Private),
            ("fec0::1", Private),
            ("fed0:1::5", Private),
            ("feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Private),
            // embedded IPv4, judged by it: mapped, compatible, NAT64, 6to4
            ("::ffff:127.0.0.1", Private),
            ("::ffff:169.254.169.254", Forbidden),
            ("::ffff:192.0.2.1", Forbidden),
            ("::ffff:8.8.8.8", Public),
            ("::127.0.0.1", Private),
            ("::0.0.0.2", Forbidden),
            ("::8.8.8.8", Public),
            ("64:ff9b::10.0.0.1", Private),
            ("64:ff9b::169.254.169.254", Forbidden),
            ("64:ff9b::198.18.0.1", Forbidden),
            ("64:ff9b::8.8.8.8", Public),
            ("2002:a9fe:a9fe::1", Forbidden),
            ("2002:0a00:0001::1", Private),
            ("2002:c000:0201::1", Forbidden),
            ("2002:0808:0808::1", Public),
            // embedded IPv4, judged by it: IPv4-translated (SIIT), both edges
            ("::ffff:0:0.0.0.0", Forbidden),
            ("::ffff:0:127.0.0.1", Private),
            ("::ffff:0:10.0.0.1", Private),
            ("::ffff:0:169.254.169.254", Forbidden),
            ("::ffff:0:203.0.113.9", Forbidden),
            ("::ffff:0:8.8.8.8", Public),
            ("::ffff:0:255.255.255.255", Forbidden),
            // local-use NAT64: private whatever it carries, never public
            ("64:ff9b:1::", Private),
            ("64:ff9b:1::a00:1", Private),
            ("64:ff9b:1::8.8.8.8", Private),
            ("64:ff9b:1:808:8:800::", Private),
            ("64:ff9b:1:8:8:808::", Private),
            ("64:ff9b:1:0:8:808:800:0", Private),
            ("64:ff9b:1:ffff:ffff:ffff:ffff:ffff", Private),
            // local-use NAT64: forbidden when any layout carries metadata
            ("64:ff9b:1::169.254.169.254", Forbidden),
            ("64:ff9b:1:a9fe:a9:fe00::", Forbidden),
            ("64:ff9b:1:a9:fe:a9fe::", Forbidden),
            ("64:ff9b:1:0:a9:fea9:fe00:0", Forbidden),
            ("64:ff9b:1:0:64:6464:c800:0", Forbidden),
            // everything else
            ("1.0.0.0", Public),
            ("8.8.8.8", Public),
            ("9.255.255.255", Public),
            ("11.0.0.0", Public),
            ("100.63.255.255", Public),
            ("100.128.0.1", Public),
            ("126.255.255.255", Public),
            ("128.0.0.0", Public),
            ("169.253.255.255", Public),
            ("169.255.0.1", Public),
            ("172.15.255.255", Public),
            ("172.32.0.1", Public),
            ("191.255.255.255", Public),
            ("192.0.1.255", Public),
            ("192.0.3.0", Public),
            ("192.88.98.255", Public),
            ("192.88.100.0", Public),
            ("192.167.255.255", Public),
            ("192.169.0.0", Public),
            ("198.17.255.255", Public),
            ("198.20.0.0", Public),
            ("198.51.99.255", Public),
            ("198.51.101.0", Public),
            ("203.0.112.255", Public),
            ("203.0.114.0", Public),
            ("223.255.255.255", Public),
            ("2000::", Public),
            ("2001:200::1", Public),
            ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", Public),
            ("2001:db9::", Public),
            ("2606:4700::1111", Public),
            ("3ffe:ffff::1", Public),
            ("3fff:1000::", Public),
        ];
        for (text, expected) in table {
            let address: IpAddr = text.parse().unwrap();
            assert_eq!(classify(address), *expected, "{text}");
        }
        assert!(Private.allowed(true) && !Private.allowed(false));
        assert!(!Forbidden.allowed(true) && Public.allowed(false));
    }
}
