//! Standard base64 (RFC 4648, `+` and `/`, `=` padding): the memory images
//! of v2 and v3 traces, decoded when a trace is read and encoded when
//! kvgeom records one.

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

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` as padded base64 text.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
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

/// A trace's `memory` section: how its images are encoded, and the images
/// in the shape the trace's format gives them.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EncodedMemory<Image> {
    encoding: String,
    images: Vec<Image>,
}

impl<Image> EncodedMemory<Image> {
    /// The images, whose texts are base64.
    pub(crate) fn base64_images(self) -> Result<Vec<Image>, UnknownEncoding> {
        if self.encoding == "base64" {
            Ok(self.images)
        } else {
            Err(UnknownEncoding(self.encoding))
        }
    }
}

/// A memory section in an encoding other than base64: the encoding it names.
#[derive(Debug, thiserror::Error)]
#[error("memory encoding `{0}` is not base64")]
pub(crate) struct UnknownEncoding(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_what_it_decodes() {
        for plain in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0, 255, 7],
        ] {
            assert_eq!(decode(&encode(plain)).as_deref(), Ok(plain), "{plain:?}");
        }
        assert_eq!(encode(b"foob"), "Zm9vYg==");
    }

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
