//! Parsing the text forms of [`crate::format`]: [`Format::parse`],
//! [`Format::detect`], [`Id::parse_as`] and `FromStr for Id`.
//!
//! - decimal: unsigned, or negative as a signed `bigint` prints an id that
//!   uses the sign bit (Instagram's after 2046);
//! - hex: up to 16 digits, any case, optional `0x`;
//! - base32: Crockford, any case, `I`/`L` read as 1 and `O` as 0, hyphens ignored;
//! - base62: up to 11 characters of `0-9A-Za-z`.

use std::str::FromStr;

use crate::error::ParseError;
use crate::format::{BASE32, BASE62, Format};
use crate::id::Id;

impl Format {
    /// Parses text in this form (see [`Format`] for what is accepted).
    pub fn parse(self, text: &str) -> Result<Id, ParseError> {
        parse(self, text)
    }

    /// The form text of unknown origin is most likely in, by its shape;
    /// [`Format::Dec`] when nothing else fits (so its error speaks of
    /// decimal). Each fixed-width form has its own width (hex 16, base32 13,
    /// base62 11), so only text of digits alone is ambiguous: it is read as
    /// decimal, as [`Display`](std::fmt::Display) writes it, unless it has a
    /// leading zero (which decimal never writes) and a fixed form's width.
    ///
    /// ```
    /// use shardflake::{Format, Id};
    /// let id = Id(454_947_766_275_222_906);
    /// for f in Format::ALL {
    ///     assert_eq!(Format::detect(&f.format(id)), f);
    /// }
    /// assert_eq!(Format::detect("0xff"), Format::Hex);
    /// assert_eq!(Format::detect("-679477248"), Format::Dec);
    /// assert_eq!(Format::detect("12345678901"), Format::Dec); // digits: decimal
    /// ```
    pub fn detect(text: &str) -> Format {
        detect(text)
    }
}

impl Id {
    /// Reads an id in a text [`Format`]. Lenient where the form allows
    /// (surrounding spaces, `0x`, any case, Crockford's `I`/`L`/`O` and
    /// hyphens, a negative decimal as a `BIGINT` prints a sign-bit id); see
    /// [`Format`]. Text of unknown form: `Id::parse_as(t, Format::detect(t))`.
    ///
    /// ```
    /// use shardflake::{Format, Id, ParseError};
    /// let id = Id(454_947_766_275_222_906);
    /// for f in Format::ALL {
    ///     assert_eq!(Id::parse_as(&id.format_as(f), f)?, id);
    /// }
    /// assert_eq!(Id::parse_as("0xFF", Format::Hex)?, Id(255));
    /// assert_eq!(Id::parse_as("-1", Format::Dec)?, Id(u64::MAX));
    /// assert!(matches!(Id::parse_as("0XbfGYCuLK!", Format::Base62), Err(ParseError::InvalidChar { ch: '!', .. })));
    /// # Ok::<(), ParseError>(())
    /// ```
    pub fn parse_as(text: &str, format: Format) -> Result<Id, ParseError> {
        format.parse(text)
    }
}

/// The decimal [`Display`](std::fmt::Display) writes, strictly: 1 to 20 ASCII
/// digits (leading zeros allowed) up to `u64::MAX`. No sign, no spaces, no
/// other form; for those use [`Id::parse_as`].
///
/// ```
/// use shardflake::{Id, ParseError};
/// let id: Id = "454947766275222906".parse()?;
/// assert_eq!(id, Id(454_947_766_275_222_906));
/// assert_eq!(id.to_string().parse::<Id>()?, id);
/// assert_eq!("".parse::<Id>(), Err(ParseError::Empty));
/// assert!(matches!(" 1".parse::<Id>(), Err(ParseError::InvalidChar { ch: ' ', .. })));
/// assert!(matches!("-1".parse::<Id>(), Err(ParseError::InvalidChar { ch: '-', .. })));
/// assert!(matches!("18446744073709551616".parse::<Id>(), Err(ParseError::Overflow { .. })));
/// # Ok::<(), ParseError>(())
/// ```
impl FromStr for Id {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        dec_strict(s)
    }
}

fn parse(format: Format, text: &str) -> Result<Id, ParseError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ParseError::Empty);
    }
    match format {
        Format::Dec => dec(text),
        Format::Hex => {
            let digits = text
                .strip_prefix("0x")
                .or_else(|| text.strip_prefix("0X"))
                .unwrap_or(text);
            radix(format, text, digits.chars(), 16, hex_digit)
        }
        Format::Base32 => radix(
            format,
            text,
            text.chars().filter(|c| *c != '-'),
            32,
            crockford_digit,
        ),
        Format::Base62 => radix(format, text, text.chars(), 62, base62_digit),
    }
}

/// `FromStr for Id`: exactly what `Display` writes (ASCII digits, leading
/// zeros allowed); no sign, no spaces.
fn dec_strict(text: &str) -> Result<Id, ParseError> {
    if text.is_empty() {
        return Err(ParseError::Empty);
    }
    if let Some(ch) = text.chars().find(|c| !c.is_ascii_digit()) {
        return Err(ParseError::InvalidChar {
            format: "dec",
            input: text.to_string(),
            ch,
        });
    }
    text.parse::<u64>()
        .map(Id)
        .map_err(|_| ParseError::Overflow {
            format: "dec",
            input: text.to_string(),
        })
}

