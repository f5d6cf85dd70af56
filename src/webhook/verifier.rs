//! How a receiver's certificate is trusted (docs/api.md, "Where deliveries
//! may go"): a certificate listed in `webhooks.extra_ca_file` that the
//! receiver presents as its own certificate is pinned by its exact bytes
//! (self-signed receivers), and any other chain must lead to the system's
//! roots or a CA listed in that file.
//!
//! webpki, which verifies chains, takes no end-entity certificate as its own
//! trust anchor, so a self-signed receiver listed in the file would fail
//! with an unknown issuer without the pinned path.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// Pinned certificates first, then webpki with the roots.
#[derive(Debug)]
pub struct ReceiverVerifier {
    /// The certificates of `webhooks.extra_ca_file`, as DER.
    pinned: Vec<CertificateDer<'static>>,
    chains: Arc<WebPkiServerVerifier>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ReceiverVerifier {
    /// Trusts chains to `roots` (the system's and the extra file's) and the
    /// extra file's certificates themselves when presented as the receiver's.
    pub fn new(
        roots: RootCertStore,
        pinned: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
    ) -> Result<ReceiverVerifier, String> {
        let algorithms = provider.signature_verification_algorithms;
        let chains = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|error| format!("TLS setup: {error}"))?;
        Ok(ReceiverVerifier { pinned, chains, algorithms })
    }
}

impl ServerCertVerifier for ReceiverVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if !self.pinned.iter().any(|pinned| pinned.as_ref() == end_entity.as_ref()) {
            return self.chains.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        }
        // The bytes are trusted as they are, so who signed them does not
        // matter; what they say still must: the name and the dates. The
        // handshake signature proves the receiver holds the key (checked by
        // the two methods below).
        let parsed = ParsedCertificate::try_from(end_entity)?;
        let (not_before, not_after) = validity(end_entity.as_ref()).ok_or(CertificateError::BadEncoding)?;
        if now.as_secs() < not_before.as_secs() {
            return Err(CertificateError::NotValidYetContext { time: now, not_before }.into());
        }
        if now.as_secs() > not_after.as_secs() {
            return Err(CertificateError::ExpiredContext { time: now, not_after }.into());
        }
        rustls::client::verify_server_name(&parsed, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.chains.root_hint_subjects()
    }
}

/// A certificate's validity period (RFC 5280, 4.1.2.5): `notBefore` and
/// `notAfter` of its `tbsCertificate`, or `None` if the DER is not one.
fn validity(der: &[u8]) -> Option<(UnixTime, UnixTime)> {
    let (tag, certificate, _) = read_tlv(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = read_tlv(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut rest = tbs;
    // version [0] EXPLICIT (optional), serialNumber, signature, issuer.
    let (tag, _, after) = read_tlv(rest)?;
    if tag == VERSION {
        rest = after;
    }
    for expected in [INTEGER, SEQUENCE, SEQUENCE] {
        let (tag, _, after) = read_tlv(rest)?;
        if tag != expected {
            return None;
        }
        rest = after;
    }
    let (tag, validity, _) = read_tlv(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, not_before, after) = read_tlv(validity)?;
    let not_before = time(tag, not_before)?;
    let (tag, not_after, after) = read_tlv(after)?;
    let not_after = time(tag, not_after)?;
    after.is_empty().then_some((not_before, not_after))
}

const INTEGER: u8 = 0x02;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;

/// One DER element: its tag, its contents and what follows it.
fn read_tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        first as usize
    } else {
        // Long form: up to four length bytes is far more than a certificate needs.
        let count = (first & 0x7f) as usize;
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |length, byte| (length << 8) | *byte as usize)
    };
    (rest.len() >= length).then(|| (tag, &rest[..length], &rest[length..]))
}

/// A `UTCTime` (`YYMMDDHHMMSSZ`, years 1950 to 2049) or `GeneralizedTime`
/// (`YYYYMMDDHHMMSSZ`), the two forms RFC 5280 allows.
fn time(tag: u8, text: &[u8]) -> Option<UnixTime> {
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.iter().try_fold(0i64, |value, byte| byte.is_ascii_digit().then(|| value * 10 + (byte - b'0') as i64))
    };
    let (year, rest) = match (tag, text.len()) {
        (UTC_TIME, 13) => {
            let year = digits(0..2)?;
            (if year >= 50 { 1900 + year } else { 2000 + year }, 2)
        }
        (GENERALIZED_TIME, 15) => (digits(0..4)?, 4),
        _ => return None,
    };
    if text.last() != Some(&b'Z') {
        return None;
    }
    let at = |offset: usize| digits(rest + offset..rest + offset + 2);
    let (month, day, hour, minute, second) = (at(0)?, at(2)?, at(4)?, at(6)?, at(8)?);
    let date = jiff::civil::DateTime::new(
        i16::try_from(year).ok()?,
        i8::try_from(month).ok()?,
        i8::try_from(day).ok()?,
        i8::try_from(hour).ok()?,
        i8::try_from(minute).ok()?,
        i8::try_from(second).ok()?,
        0,
    )
    .ok()?;
    let seconds = date.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp().as_second();
    // Before 1970 is as good as the epoch for "not before".
    Some(UnixTime::since_unix_epoch(std::time::Duration::from_secs(seconds.max(0) as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_time_forms() {
        assert_eq!(time(UTC_TIME, b"700101000000Z").unwrap().as_secs(), 0);
        assert_eq!(time(UTC_TIME, b"491231235959Z").unwrap().as_secs(), 2_524_607_999);
        assert_eq!(time(GENERALIZED_TIME, b"20500101000000Z").unwrap().as_secs(), 2_524_608_000);
        assert_eq!(time(UTC_TIME, b"500101000000Z").unwrap().as_secs(), 0, "1950, before the epoch");
        for (tag, bad) in [
            (UTC_TIME, &b"7001010000Z"[..]),
            (UTC_TIME, b"700101000000+"),
            (UTC_TIME, b"701301000000Z"),
            (GENERALIZED_TIME, b"700101000000Z"),
            (INTEGER, b"700101000000Z"),
        ] {
            assert!(time(tag, bad).is_none(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn reads_the_validity_of_a_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["receiver.example".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2030, 1, 1);
        params.not_after = rcgen::date_time_ymd(2060, 1, 1);
        let der = params.self_signed(&key).unwrap().der().to_vec();
        let (not_before, not_after) = validity(&der).unwrap();
        assert_eq!((not_before.as_secs(), not_after.as_secs()), (1_893_456_000, 2_840_140_800));
        assert!(validity(&der[..der.len() - 1]).is_none());
    }

    #[test]
    fn reads_long_form_lengths_and_refuses_short_input() {
        let mut long = vec![SEQUENCE, 0x82, 0x01, 0x00];
        long.extend(std::iter::repeat_n(7, 256));
        let (tag, contents, rest) = read_tlv(&long).unwrap();
        assert_eq!((tag, contents.len(), rest.len()), (SEQUENCE, 256, 0));
        assert!(read_tlv(&long[..100]).is_none());
        assert!(read_tlv(&[SEQUENCE, 0x80]).is_none(), "indefinite lengths are not DER");
        assert!(read_tlv(&[SEQUENCE]).is_none());
    }
}
