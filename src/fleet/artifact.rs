//! Fetching a fleet target's artifact: download a `.tar.gz` (http://, https:// or file://),
//! check its sha256 before anything is unpacked, and unpack it safely into a staging dir.
//!
//! The order is the point: the archive is streamed to `staging/.VERSION.download` while it
//! is hashed (never held in memory, never bigger than `max_bytes`); only an archive whose
//! sha256 matches is opened; it is unpacked into `staging/.VERSION.unpack`, which is renamed
//! to `staging/VERSION` only when every entry is in place. A failure at any step removes
//! what the step made, so `staging/VERSION` exists only as the answer of a `fetch` that
//! succeeded.
//!
//! sup-lease runs as root and the archive comes from the network, so unpacking trusts no
//! entry: absolute paths, `..`, hard links, devices, fifos, paths through symlinks and
//! symlinks that could lead out of the version directory are refused (the rules are in
//! `unpack.rs`); modes are kept (less group and other write), owners never.

use sha2::{Digest, Sha256};
use std::fmt;
use std::fs::{self, DirBuilder, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How [`fetch`] downloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOptions {
    /// The longest wait for each network step: resolving, connecting, sending, the answer's
    /// head, and each read of the body (a slow but moving download is not cut off).
    pub timeout: Duration,
    /// A PEM file of the certificate authorities to trust for https:// instead of the
    /// system's (e.g. a fleet's own CA).
    pub ca_file: Option<PathBuf>,
    /// Downloads bigger than this many bytes are refused.
    pub max_bytes: u64,
}

impl Default for FetchOptions {
    /// 30 s per step, the system's CAs, at most 1 GiB.
    fn default() -> Self {
        FetchOptions {
            timeout: Duration::from_secs(30),
            ca_file: None,
            max_bytes: 1 << 30,
        }
    }
}

/// Why a [`fetch`] failed. Each carries a sentence for people; `Display` adds what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// The target itself is unusable, whatever the network does: a URL that is not
    /// http://, https:// or file://, or a sha256 or version that is malformed.
    Url(String),
    /// The archive could not be had: network, TLS, HTTP status, reading the file, or it is
    /// bigger than `max_bytes`.
    Download(String),
    /// The archive's sha256 is not the expected one; nothing was unpacked.
    Mismatch {
        /// The sha256 asked for (lowercase hex).
        expected: String,
        /// The sha256 of what was downloaded (lowercase hex).
        got: String,
    },
    /// The archive is not a good .tar.gz, or holds an entry that is refused.
    Unpack(String),
    /// The staging directory could not be made, written or cleaned.
    Io(String),
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Url(m) => write!(f, "{m}"),
            FetchError::Download(m) => write!(f, "{m}"),
            FetchError::Mismatch { expected, got } => write!(
                f,
                "the archive's sha256 is {got}, not {expected} as the target says: it was \
                 not unpacked; either the artifact was changed or the target's sha256 is \
                 wrong (compute it with sha256sum and set the target again)"
            ),
            FetchError::Unpack(m) => write!(
                f,
                "{m}; nothing was installed: build the archive as a plain .tar.gz of the \
                 version directory's content"
            ),
            FetchError::Io(m) => write!(f, "{m}; check the staging directory's disk and rights"),
        }
    }
}

impl std::error::Error for FetchError {}

/// Checks that `hex` is a sha256: 64 hex digits, any case. Returns it lowercased.
pub fn check_sha256(hex: &str) -> Result<String, String> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "'{hex}' is not a sha256: give 64 hex digits, as sha256sum prints them"
        ));
    }
    Ok(hex.to_ascii_lowercase())
}

/// Fetches the .tar.gz at `url` (http://, https:// or file://), verifies its sha256
/// (`sha256` is 64 hex digits, any case) BEFORE anything is unpacked, unpacks it into
/// `staging/VERSION` (made anew: a leftover from an earlier attempt is removed first) and
/// returns that directory. The archive's top level is the version directory's content.
///
/// `staging` is made (mode 0700) when missing. On any error nothing is left under
/// `staging` for this version: no `VERSION`, no temp files.
pub fn fetch(
    url: &str,
    sha256: &str,
    staging: &Path,
    version: &str,
    opts: &FetchOptions,
) -> Result<PathBuf, FetchError> {
    let expected = check_sha256(sha256).map_err(FetchError::Url)?;
    check_version(version).map_err(FetchError::Url)?;
    let source = Source::parse(url)?;

    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(staging)
        .map_err(|e| FetchError::Io(format!("cannot make {}: {e}", staging.display())))?;
    let download = staging.join(format!(".{version}.download"));
    let unpacked = staging.join(format!(".{version}.unpack"));
    let target = staging.join(version);
    for p in [&target, &download, &unpacked] {
        remove_any(p)?;
    }

    let downloaded = Removed(&download);
    let (got, file) = source.download(url, &download, opts)?;
    if got != expected {
        return Err(FetchError::Mismatch { expected, got });
    }
    let half = Removed(&unpacked);
    // The bytes unpacked are those hashed: the same open file, read again from its start
    // (not the path, which another writer could have replaced meanwhile).
    unpack::unpack(file, &download, &unpacked)?;
    drop(downloaded);
    fs::rename(&unpacked, &target).map_err(|e| {
        FetchError::Io(format!(
            "cannot rename {} to {}: {e}",
            unpacked.display(),
            target.display()
        ))
    })?;
    half.keep();
    Ok(target)
}

