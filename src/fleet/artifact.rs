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
    /// How slow a download may be before it is given up (see [`Pace`]).
    pub pace: Pace,
}

impl Default for FetchOptions {
    /// 30 s per step, the system's CAs, at most 1 GiB, the default pace.
    fn default() -> Self {
        FetchOptions {
            timeout: Duration::from_secs(30),
            ca_file: None,
            max_bytes: 1 << 30,
            pace: Pace::default(),
        }
    }
}

/// How slow a download may be. A download is given up, as any failed download (the node
/// tries again later), when either deadline passes:
///
/// - the total deadline, `max(floor, size / rate)`: the size is the one announced
///   (Content-Length, or a file's length), else the bytes come so far (an unannounced
///   size is known only afterwards: then the average since the start must stay at
///   `rate` once `floor` is over);
/// - the stall deadline: fewer than `stall_bytes` came in a window of `stall` (a
///   trickle that never quite stops, which a per-read timeout lets through).
///
/// The defaults (60 s, 128 KiB/s, 64 KiB in 60 s) let any link of 128 KiB/s (about
/// 1 Mbit/s) or more through (1 GiB has 2 h 16 min) but not a server that stalls: one
/// byte a second is given up after a minute. `SUP_FLEET_FETCH_PACE` changes them (see [`Pace::from_env`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub floor: Duration,
    /// Bytes a second.
    pub rate: u64,
    pub stall: Duration,
    pub stall_bytes: u64,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            floor: Duration::from_secs(60),
            rate: 128 * 1024,
            stall: Duration::from_secs(60),
            stall_bytes: 64 * 1024,
        }
    }
}

/// The environment variable that changes the pace of a fetch: comma-separated
/// `floor=DURATION`, `rate=BYTES` (a second), `stall=DURATION`, `stall_bytes=BYTES`;
/// those not given keep their defaults. Read by `sup-lease fleet fetch` (a node passes
/// its own environment on).
pub const PACE_ENV: &str = "SUP_FLEET_FETCH_PACE";

impl Pace {
    /// The whole download's deadline, for `size` bytes.
    pub fn deadline(&self, size: u64) -> Duration {
        let secs = size as f64 / self.rate.max(1) as f64;
        self.floor.max(Duration::from_secs_f64(secs.min(1e9)))
    }

    /// The pace `spec` (as in [`PACE_ENV`]) says, from the defaults.
    pub fn parse(spec: &str) -> Result<Pace, String> {
        let mut p = Pace::default();
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || {
                format!("{PACE_ENV}: '{item}' is not floor=DURATION, rate=BYTES, stall=DURATION or stall_bytes=BYTES")
            };
            let (k, v) = item.split_once('=').ok_or_else(bad)?;
            let bytes = || v.trim().parse::<u64>().map_err(|_| bad());
            let dur =
                || crate::time::parse_duration(v).map_err(|e| format!("{PACE_ENV}: {k}: {e}"));
            match k.trim() {
                "floor" => p.floor = dur()?,
                "rate" => p.rate = bytes()?.max(1),
                "stall" => p.stall = dur()?,
                "stall_bytes" => p.stall_bytes = bytes()?,
                _ => return Err(bad()),
            }
        }
        Ok(p)
    }

    /// The pace [`PACE_ENV`] gives, or the default (a bad value is said, and ignored).
    pub fn from_env() -> Pace {
        match std::env::var(PACE_ENV) {
            Ok(spec) => Pace::parse(&spec).unwrap_or_else(|e| {
                log::warn!("{e}; the default pace is used");
                Pace::default()
            }),
            Err(_) => Pace::default(),
        }
    }
}

/// A download's pace as it goes: fed how many bytes came after how long, it says when a
/// deadline of its [`Pace`] passed. Plain numbers in; the caller reads the clock.
#[derive(Debug, Clone)]
pub struct Pacer {
    pace: Pace,
    size: Option<u64>,
    /// When the stall window began, and the bytes come by then.
    window: (Duration, u64),
}

impl Pacer {
    /// `size`: as announced, if it was.
    pub fn new(pace: Pace, size: Option<u64>) -> Pacer {
        Pacer {
            pace,
            size,
            window: (Duration::ZERO, 0),
        }
    }

