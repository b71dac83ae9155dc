//! Bytes as JSON text, for `#[serde(with = "tower_store_support::bytes_text")]`
//! on a [`Bytes`] field.
//!
//! Writes `{"utf8": "…"}` when the bytes are UTF-8 (most bodies and headers,
//! readable as stored), else `{"hex": "…"}` in lowercase. Reads either form,
//! hex in either case, exact for any bytes; it refuses an odd number of hex
//! digits or anything but a hex digit (a sign, a multi-byte character) with
//! a decoding error, never a panic.
//!
//! ```
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Stored {
//!     #[serde(with = "tower_store_support::bytes_text")]
//!     body: bytes::Bytes,
//! }
//! let json = serde_json::to_string(&Stored { body: "{}".into() }).unwrap();
//! assert_eq!(json, r#"{"body":{"utf8":"{}"}}"#);
//! let raw = Stored { body: bytes::Bytes::from_static(&[0xff, 0x00]) };
//! assert_eq!(serde_json::to_string(&raw).unwrap(), r#"{"body":{"hex":"ff00"}}"#);
//! ```

use bytes::Bytes;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Borrowed to write, owned to read.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Stored<S> {
    Utf8(S),
    Hex(String),
}

/// Writes `bytes` as `{"utf8": …}` or `{"hex": …}`.
pub fn serialize<S: Serializer>(bytes: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Stored::Utf8(text),
        Err(_) => {
            let mut hex = String::with_capacity(bytes.len() * 2);
            push_hex(&mut hex, bytes);
            Stored::Hex(hex)
        }
    }
    .serialize(serializer)
}

/// Reads what [`serialize`] writes.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
    let hex = match Stored::<String>::deserialize(deserializer)? {
        Stored::Utf8(text) => return Ok(Bytes::from(text)),
        Stored::Hex(hex) => hex,
    };
    if hex.len() % 2 != 0 {
        return Err(D::Error::custom("odd number of hex digits"));
    }
    unhex(&hex)
        .map(Bytes::from)
        .ok_or_else(|| D::Error::custom("a hex body holds a non-hex digit"))
}

/// Appends `bytes` to `text` in lowercase hex, as [`serialize`] writes them.
pub fn push_hex(text: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
}

/// The bytes `hex` spells, two hex digits each in either case; `None` if it
/// spells none (an odd length, a sign, any other character).
pub fn unhex(hex: &str) -> Option<Vec<u8>> {
    // Digit by digit on bytes: a multi-byte character or a sign (`+f`) is
    // refused, where slicing pairs of a `str` could panic and
    // `from_str_radix` would take the sign.
    let digit = |d: u8| char::from(d).to_digit(16);
    hex.as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [high, low] => Some((digit(*high)? << 4 | digit(*low)?) as u8),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Stored {
        #[serde(with = "super")]
        body: Bytes,
    }

    fn decode(json: &str) -> Result<Bytes, String> {
        serde_json::from_str::<Stored>(json)
            .map(|s| s.body)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn utf8_is_text_and_anything_else_is_lowercase_hex() {
        for (body, json) in [
            (&b"caf\xc3\xa9"[..], r#"{"body":{"utf8":"café"}}"#),
            (&b""[..], r#"{"body":{"utf8":""}}"#),
            (&[0xff, 0x00, 0xab][..], r#"{"body":{"hex":"ff00ab"}}"#),
        ] {
            let stored = Stored {
                body: Bytes::copy_from_slice(body),
            };
            assert_eq!(serde_json::to_string(&stored).unwrap(), json);
            assert_eq!(decode(json).unwrap(), body);
        }
        assert_eq!(
            decode(r#"{"body":{"hex":"FFab"}}"#).unwrap(),
            &[0xff, 0xab][..]
        );
    }

    #[test]
    fn bad_hex_is_refused_with_its_reason() {
        let odd = decode(r#"{"body":{"hex":"fff"}}"#).unwrap_err();
        assert!(odd.contains("odd number of hex digits"), "{odd}");
        for bad in ["ff001é0", "é", "aéb", "+f", "-1", "  ", "0x"] {
            let error = decode(&format!(r#"{{"body":{{"hex":"{bad}"}}}}"#)).unwrap_err();
            let expected = if bad.len() % 2 == 0 {
                "a hex body holds a non-hex digit"
            } else {
                "odd number of hex digits"
            };
            assert!(error.contains(expected), "{bad:?}: {error}");
        }
    }
}
