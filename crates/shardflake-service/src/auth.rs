//! The API's optional bearer token (`api_token_file`): when set, every id,
//! decode and info call must carry `Authorization: Bearer <token>` (gRPC:
//! the `authorization` metadata). Health, readiness, metrics and the
//! OpenAPI document stay open, so probes and scrapers need no secret.
//!
//! The token lives in a file, not on the command line, so it never shows in
//! the process list. It is compared in constant time. Each transport maps an
//! [`Unauthorized`] once: HTTP 401 with code `unauthorized` (`http.rs`), gRPC
//! `Unauthenticated` (`grpc.rs`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use subtle::ConstantTimeEq;

/// The token the API requires. Its `Debug` never shows it.
#[derive(Clone)]
pub struct ApiToken(Arc<[u8]>);

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiToken(<redacted>)")
    }
}

/// A token file that gives no usable token.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file could not be read.
    #[error("reading API token file {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The read failure (missing file, permissions).
        error: std::io::Error,
    },
    /// Empty, or more than one word of visible ASCII.
    #[error(
        "API token file {}: write the token as one line of visible ASCII, without spaces",
        path.display()
    )]
    Malformed {
        /// The file.
        path: PathBuf,
    },
}

impl ApiToken {
    /// A token from its text: visible ASCII, no spaces (what a header
    /// value carries unchanged). `None` for anything else.
    pub fn new(text: &str) -> Option<ApiToken> {
        let ok = !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic());
        ok.then(|| ApiToken(text.as_bytes().into()))
    }

    /// Reads the token from `path`; surrounding whitespace (a trailing
    /// newline) is not part of it.
    pub fn read(path: &Path) -> Result<ApiToken, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|error| TokenFileError::Read {
            path: path.to_owned(),
            error,
        })?;
        ApiToken::new(text.trim()).ok_or_else(|| TokenFileError::Malformed {
            path: path.to_owned(),
        })
    }

    /// Checks an `Authorization` header value: scheme `Bearer` (any case),
    /// then this token.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), Unauthorized> {
        let value = authorization.ok_or(Unauthorized::Missing)?;
        let text = std::str::from_utf8(value).map_err(|_| Unauthorized::NotBearer)?;
        let (scheme, token) = text.trim().split_once(' ').ok_or(Unauthorized::NotBearer)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Unauthorized::NotBearer);
        }
        if bool::from(token.trim().as_bytes().ct_eq(&self.0)) {
            Ok(())
        } else {
            Err(Unauthorized::WrongToken)
        }
    }
}

/// A call without the right bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthorized {
    /// No `Authorization` header (metadata).
    #[error("this API requires `Authorization: Bearer <token>`")]
    Missing,
    /// An `Authorization` that is not `Bearer <token>`.
    #[error("authorization must be `Bearer <token>`")]
    NotBearer,
    /// A token other than the configured one.
    #[error("the bearer token is not the one this server accepts")]
    WrongToken,
}

impl Unauthorized {
    /// The stable code clients see.
    pub fn code(&self) -> &'static str {
        crate::error::Code::Unauthorized.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_the_bearer_token() {
        let t = ApiToken::new("s3cret-token").unwrap();
        assert_eq!(t.check(Some(b"Bearer s3cret-token")), Ok(()));
        assert_eq!(t.check(Some(b"bearer s3cret-token")), Ok(()));
        assert_eq!(t.check(None), Err(Unauthorized::Missing));
        assert_eq!(
            t.check(Some(b"Bearer s3cret")),
            Err(Unauthorized::WrongToken)
        );
        assert_eq!(
            t.check(Some(b"Bearer s3cret-token2")),
            Err(Unauthorized::WrongToken)
        );
        assert_eq!(t.check(Some(b"Bearer ")), Err(Unauthorized::NotBearer));
        assert_eq!(
            t.check(Some(b"Basic s3cret-token")),
            Err(Unauthorized::NotBearer)
        );
        assert_eq!(t.check(Some(b"s3cret-token")), Err(Unauthorized::NotBearer));
        assert_eq!(format!("{t:?}"), "ApiToken(<redacted>)");
    }

    #[test]
    fn token_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc123\n").unwrap();
        let t = ApiToken::read(&path).unwrap();
        assert_eq!(t.check(Some(b"Bearer abc123")), Ok(()));
        for bad in ["", "\n", "two words\n", "é"] {
            std::fs::write(&path, bad).unwrap();
            let e = ApiToken::read(&path).unwrap_err();
            assert!(matches!(e, TokenFileError::Malformed { .. }), "{bad:?}");
        }
        let e = ApiToken::read(&dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().starts_with("reading API token file"), "{e}");
    }
}