    /// After `got` bytes in `elapsed` since the start: why the download is given up, if
    /// it is (a sentence to follow "too slow: N bytes in M s").
    pub fn look(&mut self, elapsed: Duration, got: u64) -> Result<(), String> {
        let size = self.size.unwrap_or(got).max(got);
        let deadline = self.pace.deadline(size);
        if elapsed > deadline {
            let of = match self.size {
                Some(n) => format!("{n} bytes"),
                None => format!("{got} bytes so far (size not announced)"),
            };
            return Err(format!(
                "its deadline is {} for {of} (at least {}, and {} bytes a second)",
                crate::time::Human(deadline),
                crate::time::Human(self.pace.floor),
                self.pace.rate
            ));
        }
        let (since, at) = self.window;
        if elapsed.saturating_sub(since) >= self.pace.stall {
            let came = got.saturating_sub(at);
            if came < self.pace.stall_bytes {
                return Err(format!(
                    "{came} bytes came in the last {}, fewer than {} (stalled)",
                    crate::time::Human(elapsed.saturating_sub(since)),
                    self.pace.stall_bytes
                ));
            }
            self.window = (elapsed, got);
        }
        Ok(())
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
    fetch_with(url, sha256, staging, version, opts, &mut |_, _| {})
}

/// [`fetch`], telling `progress` how the download goes: the bytes come so far and the
/// size when it is known, at the start and then at most once a second.
pub fn fetch_with(
    url: &str,
    sha256: &str,
    staging: &Path,
    version: &str,
    opts: &FetchOptions,
    progress: &mut dyn FnMut(u64, Option<u64>),
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
    let (got, file) = source.download(url, &download, opts, progress)?;
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
        progress: &mut dyn FnMut(u64, Option<u64>),
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
                let size = f.metadata().ok().map(|m| m.len());
                let copy = Copy {
                    max: opts.max_bytes,
                    what: &what.to_string(),
                    dst,
                    pacer: Pacer::new(opts.pace, size),
                    size,
                };
                copy.run(&mut f, &mut out, progress)?
            }
            Source::Http => {
                let (mut body, size) = http_get(url, opts)?;
                let copy = Copy {
                    max: opts.max_bytes,
                    what: url,
                    dst,
                    pacer: Pacer::new(opts.pace, size),
                    size,
                };
                copy.run(&mut body, &mut out, progress)?
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

/// GET `url`; the body of a 2xx answer, redirects followed, and its size when announced.
fn http_get(url: &str, opts: &FetchOptions) -> Result<(impl Read, Option<u64>), FetchError> {
    let t = Some(opts.timeout);
    // A body that sends nothing at all is given up within a stall window too (the pace is
    // looked at after each read).
    let per_read = Some(
        opts.timeout
            .min(opts.pace.stall.max(Duration::from_secs(1))),
    );
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(5)
        .timeout_resolve(t)
        .timeout_connect(t)
        .timeout_send_request(t)
        .timeout_recv_response(t)
        .timeout_per_read(per_read)
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
    let size = body.content_length();
    if let Some(n) = size.filter(|&n| n > opts.max_bytes) {
        return Err(too_big(url, Some(n), opts.max_bytes));
    }
    Ok((body.into_reader(), size))
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

/// One copy of a download into its file.
struct Copy<'a> {
    /// At most this many bytes.
    max: u64,
    /// The URL or path, for messages.
    what: &'a str,
    /// The file written.
    dst: &'a Path,
    pacer: Pacer,
    size: Option<u64>,
}

impl Copy<'_> {
    /// Copies `src` into `out` hashing as it goes, within the pace; tells `progress`.
    /// Returns the sha256 (lowercase hex).
    fn run(
        mut self,
        src: &mut impl Read,
        out: &mut File,
        progress: &mut dyn FnMut(u64, Option<u64>),
    ) -> Result<String, FetchError> {
        let what = self.what;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total: u64 = 0;
        let start = std::time::Instant::now();
        let mut told = start;
        progress(0, self.size);
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(FetchError::Download(format!(
                        "cannot download {what}: {e} after {total} bytes in {}; try again, and \
                         look at the server if it goes on",
                        crate::time::Human(round_s(start.elapsed()))
                    )))
                }
            };
            total += n as u64;
            if total > self.max {
                return Err(too_big(what, None, self.max));
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| FetchError::Io(format!("cannot write {}: {e}", self.dst.display())))?;
            let elapsed = start.elapsed();
            if let Err(why) = self.pacer.look(elapsed, total) {
                return Err(too_slow(what, total, elapsed, &why));
            }
            if told.elapsed() >= Duration::from_secs(1) {
                progress(total, self.size);
                told = std::time::Instant::now();
            }
        }
        progress(total, self.size);
        Ok(hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect())
    }
}

