//! Standard base64 (RFC 4648, `+` and `/`, `=` padding), decoding only: the
//! memory images of v2 traces.

/// Why a base64 text does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    /// A character outside the alphabet (or padding in the middle).
    #[error("character {found:?} at {at} is not base64")]
    BadCharacter {
        /// Offset in the text.
        at: usize,
        /// The character found.
        found: char,
    },
    /// The text's length is not a multiple of four.
    #[error("length {0} is not a multiple of 4")]
    BadLength(usize),
}

fn value(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// The bytes `text` encodes.
pub fn decode(text: &str) -> Result<Vec<u8>, Base64Error> {
    let bytes = text.as_bytes();
    if bytes.len() % 4 != 0 {
        return Err(Base64Error::BadLength(bytes.len()));
    }
    let padding = bytes
        .iter()
        .rev()
        .take(2)
        .take_while(|&&c| c == b'=')
        .count();
    let body = bytes.len() - padding;
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for (at, &c) in bytes[..body].iter().enumerate() {
        let v = value(c).ok_or(Base64Error::BadCharacter {
            at,
            found: char::from(c),
        })?;
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_rfc_examples() {
        for (text, plain) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(decode(text).unwrap(), plain.as_bytes(), "{text}");
        }
        assert_eq!(decode("/+8A").unwrap(), [0xff, 0xef, 0x00]);
    }

    #[test]
    fn refuses_what_is_not_base64() {
        assert_eq!(decode("Zm9"), Err(Base64Error::BadLength(3)));
        assert_eq!(
            decode("Zm=v"),
            Err(Base64Error::BadCharacter { at: 2, found: '=' })
        );
        assert_eq!(
            decode("Zm9v Zg="),
            Err(Base64Error::BadCharacter { at: 4, found: ' ' })
        );
    }
}
