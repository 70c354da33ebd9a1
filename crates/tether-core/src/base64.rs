//! Base64 (RFC 4648): the url-safe alphabet without padding for tether's own ids and sealed
//! states, the standard alphabet with padding for SEP-2243's `=?base64?…?=` header values.

/// Which of RFC 4648's encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `A-Z a-z 0-9 - _`, no padding (RFC 4648 §5): ids, request states.
    UrlUnpadded,
    /// `A-Z a-z 0-9 + /`, padded with `=` to groups of 4 (RFC 4648 §4): header values.
    StandardPadded,
}

impl Encoding {
    fn alphabet(self) -> &'static [u8; 64] {
        match self {
            Encoding::UrlUnpadded => {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
            }
            Encoding::StandardPadded => {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
            }
        }
    }

    fn padded(self) -> bool {
        self == Encoding::StandardPadded
    }
}

/// Appends `bytes` to `out` in `encoding`.
pub fn push(out: &mut String, bytes: &[u8], encoding: Encoding) {
    let alphabet = encoding.alphabet();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(alphabet[((n >> (18 - 6 * i)) & 63) as usize]));
        }
        if encoding.padded() {
            (chunk.len()..3).for_each(|_| out.push('='));
        }
    }
}

/// `bytes` in `encoding`.
pub fn encode(bytes: &[u8], encoding: Encoding) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    push(&mut out, bytes, encoding);
    out
}

/// The bytes `text` encodes, if it is `encoding` exactly: its alphabet only, and in the padded
/// encoding groups of 4 with `=` only at the end; unpadded, no `=` at all.
pub fn decode(text: &str, encoding: Encoding) -> Option<Vec<u8>> {
    let alphabet = encoding.alphabet();
    let digit = |c: u8| alphabet.iter().position(|&a| a == c).map(|d| d as u32);
    let data = if encoding.padded() {
        if !text.len().is_multiple_of(4) {
            return None;
        }
        let pad = text.bytes().rev().take_while(|&c| c == b'=').count();
        if pad > 2 {
            return None;
        }
        &text.as_bytes()[..text.len() - pad]
    } else {
        text.as_bytes()
    };
    if data.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() * 3 / 4);
    for group in data.chunks(4) {
        let mut n = 0u32;
        for &c in group {
            n = (n << 6) | digit(c)?;
        }
        n <<= 6 * (4 - group.len()) as u32;
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&decoded[..group.len() - 1]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_encodings_match_rfc_4648_and_round_trip() {
        let vectors = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
        ];
        for (plain, url) in vectors {
            assert_eq!(encode(plain.as_bytes(), Encoding::UrlUnpadded), url);
            let standard = format!("{url}{}", "=".repeat((4 - url.len() % 4) % 4));
            assert_eq!(encode(plain.as_bytes(), Encoding::StandardPadded), standard);
            assert_eq!(
                decode(url, Encoding::UrlUnpadded).as_deref(),
                Some(plain.as_bytes())
            );
            assert_eq!(
                decode(&standard, Encoding::StandardPadded).as_deref(),
                Some(plain.as_bytes())
            );
        }
        assert_eq!(encode(&[0xfb, 0xff], Encoding::UrlUnpadded), "-_8");
        assert_eq!(encode(&[0xfb, 0xff], Encoding::StandardPadded), "+/8=");
    }

    #[test]
    fn decoding_is_strict() {
        for bad in ["Zg", "Zg=", "Z===", "Zg==Zg==", "Zm9v!A==", "-_8="] {
            assert_eq!(decode(bad, Encoding::StandardPadded), None, "{bad:?}");
        }
        for bad in ["Zg==", "Z", "Zm9v+", "Zm 9"] {
            assert_eq!(decode(bad, Encoding::UrlUnpadded), None, "{bad:?}");
        }
    }
}
