//! Event digests: what lets a client tell "the same event again" from "another event with the
//! same id".

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// SHA-256 over `"{id}:"` followed by the event's data bytes (seed 000's definition).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of the event with `id` and `data`.
    pub fn of(id: &str, data: &[u8]) -> Digest {
        let mut hasher = Sha256::new();
        hasher.update(id.as_bytes());
        hasher.update(b":");
        hasher.update(data);
        Digest(hasher.finalize().into())
    }
}

impl fmt::Display for Digest {
    /// Lowercase hex, written at once: a digest is shown with every request the server records,
    /// and formatting it a byte at a time cost more than computing it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 64];
        for (pair, byte) in hex.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

/// The text is not 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("digest must be 64 lowercase hex digits")]
pub struct DigestParseError;

impl FromStr for Digest {
    type Err = DigestParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s.as_bytes();
        if hex.len() != 64 {
            return Err(DigestParseError);
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(DigestParseError),
        };
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Ok(Digest(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_seed_definition() {
        // hashlib.sha256(f"{event_id}:".encode() + payload).hexdigest(), as seed 000 computes it.
        assert_eq!(
            Digest::of("1041", b"{}").to_string(),
            "5a528e450dd366df5129548f4407c753aa484c65e84e0685d9f05976511068c9"
        );
        assert_eq!(
            Digest::of("ab", b"c").to_string(),
            "5f1390ea338444eb27117a13b752b992b7bd2a67a92fc027cb64abec2cffbdea"
        );
    }

    #[test]
    fn depends_on_id_and_data() {
        let d = Digest::of("1", b"x");
        assert_ne!(d, Digest::of("2", b"x"));
        assert_ne!(d, Digest::of("1", b"y"));
        // The separator keeps "1" + "2x" apart from "12" + "x".
        assert_ne!(Digest::of("1", b"2x"), Digest::of("12", b"x"));
    }

    #[test]
    fn hex_round_trips() {
        let d = Digest::of("e:s:1", b"{}");
        let text = d.to_string();
        assert_eq!(text.len(), 64);
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_eq!(text.parse::<Digest>(), Ok(d));
        assert!("ABC".parse::<Digest>().is_err());
        assert!(text.to_uppercase().parse::<Digest>().is_err());
    }
}