/// A version names a directory under staging: one plain path component, not hidden (the
/// temp names start with a dot).
fn check_version(version: &str) -> Result<(), String> {
    if version.is_empty()
        || version.starts_with('.')
        || version.contains('/')
        || version.contains('\0')
    {
        return Err(format!(
            "'{version}' cannot be a version directory's name: no '/', no leading '.'"
        ));
    }
    Ok(())
}

/// Removes a path on drop (a temp file or a half-unpacked dir), quietly: it is cleanup
/// after an error already reported, or of a file no longer needed.
struct Removed<'a>(&'a Path);

impl Removed<'_> {
    /// The path is the result: leave it.
    fn keep(self) {
        std::mem::forget(self)
    }
}

impl Drop for Removed<'_> {
    fn drop(&mut self) {
        let _ = remove_any(self.0);
    }
}

/// Removes a file, symlink or directory tree at `p`; nothing there is fine.
fn remove_any(p: &Path) -> Result<(), FetchError> {
    let done = match fs::symlink_metadata(p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => fs::remove_dir_all(p).or_else(|_| {
            // An archive's read-only directories stop a non-root remove: open them up.
            make_writable(p);
            fs::remove_dir_all(p)
        }),
        Ok(_) => fs::remove_file(p),
    };
    done.map_err(|e| FetchError::Io(format!("cannot remove {}: {e}", p.display())))
}

fn make_writable(dir: &Path) {
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            }
        }
    }
}

/// Where an archive comes from.
#[derive(Debug, PartialEq, Eq)]
enum Source {
    Http,
    File(PathBuf),
}

impl Source {
    fn parse(url: &str) -> Result<Source, FetchError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            let hint = if url.starts_with('/') {
                format!("file://{url}")
            } else {
                "file:///ABSOLUTE/PATH".to_string()
            };
            return Err(FetchError::Url(format!(
                "'{url}' is not a URL: for a file on the node write {hint}; else http:// or \
                 https://"
            )));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "http" | "https" => Ok(Source::Http),
            "file" => {
                let path = rest.strip_prefix("localhost").unwrap_or(rest);
                if !path.starts_with('/') {
                    return Err(FetchError::Url(format!(
                        "'{url}': a file:// URL names a file on this node by its absolute \
                         path: file:///PATH"
                    )));
                }
                percent_decode(path)
                    .map(|p| Source::File(PathBuf::from(p)))
                    .ok_or_else(|| FetchError::Url(format!("'{url}': a bad %-escape in the path")))
            }
            _ => Err(FetchError::Url(format!(
                "'{url}': the scheme {scheme}:// is not taken: give http://, https:// or \
                 file://"
            ))),
        }
    }

    /// Streams the archive into `dst` (created new) and returns its sha256 (lowercase hex)
    /// and the file, at its start.
    fn download(
        &self,
        url: &str,
        dst: &Path,
        opts: &FetchOptions,
    ) -> Result<(String, File), FetchError> {
        let mut out = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)
            .map_err(|e| FetchError::Io(format!("cannot create {}: {e}", dst.display())))?;
        let sum = match self {
            Source::File(path) => {
                let what = path.display();
                let mut f = File::open(path).map_err(|e| {
                    FetchError::Download(format!(
                        "cannot open {what}: {e}; check the path of the file:// URL on this node"
                    ))
                })?;
                copy_hashed(&mut f, &mut out, opts.max_bytes, &what.to_string(), dst)?
            }
            Source::Http => {
                let mut body = http_get(url, opts)?;
                copy_hashed(&mut body, &mut out, opts.max_bytes, url, dst)?
            }
        };
        use std::io::Seek;
        out.rewind()
            .map_err(|e| FetchError::Io(format!("cannot read {} again: {e}", dst.display())))?;
        Ok((sum, out))
    }
}

/// `%XX` escapes decoded; `None` for a bad escape or a NUL.
fn percent_decode(s: &str) -> Option<std::ffi::OsString> {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    (!out.contains(&0)).then(|| std::ffi::OsString::from_vec(out))
}

