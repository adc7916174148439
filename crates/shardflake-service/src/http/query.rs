//! The query string and the options it carries. Parsed by hand so every bad
//! input is an [`IssueError`] with its own code, never silently ignored.

use shardflake::Format;

use crate::error::IssueError;

/// The query parameters a route accepts, each at most once. Values stay
/// text here so each gets its own error code when read.
#[derive(Debug, Default)]
pub(super) struct Query {
    pub(super) count: Option<String>,
    pub(super) numbers: Option<String>,
    pub(super) format: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) key: Option<String>,
    pub(super) from: Option<String>,
    pub(super) to: Option<String>,
}

impl Query {
    /// Parses `raw`, refusing a key `allowed` does not list and a key given
    /// twice.
    pub(super) fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Query, IssueError> {
        let Some(raw) = raw else {
            return Ok(Query::default());
        };
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw)
            .map_err(|e| IssueError::InvalidParameter(e.to_string()))?;
        let mut q = Query::default();
        for (name, value) in pairs {
            let slot = match name.as_str() {
                _ if !allowed.contains(&name.as_str()) => None,
                "count" => Some(&mut q.count),
                "numbers" => Some(&mut q.numbers),
                "format" => Some(&mut q.format),
                "kind" => Some(&mut q.kind),
                "key" => Some(&mut q.key),
                "from" => Some(&mut q.from),
                "to" => Some(&mut q.to),
                _ => None,
            };
            let Some(slot) = slot else {
                return Err(IssueError::InvalidParameter(format!(
                    "unknown parameter `{name}` on this route; expected one of {allowed:?}"
                )));
            };
            if slot.replace(value).is_some() {
                return Err(IssueError::InvalidParameter(format!(
                    "parameter `{name}` is given twice; give it once"
                )));
            }
        }
        Ok(q)
    }

    /// `numbers`: `true`/`1` or `false`/`0`. An empty value is refused, not
    /// read as true: the document declares a boolean, and `numbers=` is
    /// none.
    pub(super) fn numbers(&self) -> Result<bool, IssueError> {
        match self.numbers.as_deref() {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(IssueError::InvalidParameter(format!(
                "numbers must be true or false, got {other:?}"
            ))),
        }
    }

    pub(super) fn format(&self) -> Result<Option<Format>, IssueError> {
        parse_format(self.format.as_deref())
    }

    /// `numbers` and `format`, which cannot both be asked for.
    pub(super) fn output(&self) -> Result<(bool, Option<Format>), IssueError> {
        output(self.numbers()?, self.format()?)
    }
}

/// `format`: dec (the default) or another text form.
pub(super) fn parse_format(text: Option<&str>) -> Result<Option<Format>, IssueError> {
    match text {
        None | Some("dec") => Ok(None),
        Some(f) => f
            .parse()
            .map(Some)
            .map_err(|_| IssueError::unknown_format(f)),
    }
}

/// JSON numbers are decimal: a text form cannot be asked for with them.
pub(super) fn output(
    numbers: bool,
    format: Option<Format>,
) -> Result<(bool, Option<Format>), IssueError> {
    if numbers && format.is_some() {
        return Err(IssueError::InvalidParameter(
            "numbers=true writes ids as JSON numbers, format as strings: ask for one".into(),
        ));
    }
    Ok((numbers, format))
}

/// A whole number written in ASCII digits only (no sign, space or point).
pub(super) fn parse_digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A count in `1..=max`, written in digits.
pub(super) fn parse_count(text: &str, max: u64) -> Result<u64, IssueError> {
    match parse_digits(text) {
        Some(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(IssueError::InvalidCount {
            text: text.to_string(),
            max,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;

    #[test]
    fn query_parsing() {
        let ids = &["count", "numbers", "format"];
        let q = Query::parse(Some("count=5&numbers=true"), ids).unwrap();
        assert_eq!(q.count.as_deref(), Some("5"));
        assert!(q.numbers().unwrap());
        let key = Query::parse(Some("key=a%20b+c"), &["key"]).unwrap();
        assert_eq!(key.key.as_deref(), Some("a b c"));
        assert_eq!(parse_count("5", 10).unwrap(), 5);
        for bad in [
            "0",
            "-1",
            "x",
            "11",
            "",
            "1.5",
            "+5",
            " 5",
            "5 ",
            "99999999999999999999999",
        ] {
            assert_eq!(
                parse_count(bad, 10).unwrap_err().code(),
                "invalid_count",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn query_refuses_what_it_would_ignore() {
        let ids = &["count", "numbers", "format"];
        let refused = |raw: &str, allowed: &[&str]| {
            let e = ApiError::from(
                Query::parse(Some(raw), allowed)
                    .and_then(|q| q.output())
                    .unwrap_err(),
            );
            (e.status, e.code)
        };
        for raw in [
            "count=5&count=999999",
            "count=5&bogus=1",
            "count=5&key=3",
            "count=5&numbers=bogus",
            "count=5&numbers=true&format=hex",
            "count=5&format=octal",
        ] {
            assert_eq!(refused(raw, ids), (400, "invalid_parameter"), "{raw}");
        }
        assert_eq!(
            refused("format=hex&format=dec", &["format"]),
            (400, "invalid_parameter")
        );
    }

    /// One wording for a parameter the route does not take, whether or not
    /// another route takes it (issue 30: serde's "unknown field" was the
    /// other), and one for a repeated one.
    #[test]
    fn one_wording_for_an_unknown_or_repeated_parameter() {
        for raw in ["bogus=1", "key=3"] {
            let e = Query::parse(Some(raw), &["count"]).unwrap_err();
            assert!(
                e.to_string().starts_with("unknown parameter `"),
                "{raw}: {e}"
            );
        }
        let e = Query::parse(Some("count=1&count=2"), &["count"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parameter `count` is given twice; give it once"
        );
    }
}