/// A duration to the second, for messages.
fn round_s(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

/// Why a download was given up for its pace.
pub fn too_slow(what: &str, got: u64, elapsed: Duration, why: &str) -> FetchError {
    FetchError::Download(format!(
        "download of {what} too slow: {got} bytes in {} s ({why}); it is tried again \
         later: look at the server and the network between it and this node",
        elapsed.as_secs()
    ))
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

    /// The real default: a total deadline of max(60 s, size at 128 KiB/s), and a stall
    /// deadline of 64 KiB in 60 s.
    #[test]
    fn the_default_pace_has_a_floor_a_rate_and_a_stall_window() {
        let p = Pace::default();
        let s = Duration::from_secs;
        assert_eq!(p.deadline(0), s(60));
        assert_eq!(p.deadline(1_000_000), s(60), "a small artifact: the floor");
        assert_eq!(p.deadline(128 * 1024 * 600), s(600));
        assert_eq!(p.deadline(1 << 30), s(8192), "1 GiB: 2 h 16 min 32 s");
        // One byte a second of an announced megabyte: given up at the stall window.
        let mut pacer = Pacer::new(p, Some(1_000_000));
        for t in 1..60 {
            assert_eq!(pacer.look(s(t), t), Ok(()), "{t} s");
        }
        let e = pacer.look(s(60), 60).unwrap_err();
        assert!(
            e.contains("60 bytes came in the last 1m") && e.contains("stalled"),
            "{e}"
        );
        // Fast enough in every window, but not for the whole: the total deadline.
        let mut pacer = Pacer::new(p, Some(100 << 20));
        let mut t = 0;
        let mut got = 0;
        let e = loop {
            t += 60;
            got += 100 * 1024;
            if let Err(e) = pacer.look(s(t), got) {
                break e;
            }
        };
        assert_eq!(t, 840, "100 MiB: 800 s");
        assert!(
            e.contains("its deadline is 13m20s for 104857600 bytes"),
            "{e}"
        );
        // A fast download passes.
        let mut pacer = Pacer::new(p, Some(100 << 20));
        assert_eq!(pacer.look(s(10), 100 << 20), Ok(()));
    }

    /// No size announced: the average must keep to the rate once the floor is over.
    #[test]
    fn an_unannounced_size_is_paced_by_what_came() {
        let p = Pace {
            stall: Duration::from_secs(3600),
            ..Pace::default()
        };
        let s = Duration::from_secs;
        let mut pacer = Pacer::new(p, None);
        assert_eq!(pacer.look(s(60), 10), Ok(()));
        assert!(pacer
            .look(s(61), 10)
            .unwrap_err()
            .contains("size not announced"));
        let mut pacer = Pacer::new(p, None);
        assert_eq!(pacer.look(s(100), 128 * 1024 * 100), Ok(()));
        assert!(pacer.look(s(101), 128 * 1024 * 100).is_err());
    }

    #[test]
    fn the_pace_is_changed_by_its_environment_variable_syntax() {
        let p = Pace::parse("floor=5s, stall_bytes=10").expect("parse");
        assert_eq!(
            p,
            Pace {
                floor: Duration::from_secs(5),
                stall_bytes: 10,
                ..Pace::default()
            }
        );
        assert_eq!(Pace::parse(""), Ok(Pace::default()));
        let p = Pace::parse("rate=1000,stall=2s").expect("parse");
        assert_eq!((p.rate, p.stall), (1000, Duration::from_secs(2)));
        for bad in ["floor", "floor=5", "rate=fast", "speed=1"] {
            assert!(Pace::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn versions_are_one_plain_component() {
        assert!(check_version("1.2.3").is_ok());
        for bad in ["", ".", "..", ".1", "a/b", "a\0"] {
            assert!(check_version(bad).is_err(), "{bad:?}");
        }
    }
}
