//! Text forms of a 64-bit id: decimal (default), hex, Crockford base32 and
//! a sortable base62.
//!
//! Hex (16 digits), base32 (13 characters, Crockford's alphabet,
//! <https://www.crockford.com/base32.html>) and base62 (11 characters,
//! `0-9A-Za-z` in ASCII order) are fixed width, so sorting the text sorts the
//! ids. Decimal has no padding and sorts only as a number.

use std::fmt;
use std::str::FromStr;

use crate::error::ParseError;
use crate::id::Id;

/// A text form of an id.
///
/// [`Format::format`] writes the forms shown on each variant;
/// [`Format::parse`] reads them back, and is lenient where a form allows:
///
/// - surrounding whitespace is ignored in every form;
/// - decimal: unsigned, or negative as a signed `BIGINT` prints an id that
///   uses the sign bit (Instagram's after 2046), read two's complement;
/// - hex: up to 16 digits, any case, optional `0x`;
/// - base32: Crockford, any case, `I`/`L` read as 1 and `O` as 0, hyphens
///   ignored;
/// - base62: up to 11 characters of `0-9A-Za-z` (case matters).
///
/// Text that is not an id in the form is a [`ParseError`]; nothing panics.
/// The same calls are on [`Id`]: [`Id::format_as`] and [`Id::parse_as`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// `454947766275222906` (the Snowflake vector in all four forms)
    #[default]
    Dec,
    /// `06504c9540312d7a` (16 digits)
    Hex,
    /// `0CM2CJN032BBT` (13 characters, Crockford)
    Base32,
    /// `0XbfGYCuLKE` (11 characters, sortable)
    Base62,
}

/// Crockford's alphabet: no I, L, O or U.
pub(crate) const BASE32: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// Digits, then upper case, then lower case: ASCII order, so text sorts as numbers.
pub(crate) const BASE62: &[u8; 62] =
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

impl Format {
    /// Every format, for listings.
    pub const ALL: [Format; 4] = [Format::Dec, Format::Hex, Format::Base32, Format::Base62];

    /// The format's name: `dec`, `hex`, `base32` or `base62`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Dec => "dec",
            Format::Hex => "hex",
            Format::Base32 => "base32",
            Format::Base62 => "base62",
        }
    }

    /// Whether sorting the text sorts the ids.
    pub fn preserves_order(self) -> bool {
        self != Format::Dec
    }

    /// The id in this form.
    ///
    /// ```
    /// use shardflake::{Format, Id};
    /// let id = Id(454_947_766_275_222_906);
    /// for f in Format::ALL {
    ///     assert_eq!(f.parse(&f.format(id))?, id);
    /// }
    /// # Ok::<(), shardflake::ParseError>(())
    /// ```
    pub fn format(self, id: Id) -> String {
        let v = id.get();
        match self {
            Format::Dec => v.to_string(),
            Format::Hex => format!("{v:016x}"),
            Format::Base32 => fixed_width(v, BASE32, 13),
            Format::Base62 => fixed_width(v, BASE62, 11),
        }
    }
}

impl Id {
    /// The id in a text [`Format`]; [`Id::parse_as`] reads it back.
    ///
    /// ```
    /// use shardflake::{Format, Id};
    /// let id = Id(454_947_766_275_222_906);
    /// assert_eq!(id.format_as(Format::Dec), "454947766275222906");
    /// assert_eq!(id.format_as(Format::Hex), "06504c9540312d7a");
    /// assert_eq!(id.format_as(Format::Base32), "0CM2CJN032BBT");
    /// assert_eq!(id.format_as(Format::Base62), "0XbfGYCuLKE");
    /// ```
    pub fn format_as(self, format: Format) -> String {
        format.format(self)
    }
}

fn fixed_width(mut v: u64, alphabet: &[u8], width: usize) -> String {
    let base = alphabet.len() as u64;
    let mut out = vec![b'0'; width];
    for slot in out.iter_mut().rev() {
        *slot = alphabet[(v % base) as usize];
        v /= base;
    }
    // Alphabets are ASCII.
    String::from_utf8(out).unwrap_or_default()
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "dec" | "decimal" => Ok(Format::Dec),
            "hex" => Ok(Format::Hex),
            "base32" | "crockford" => Ok(Format::Base32),
            "base62" => Ok(Format::Base62),
            _ => Err(ParseError::UnknownFormat(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extremes_have_fixed_width() {
        for f in [Format::Hex, Format::Base32, Format::Base62] {
            let lo = f.format(Id(0));
            let hi = f.format(Id(u64::MAX));
            assert_eq!(lo.len(), hi.len(), "{f}");
            assert!(lo < hi);
            assert_eq!(f.parse(&hi), Ok(Id(u64::MAX)));
        }
        assert_eq!(Format::Base32.format(Id(u64::MAX)), "FZZZZZZZZZZZZ");
        assert_eq!(Format::Base62.format(Id(u64::MAX)), "LygHa16AHYF");
    }

    #[test]
    fn snowflake_vector_in_every_form() {
        let id = Id(454_947_766_275_222_906);
        let forms = [
            (Format::Dec, "454947766275222906"),
            (Format::Hex, "06504c9540312d7a"),
            (Format::Base32, "0CM2CJN032BBT"),
            (Format::Base62, "0XbfGYCuLKE"),
        ];
        for (f, text) in forms {
            assert_eq!(f.format(id), text, "{f}");
            assert_eq!(f.parse(text), Ok(id), "{f}");
        }
    }
}
