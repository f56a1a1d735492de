//! `sup-lease fleet fetch`: one version fetched, verified, unpacked and installed through
//! supd. A node runs it in a child process; an operator may run it by hand.

use super::artifact::{self, FetchOptions};
use crate::lease::node::Supd;
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

/// Where to stage, what to trust, which supd installs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Each tool stages in a directory of its own below this one.
    pub staging: PathBuf,
    pub ca_file: Option<PathBuf>,
    pub socket: PathBuf,
}

/// supd copies the staged directory into its tools directory before it answers: a big
/// version takes a while.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Fetches `url`, checks its sha256, unpacks it and asks supd to install it as `version`
/// of `tool`; nothing is fetched when supd has the version already. What was done, or
/// why not (one line).
pub fn fetch_and_install(
    tool: &str,
    version: &str,
    url: &str,
    sha256: &str,
    o: &Options,
) -> Result<String, String> {
    crate::versions::check_tool(tool)?;
    crate::versions::check_version(version)?;
    let mut supd = Supd::new(o.socket.clone());
    let have = supd.call(
        json!({"cmd": "versions", "tool": tool}),
        Duration::from_secs(10),
    )?;
    let installed = have["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v["version"] == version);
    if installed {
        return Ok(format!(
            "{tool} {version} is installed already: nothing fetched"
        ));
    }
    let opts = FetchOptions {
        ca_file: o.ca_file.clone(),
        pace: artifact::Pace::from_env(),
        ..FetchOptions::default()
    };
    let staging = o.staging.join(tool);
    // Run by a node: how the download goes, on standard output, for the node to show.
    let by_node = std::env::var_os(super::node::PARENT_ENV).is_some();
    let mut progress = |bytes: u64, size: Option<u64>| {
        if by_node {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(super::node::progress_line(bytes, size).as_bytes());
            let _ = out.flush();
        }
    };
    let dir = artifact::fetch_with(url, sha256, &staging, version, &opts, &mut progress);
    let dir = dir.map_err(|e| match e {
        artifact::FetchError::Mismatch { .. } => format!("sha256 mismatch for {url}: {e}"),
        e => e.to_string(),
    })?;
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    let req = json!({"cmd": "install", "tool": tool, "version": version, "dir": dir});
    let answer = supd.call(req, INSTALL_TIMEOUT);
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        log::warn!("cannot remove {}: {e}", dir.display());
    }
    match answer {
        Ok(_) => Ok(format!("installed {tool} {version} from {url}")),
        Err(e) => Err(format!("supd did not install {tool} {version}: {e}")),
    }
}
