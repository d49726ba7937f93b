//! The signature of a delivery, pure: the `Amble-Signature` header.
//!
//! `Amble-Signature: t=<unix ms>,v1=<hex>`, where `<hex>` is the
//! HMAC-SHA256, under the secret of `--webhook-secret-file`, of
//! `"<t>.<body>"`. The receiver recomputes it over the raw body, compares
//! in constant time, and refuses a `t` too far from its own clock (a
//! replayed delivery). Each attempt of a delivery is signed again with its
//! own `t`; the body (and so the event ids) stays the same.

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// The header's name.
pub const HEADER: &str = "Amble-Signature";

/// The header's value for `body` sent at `t_ms` (ms since the Unix epoch).
pub fn sign(secret: &[u8], t_ms: u64, body: &[u8]) -> String {
    format!("t={t_ms},v1={}", hex(&mac(secret, t_ms, body)))
}

/// Whether `header` is a valid signature of `body` under `secret`, made at
/// most `tolerance_ms` from `now_ms`. What a receiver does; the tests use
/// it.
pub fn verify(secret: &[u8], header: &str, body: &[u8], now_ms: u64, tolerance_ms: u64) -> bool {
    let mut t = None;
    let mut v1 = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => t = value.parse::<u64>().ok(),
            Some(("v1", value)) => v1.push(value),
            _ => {}
        }
    }
    let Some(t) = t else { return false };
    if t.abs_diff(now_ms) > tolerance_ms {
        return false;
    }
    let Ok(mut want) = <Hmac<Sha256>>::new_from_slice(secret) else {
        return false;
    };
    want.update(t.to_string().as_bytes());
    want.update(b".");
    want.update(body);
    v1.iter()
        .any(|hex| unhex(hex).is_some_and(|given| want.clone().verify_slice(&given).is_ok()))
}

fn mac(secret: &[u8], t_ms: u64, body: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length.
    let Ok(mut mac) = <Hmac<Sha256>>::new_from_slice(secret) else {
        return Vec::new();
    };
    mac.update(t_ms.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed independently: Python's `hmac.new(b"whsec-test",
    /// b'1700000000000.{"events":[]}', hashlib.sha256).hexdigest()`.
    const VECTOR: &str = "f1a78d3d363d54b2310e16865e7b8fbdcd74c21b21e4c23e9d73e17a8e26bd66";

    #[test]
    fn signs_the_known_vector() {
        let header = sign(b"whsec-test", 1_700_000_000_000, br#"{"events":[]}"#);
        assert_eq!(header, format!("t=1700000000000,v1={VECTOR}"));
    }

    #[test]
    fn verifies_only_the_same_body_secret_and_a_fresh_time() {
        let body = br#"{"events":[]}"#;
        let header = sign(b"whsec-test", 1_700_000_000_000, body);
        let now = 1_700_000_000_000 + 299_000;
        assert!(verify(b"whsec-test", &header, body, now, 300_000));
        assert!(!verify(b"whsec-test", &header, body, now, 298_999));
        assert!(!verify(b"other", &header, body, now, 300_000));
        assert!(!verify(
            b"whsec-test",
            &header,
            br#"{"events":[1]}"#,
            now,
            300_000
        ));
        let moved = header.replace("t=1700000000000", "t=1700000000001");
        assert!(!verify(b"whsec-test", &moved, body, now, 300_000));
        assert!(!verify(b"whsec-test", "v1=00", body, now, 300_000));
        assert!(!verify(
            b"whsec-test",
            "t=1700000000000,v1=zz",
            body,
            now,
            300_000
        ));
    }
}
