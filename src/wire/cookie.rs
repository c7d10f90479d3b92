//! DNS Cookies (RFC 7873), with server cookies made as RFC 9018 says:
//! version 1, three reserved bytes, a 32-bit timestamp, and SipHash-2-4 of
//! (client cookie | version | reserved | timestamp | client IP) under a
//! 128-bit secret.
//!
//! A client that sends a client cookie gets a server cookie back; one that
//! sends a server cookie we made for its address in the last hour has proved
//! it receives our packets at that address, which a spoofed source cannot,
//! so response rate limiting lets it through. Replicas that share
//! `--cookie-secret` accept each other's cookies.

use std::net::IpAddr;

use siphasher::sip::SipHasher24;
use std::hash::Hasher;

/// Length of a client cookie.
pub const CLIENT_LEN: usize = 8;
/// Length of the server cookies we make (RFC 9018 §4).
pub const SERVER_LEN: usize = 16;
/// Longest COOKIE option data: client cookie + the longest server cookie.
pub const MAX_LEN: usize = 40;
/// Option code of COOKIE.
pub const CODE: u16 = 10;
/// RFC 9018 §4.3: a cookie from up to an hour ago is accepted...
const MAX_AGE: u32 = 3600;
/// ...and one up to five minutes in the future (clock skew between replicas).
const MAX_AHEAD: u32 = 300;
/// RFC 9018 §4.3: a server cookie older than half an hour is replaced.
const REFRESH_AFTER: u32 = 1800;

/// The COOKIE option as a client sent it: 8 bytes of client cookie and 0 or
/// 8 to 32 bytes of server cookie (other lengths are FORMERR: RFC 7873
/// §5.2.2, and never get this far).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientCookie {
    len: u8,
    bytes: [u8; MAX_LEN],
}

impl ClientCookie {
    /// Reads an option's data; `None` when its length is malformed.
    pub fn read(data: &[u8]) -> Option<Self> {
        if !(data.len() == CLIENT_LEN || (CLIENT_LEN + 8..=MAX_LEN).contains(&data.len())) {
            return None;
        }
        let mut bytes = [0; MAX_LEN];
        bytes.get_mut(..data.len())?.copy_from_slice(data);
        Some(Self { len: data.len() as u8, bytes })
    }

    /// The client cookie.
    pub fn client(&self) -> &[u8] {
        &self.bytes[..CLIENT_LEN]
    }

    /// The server cookie the client sent back (empty when none).
    pub fn server(&self) -> &[u8] {
        &self.bytes[CLIENT_LEN..usize::from(self.len)]
    }
}

/// The secret server cookies are made with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CookieSecret([u8; 16]);

impl std::fmt::Debug for CookieSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CookieSecret(..)")
    }
}

/// What a query's cookie proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No COOKIE option (or cookies are off).
    None,
    /// A client cookie only, or a server cookie that is not ours, not for
    /// this address, or too old: answered normally, with a fresh cookie.
    Fresh,
    /// A server cookie we made for this client and address, still valid.
    Valid,
}

impl CookieSecret {
    /// A secret from its 32 hex digits.
    pub fn from_hex(hex: &str) -> Result<Self, String> {
        let hex = hex.trim();
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("must be 32 hexadecimal digits (128 bits)".into());
        }
        let mut key = [0; 16];
        for (i, k) in key.iter_mut().enumerate() {
            *k = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        Ok(Self(key))
    }

    /// A secret from the operating system's random source.
    pub fn random() -> Result<Self, String> {
        let mut key = [0; 16];
        getrandom::fill(&mut key).map_err(|e| format!("no random secret: {e}"))?;
        Ok(Self(key))
    }

    fn hash(&self, client: &[u8], head: &[u8; 8], ip: Option<IpAddr>) -> [u8; 8] {
        let mut h = SipHasher24::new_with_key(&self.0);
        h.write(client);
        h.write(head);
        match ip {
            Some(IpAddr::V4(a)) => h.write(&a.octets()),
            Some(IpAddr::V6(a)) => h.write(&a.octets()),
            None => {}
        }
        h.finish().to_be_bytes()
    }