/// GET `url`; the body of a 2xx answer, redirects followed.
fn http_get(url: &str, opts: &FetchOptions) -> Result<impl Read, FetchError> {
    let t = Some(opts.timeout);
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(5)
        .timeout_resolve(t)
        .timeout_connect(t)
        .timeout_send_request(t)
        .timeout_recv_response(t)
        .timeout_per_read(t)
        .timeout_per_write(t)
        .user_agent(format!("sup-lease/{}", crate::VERSION));
    let https = url
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"));
    if https {
        config = config.tls_config(tls_config(opts)?);
    }
    let agent: ureq::Agent = config.build().into();
    let resp = agent.get(url).call().map_err(|e| match e {
        ureq::Error::BadUri(m) => FetchError::Url(format!("'{url}' is not a good URL: {m}")),
        e => FetchError::Download(format!(
            "cannot download {url}: {e}; check the URL and that its server is reachable from \
             this node{}",
            if https {
                ", with a certificate from a CA it trusts (the system's, or the CA file given)"
            } else {
                ""
            }
        )),
    })?;
    let status = resp.status();
    if !status.is_success() {
        return Err(FetchError::Download(format!(
            "cannot download {url}: the server answered HTTP {}{}; check the URL",
            status.as_u16(),
            status
                .canonical_reason()
                .map(|r| format!(" {r}"))
                .unwrap_or_default()
        )));
    }
    let body = resp.into_body();
    if let Some(n) = body.content_length().filter(|&n| n > opts.max_bytes) {
        return Err(too_big(url, Some(n), opts.max_bytes));
    }
    Ok(body.into_reader())
}

/// The system's CA bundles, as Debian and RHEL (and SUSE, Alpine) place them.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Trust `ca_file` when given; else the first system bundle there is; else the Mozilla
/// roots built in (webpki-roots).
fn tls_config(opts: &FetchOptions) -> Result<ureq::tls::TlsConfig, FetchError> {
    use ureq::tls::{RootCerts, TlsConfig};
    let roots = match &opts.ca_file {
        Some(path) => RootCerts::new_with_certs(&read_pem(path)?),
        None => match SYSTEM_BUNDLES
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .and_then(|p| read_pem(p).ok())
        {
            Some(certs) => RootCerts::new_with_certs(&certs),
            None => RootCerts::WebPki,
        },
    };
    Ok(TlsConfig::builder().root_certs(roots).build())
}

/// The certificates in a PEM file; at least one.
fn read_pem(path: &Path) -> Result<Vec<ureq::tls::Certificate<'static>>, FetchError> {
    let bad =
        |m: String| FetchError::Download(format!("cannot use the CA file {}: {m}", path.display()));
    let pem = fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let ureq::tls::PemItem::Certificate(c) = item.map_err(|e| bad(e.to_string()))? {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".to_string()));
    }
    Ok(certs)
}

/// `size` when known (announced) before the download.
fn too_big(what: &str, size: Option<u64>, max: u64) -> FetchError {
    let size = size.map(|n| format!(" ({n} bytes)")).unwrap_or_default();
    FetchError::Download(format!(
        "cannot download {what}: it is bigger{size} than the limit of {max} bytes; check \
         that the URL names the right artifact"
    ))
}

/// Copies `src` into `out` (the file at `dst`) hashing as it goes; at most `max` bytes.
fn copy_hashed(
    src: &mut impl Read,
    out: &mut File,
    max: u64,
    what: &str,
    dst: &Path,
) -> Result<String, FetchError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total: u64 = 0;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(FetchError::Download(format!(
                    "cannot download {what}: {e} after {total} bytes; try again, and look at \
                     the server if it goes on"
                )))
            }
        };
        total += n as u64;
        if total > max {
            return Err(too_big(what, None, max));
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| FetchError::Io(format!("cannot write {}: {e}", dst.display())))?;
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

mod unpack;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_is_64_hex_digits_lowercased() {
        let up = "AB".repeat(32);
        assert_eq!(check_sha256(&up), Ok("ab".repeat(32)));
        assert!(check_sha256(&"ab".repeat(31)).is_err());
        assert!(check_sha256(&format!("{}g", "a".repeat(63))).is_err());
        assert!(check_sha256("").is_err());
    }

    #[test]
    fn urls_taken_and_refused() {
        assert_eq!(Source::parse("http://h/a.tgz"), Ok(Source::Http));
        assert_eq!(Source::parse("HTTPS://h/a.tgz"), Ok(Source::Http));
        assert_eq!(
            Source::parse("file:///srv/a%20b.tgz"),
            Ok(Source::File("/srv/a b.tgz".into()))
        );
        assert_eq!(
            Source::parse("file://localhost/srv/a.tgz"),
            Ok(Source::File("/srv/a.tgz".into()))
        );
        for bad in [
            "/srv/a.tgz",
            "a.tgz",
            "ftp://h/a",
            "file://host/a",
            "file:///a%zz",
        ] {
            assert!(
                matches!(Source::parse(bad), Err(FetchError::Url(_))),
                "{bad}"
            );
        }
        let Err(e) = Source::parse("/srv/a.tgz") else {
            unreachable!()
        };
        assert!(e.to_string().contains("file:///srv/a.tgz"), "{e}");
    }

    #[test]
    fn versions_are_one_plain_component() {
        assert!(check_version("1.2.3").is_ok());
        for bad in ["", ".", "..", ".1", "a/b", "a\0"] {
            assert!(check_version(bad).is_err(), "{bad:?}");
        }
    }
}