/// The form text is most likely in; see [`Format::detect`].
fn detect(text: &str) -> Format {
    let t = text.trim();
    let unsigned = t.strip_prefix('-').unwrap_or(t);
    let digits = !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit());
    // `Display` never writes a leading zero, so digits with one, at a fixed
    // width, are that fixed-width form.
    let padded = t.len() > 1 && t.starts_with('0');
    if digits && !(padded && matches!(t.len(), 11 | 13 | 16)) {
        return Format::Dec;
    }
    let unhyphenated = t.bytes().filter(|b| *b != b'-').count();
    if t.len() == 16 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
        Format::Hex
    } else if unhyphenated == 13 && t.chars().all(|c| c == '-' || crockford_digit(c).is_some()) {
        Format::Base32
    } else if t.len() == 11 && t.bytes().all(|b| b.is_ascii_alphanumeric()) {
        // Before `0x`: base62 and base32 text may start with `0x`/`0X` too.
        Format::Base62
    } else if t.starts_with("0x") || t.starts_with("0X") {
        Format::Hex
    } else {
        Format::Dec
    }
}

fn dec(text: &str) -> Result<Id, ParseError> {
    let bad = |ch| ParseError::InvalidChar {
        format: "dec",
        input: text.to_string(),
        ch,
    };
    let digits = text.strip_prefix('-').unwrap_or(text);
    if let Some(ch) = digits.chars().find(|c| !c.is_ascii_digit()) {
        return Err(bad(ch));
    }
    if digits.is_empty() {
        return Err(ParseError::Empty);
    }
    let overflow = || ParseError::Overflow {
        format: "dec",
        input: text.to_string(),
    };
    if text.starts_with('-') {
        text.parse::<i64>()
            .map(|v| Id(v as u64))
            .map_err(|_| overflow())
    } else {
        text.parse::<u64>().map(Id).map_err(|_| overflow())
    }
}

fn radix(
    format: Format,
    input: &str,
    digits: impl Iterator<Item = char>,
    base: u64,
    digit: fn(char) -> Option<u64>,
) -> Result<Id, ParseError> {
    let mut value: u64 = 0;
    let mut any = false;
    for ch in digits {
        let d = digit(ch).ok_or_else(|| ParseError::InvalidChar {
            format: format.name(),
            input: input.to_string(),
            ch,
        })?;
        value = value
            .checked_mul(base)
            .and_then(|v| v.checked_add(d))
            .ok_or_else(|| ParseError::Overflow {
                format: format.name(),
                input: input.to_string(),
            })?;
        any = true;
    }
    if !any {
        return Err(ParseError::Empty);
    }
    Ok(Id(value))
}

fn hex_digit(c: char) -> Option<u64> {
    c.to_digit(16).map(u64::from)
}

fn crockford_digit(c: char) -> Option<u64> {
    let c = match c.to_ascii_uppercase() {
        'I' | 'L' => '1',
        'O' => '0',
        'U' => return None,
        c => c,
    };
    BASE32
        .iter()
        .position(|&b| b as char == c)
        .map(|p| p as u64)
}

fn base62_digit(c: char) -> Option<u64> {
    BASE62
        .iter()
        .position(|&b| b as char == c)
        .map(|p| p as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_variants() {
        assert_eq!(
            Format::Dec.parse("-679477248"),
            Ok(Id((-679_477_248i64) as u64))
        );
        assert_eq!(Format::Hex.parse("0xFF"), Ok(Id(255)));
        assert_eq!(Format::Base32.parse("0o-il"), Ok(Id(33)));
        assert_eq!(Format::Base62.parse("z"), Ok(Id(61)));
    }

    #[test]
    fn rejects_with_typed_errors() {
        assert_eq!(Format::Dec.parse(""), Err(ParseError::Empty));
        assert_eq!(Format::Dec.parse("-"), Err(ParseError::Empty));
        assert!(matches!(
            Format::Dec.parse("12a"),
            Err(ParseError::InvalidChar { ch: 'a', .. })
        ));
        assert!(matches!(
            Format::Dec.parse("18446744073709551616"),
            Err(ParseError::Overflow { .. })
        ));
        assert!(matches!(
            Format::Hex.parse("1ffffffffffffffff"),
            Err(ParseError::Overflow { .. })
        ));
        assert!(matches!(
            Format::Base32.parse("U"),
            Err(ParseError::InvalidChar { ch: 'U', .. })
        ));
        assert!(matches!(
            Format::Base32.parse("G0000000000000"),
            Err(ParseError::Overflow { .. })
        ));
        assert!(matches!(
            Format::Base62.parse("LygHa16AHYG"),
            Err(ParseError::Overflow { .. })
        ));
        assert!(matches!(
            Format::Base62.parse("a-b"),
            Err(ParseError::InvalidChar { ch: '-', .. })
        ));
        assert!(matches!(
            "json".parse::<Format>(),
            Err(ParseError::UnknownFormat(_))
        ));
    }
}