    /// Checks `cookie` from `ip` at `now` (seconds since the epoch, mod
    /// 2^32) and writes the server cookie to answer with into `reply`.
    pub fn check(
        &self,
        cookie: &ClientCookie,
        ip: Option<IpAddr>,
        now: u32,
        reply: &mut [u8; SERVER_LEN],
    ) -> Verdict {
        let sent = cookie.server();
        if sent.len() == SERVER_LEN && sent[0] == 1 {
            let head: [u8; 8] = [sent[0], sent[1], sent[2], sent[3], sent[4], sent[5], sent[6], sent[7]];
            let stamp = u32::from_be_bytes([sent[4], sent[5], sent[6], sent[7]]);
            // Serial-number arithmetic (RFC 1982), as RFC 9018 §4.3 asks.
            let age = now.wrapping_sub(stamp);
            let fresh_enough = age <= MAX_AGE || stamp.wrapping_sub(now) <= MAX_AHEAD;
            if fresh_enough && self.hash(cookie.client(), &head, ip) == sent[8..16] {
                if age <= REFRESH_AFTER || stamp.wrapping_sub(now) <= MAX_AHEAD {
                    reply.copy_from_slice(sent);
                } else {
                    self.make(cookie.client(), ip, now, reply);
                }
                return Verdict::Valid;
            }
        }
        self.make(cookie.client(), ip, now, reply);
        Verdict::Fresh
    }

    /// Writes a new server cookie for `client` at `ip`, stamped `now`.
    fn make(&self, client: &[u8], ip: Option<IpAddr>, now: u32, out: &mut [u8; SERVER_LEN]) {
        let s = now.to_be_bytes();
        let head = [1, 0, 0, 0, s[0], s[1], s[2], s[3]];
        out[..8].copy_from_slice(&head);
        out[8..].copy_from_slice(&self.hash(client, &head, ip));
    }
}

/// Seconds since the epoch, mod 2^32, as cookie timestamps count.
pub fn now() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> CookieSecret {
        CookieSecret::from_hex("000102030405060708090a0b0c0d0e0f").expect("hex")
    }

    #[test]
    fn only_rfc_7873_lengths_are_read() {
        for len in 0..=48 {
            let ok = len == 8 || (16..=40).contains(&len);
            assert_eq!(ClientCookie::read(&vec![7; len]).is_some(), ok, "{len} bytes");
        }
    }

    #[test]
    fn a_cookie_we_made_is_valid_for_its_client_and_address_only() {
        let s = secret();
        let ip: IpAddr = "198.51.100.7".parse().expect("ip");
        let client = ClientCookie::read(&[1, 2, 3, 4, 5, 6, 7, 8]).expect("client cookie");
        let mut server = [0; SERVER_LEN];
        assert_eq!(s.check(&client, Some(ip), 1_000_000, &mut server), Verdict::Fresh);
        assert_eq!(server[..4], [1, 0, 0, 0], "version 1, reserved zero");
        let back =
            ClientCookie::read(&[&[1, 2, 3, 4, 5, 6, 7, 8][..], &server].concat()).expect("full cookie");
        let mut reply = [0; SERVER_LEN];
        assert_eq!(s.check(&back, Some(ip), 1_000_010, &mut reply), Verdict::Valid);
        assert_eq!(reply, server, "a young cookie is echoed as it is");
        let other: IpAddr = "198.51.100.8".parse().expect("ip");
        assert_eq!(s.check(&back, Some(other), 1_000_010, &mut reply), Verdict::Fresh, "another address");
        assert_eq!(
            s.check(&back, Some(ip), 1_000_000 + 3601, &mut reply),
            Verdict::Fresh,
            "over an hour old"
        );
        assert_eq!(s.check(&back, Some(ip), 1_000_000 + 2000, &mut reply), Verdict::Valid, "still valid");
        assert_ne!(reply, server, "but renewed after half an hour");
        let other_secret = CookieSecret::from_hex("ff0102030405060708090a0b0c0d0e0f").expect("hex");
        assert_eq!(other_secret.check(&back, Some(ip), 1_000_010, &mut reply), Verdict::Fresh);
        assert!(CookieSecret::from_hex("abc").is_err());
        assert!(CookieSecret::from_hex("zz0102030405060708090a0b0c0d0e0f").is_err());
    }
}
