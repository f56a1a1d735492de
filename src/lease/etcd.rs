//! etcd v3 through its JSON gateway (`/v3/...`, etcd 3.4), over HTTP/1.1 or HTTPS with a
//! small synchronous client, to one endpoint or several (a cluster's members), with
//! mutual TLS and etcd's authentication as etcdctl has them. What etcd does that
//! matters here (../shared/notes):
//! keys and values are base64; 64-bit numbers come back as strings; zero and false
//! fields are omitted (a failed transaction has no "succeeded"); a keepalive of a dead
//! lease has no TTL; a keepalive succeeds even after someone else took a key, so
//! ownership is proven by a transaction (`check`).

mod files;
mod transport;

use super::store::{Change, Cond, Identity, Kv, LeaseId, Store, StoreError, StoreOptions, Watched};
use crate::time::Boot;
use files::{read_password, tls_config};
use serde_json::{json, Value};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use transport::{https, repeatable, Auth, Conn, Fail};

/// A client of an etcd cluster: one endpoint or several, each call tried from the one
/// that answered last, over http or https (with a client certificate), as a user of
/// etcd's authentication when one is given.
pub struct EtcdStore {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    timeout: Duration,
    auth: Option<Auth>,
    /// Whether `--cacert` and `--cert` were given: what a TLS failure's advice says.
    cacert: bool,
    client_cert: bool,
    conn: Mutex<Conn>,
    /// The stream of the last watch, read on by the next one that goes on from where
    /// it stopped: a batch of events does not cost a new watch (and a new connection).
    watching: Mutex<Option<WatchStream>>,
}

/// A watch's open stream: its prefix, the revision its last batch reached, and when
/// its request's timeout ends it (every T/3, so a dead connection is left soon).
struct WatchStream {
    prefix: String,
    url: String,
    after: u64,
    end: Boot,
    lines: std::io::Lines<std::io::BufReader<ureq::BodyReader<'static>>>,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// Why a call gave no answer to use: etcd refused it, with the HTTP status that a caller
/// tells one refusal from another by (a revoke's 404: the lease is gone already), or no
/// endpoint answered.
enum CallError {
    Refused { status: u16, error: StoreError },
    Failed(StoreError),
}

impl From<CallError> for StoreError {
    fn from(e: CallError) -> StoreError {
        match e {
            CallError::Refused { error, .. } | CallError::Failed(error) => error,
        }
    }
}

impl EtcdStore {
    /// `URL[,URL...]`, each `http://HOST:PORT` or `https://HOST:PORT`, reached with
    /// `opts`. Every call gives up after `timeout`, whichever endpoints it tries.
    pub fn new(
        urls: &str,
        timeout: Duration,
        opts: &StoreOptions,
    ) -> Result<EtcdStore, StoreError> {
        let mut endpoints = Vec::new();
        for url in urls.split(',').map(str::trim) {
            let scheme = url.find("://").map(|i| url[..i].to_ascii_lowercase());
            let host = url.find("://").map(|i| &url[i + 3..]).unwrap_or("");
            if !matches!(scheme.as_deref(), Some("http" | "https"))
                || host.trim_end_matches('/').is_empty()
            {
                return Err(err(format!(
                    "'{url}' is not an etcd endpoint: etcd:http://HOST:PORT or \
                     etcd:https://HOST:PORT, several separated by commas \
                     (etcd:https://h1:2379,https://h2:2379)"
                )));
            }
            endpoints.push(url.trim_end_matches('/').to_string());
        }
        let tls = endpoints.iter().any(|u| https(u));
        if !tls && (opts.cacert.is_some() || opts.cert.is_some() || opts.key.is_some()) {
            return Err(err(format!(
                "--cacert, --cert and --key are for https:// endpoints, and '{urls}' names \
                 none: use etcd:https://HOST:PORT (etcd's --listen-client-urls)"
            )));
        }
        let auth = match (&opts.user, &opts.password_file) {
            (None, None) => None,
            (Some(user), Some(file)) => {
                if user.is_empty() || user.contains(':') {
                    return Err(err(format!(
                        "--user '{user}': give the user's name alone, and its password in \
                         --password-file"
                    )));
                }
                // Read now, so that a missing file is said at the start.
                read_password(file, user)?;
                Some(Auth {
                    user: user.clone(),
                    password_file: file.clone(),
                })
            }
            (Some(_), None) => {
                return Err(err(
                    "--user needs --password-file FILE, a file holding the user's password",
                ))
            }
            (None, Some(_)) => {
                return Err(err(
                    "--password-file needs --user NAME, the etcd user whose password it holds",
                ))
            }
        };
        let mut config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .user_agent(format!("sup-lease/{}", crate::VERSION));
        if tls {
            config = config.tls_config(tls_config(opts)?);
        }
        Ok(EtcdStore {
            endpoints,
            agent: config.build().into(),
            timeout,
            auth,
            cacert: opts.cacert.is_some(),
            client_cert: opts.cert.is_some(),
            conn: Mutex::new(Conn::default()),
            watching: Mutex::new(None),
        })
    }

    /// POSTs `body` to `/v3/PATH`; the JSON answer, or the gateway's error. Tries the
    /// endpoints in turn from the one that answered last, all within the timeout: each
    /// one tried but the last gets a share of the time left, so that a hung one cannot
    /// use it all.
    /// A write whose request may have reached etcd is not sent again (its answer is
    /// lost, not its effect); the next call starts at the next endpoint.
    fn call(&self, path: &str, body: Value) -> Result<Value, StoreError> {
        self.ask(path, body).map_err(StoreError::from)
    }

    /// [`Self::call`], with etcd's refusal told apart by its status.
    fn ask(&self, path: &str, body: Value) -> Result<Value, CallError> {
        let deadline = Instant::now() + self.timeout;
        let n = self.endpoints.len();
        let first = self.conn().current % n;
        let repeatable = repeatable(path, &body);
        let mut failures = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // While other endpoints remain, a quarter of the call's time at most: one
            // that does not answer costs a tick little of the slack its grant leaves
            // (the grant outlasts the next tick by T/6). The last gets what is left.
            let share = if k + 1 < n {
                (left / (n - k) as u32).min(self.timeout / 4)
            } else {
                left
            };
            // A read may give up at its share; a write, once connected, waits for its
            // answer as long as the call may.
            let total = if repeatable { share } else { left };
            let (e, maybe_done) = match self.attempt(i, path, &body, share, total) {
                Ok(v) => {
                    if k > 0 {
                        log::warn!(
                            "etcd: {}; {} answers: asking it first from now on",
                            failures.join("; "),
                            self.endpoints[i]
                        );
                    }
                    self.conn().current = i;
                    return Ok(v);
                }
                Err(Fail::Answer { status, error, .. }) if status < 500 => {
                    return Err(CallError::Refused { status, error })
                }
                Err(Fail::Answer { error, .. }) => (error.0, true),
                Err(Fail::Unsent(e)) => (e, false),
                Err(Fail::Lost(e)) => (e, true),
            };
            failures.push(e);
            if maybe_done && !repeatable {
                self.conn().current = (i + 1) % n;
                return Err(CallError::Failed(err(failures.join("; "))));
            }
        }
        self.conn().current = (first + 1) % n;
        let within = crate::time::Human(self.timeout);
        Err(CallError::Failed(err(match failures.len() {
            0 => format!("no etcd endpoint answered within {within}"),
            1 => failures.remove(0),
            _ => format!("no etcd endpoint answered: {}", failures.join("; ")),
        })))
    }

    fn compare(key: &str, cond: Cond) -> Value {
        let k = b64(key.as_bytes());
        match cond {
            Cond::Absent => {
                json!({"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": "0"})
            }
            Cond::ModRevision(r) => {
                json!({"key": k, "result": "EQUAL", "target": "MOD", "mod_revision": r.to_string()})
            }
            Cond::Lease(id) => {
                json!({"key": k, "result": "EQUAL", "target": "LEASE", "lease": id.to_string()})
            }
        }
    }

    /// A transaction: whether it succeeded, and its responses.
    fn txn(&self, compare: Vec<Value>, success: Vec<Value>) -> Result<(bool, Value), StoreError> {
        let v = self.call(
            "kv/txn",
            json!({"compare": compare, "success": success, "failure": []}),
        )?;
        Ok((v["succeeded"].as_bool().unwrap_or(false), v))
    }
}

/// etcd's TTLs are whole seconds: rounded up, so that the store lease is never shorter
/// than the T the node counts with ("2500ms" is 3 s, not 2 s).
pub fn whole_seconds(ttl: Duration) -> u64 {
    (ttl.as_nanos().div_ceil(1_000_000_000) as u64).max(1)
}

/// A 64-bit number the gateway sent as a string (or a number); absent is zero.
fn num(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

impl Store for EtcdStore {
    fn grant(&mut self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let v = self.call("lease/grant", json!({"TTL": whole_seconds(ttl)}))?;
        match num(&v["ID"]) as LeaseId {
            0 => Err(err(format!("lease grant without an ID: {v}"))),
            id => Ok(id),
        }
    }

    fn keepalive(&mut self, id: LeaseId) -> Result<bool, StoreError> {
        let v = self.call("lease/keepalive", json!({"ID": id.to_string()}))?;
        Ok(num(&v["result"]["TTL"]) > 0)
    }

    fn revoke(&mut self, id: LeaseId) -> Result<(), StoreError> {
        match self.ask("lease/revoke", json!({"ID": id.to_string()})) {
            Ok(_) => Ok(()),
            // Already gone: what a revoke wants.
            Err(CallError::Refused { status: 404, .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn range(&mut self, prefix: &str) -> Result<Vec<Kv>, StoreError> {
        self.range_with_identity(prefix).map(|(kvs, _)| kvs)
    }

    fn range_with_identity(&mut self, prefix: &str) -> Result<(Vec<Kv>, Identity), StoreError> {
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let v = self.call(
            "kv/range",
            json!({"key": b64(prefix.as_bytes()), "range_end": b64(&end)}),
        )?;
        let mut out = Vec::new();
        for kv in v["kvs"].as_array().into_iter().flatten() {
            let key =
                unb64(kv["key"].as_str().unwrap_or("")).ok_or_else(|| err("bad base64 key"))?;
            let value =
                unb64(kv["value"].as_str().unwrap_or("")).ok_or_else(|| err("bad base64 value"))?;
            out.push(Kv {
                key: String::from_utf8_lossy(&key).into_owned(),
                value: String::from_utf8_lossy(&value).into_owned(),
                create_revision: num(&kv["create_revision"]),
                mod_revision: num(&kv["mod_revision"]),
                lease: num(&kv["lease"]) as LeaseId,
            });
        }
        Ok((out, identity_of(&v["header"])))
    }

    fn put_when(
        &mut self,
        key: &str,
        value: &str,
        lease: LeaseId,
        conds: &[(&str, Cond)],
    ) -> Result<Option<u64>, StoreError> {
        let mut put = json!({"key": b64(key.as_bytes()), "value": b64(value.as_bytes())});
        if lease != 0 {
            put["lease"] = json!(lease.to_string());
        }
        let compare: Vec<Value> = conds.iter().map(|(k, c)| Self::compare(k, *c)).collect();
        let (ok, v) = self.txn(compare, vec![json!({"request_put": put})])?;
        Ok(ok.then(|| num(&v["header"]["revision"])))
    }

    fn delete(&mut self, key: &str, cond: Cond) -> Result<bool, StoreError> {
        let del = json!({"request_delete_range": {"key": b64(key.as_bytes())}});
        Ok(self.txn(vec![Self::compare(key, cond)], vec![del])?.0)
    }

    fn check(&mut self, key: &str, cond: Cond) -> Result<bool, StoreError> {
        Ok(self.txn(vec![Self::compare(key, cond)], vec![])?.0)
    }

    fn identity(&mut self) -> Result<Identity, StoreError> {
        let v = self.call(
            "kv/range",
            json!({"key": b64(b"/sup/"), "count_only": true}),
        )?;
        Ok(identity_of(&v["header"]))
    }

    fn delete_marking(
        &mut self,
        key: &str,
        cond: Cond,
        marker: &str,
        value: &str,
    ) -> Result<bool, StoreError> {
        let del = json!({"request_delete_range": {"key": b64(key.as_bytes())}});
        let put =
            json!({"request_put": {"key": b64(marker.as_bytes()), "value": b64(value.as_bytes())}});
        Ok(self.txn(vec![Self::compare(key, cond)], vec![del, put])?.0)
    }

    /// `/v3/watch` from the revision after `after` (with each deleted key's last
    /// write), on a connection of its own, read until a batch of events or the deadline;
    /// the gateway streams newline-delimited results. A compacted history is a gap. The
    /// stream is kept, and read on by the next call that goes on from its last batch,
    /// until its request's timeout (the deadline of the call that opened it): a watch
    /// costs one request per deadline, not one per batch of events.
    fn watch(&mut self, prefix: &str, after: u64, deadline: Boot) -> Result<Watched, StoreError> {
        let (key, end) = (b64(prefix.as_bytes()), b64(&range_end(prefix)));
        if after == 0 {
            let v = self.call(
                "kv/range",
                json!({"key": key, "range_end": end, "keys_only": true, "limit": 1}),
            )?;
            return Ok(Watched::Gap {
                revision: num(&v["header"]["revision"]),
            });
        }
        let idle = Watched::Changes {
            changes: Vec::new(),
            revision: after,
        };
        let left = deadline.since(Boot::now());
        if left.is_zero() {
            return Ok(idle);
        }
        // The client's timer and this deadline start a moment apart.
        let over = || Boot::now().plus(Duration::from_millis(50)) >= deadline;
        let kept = (self
            .watching
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take())
        .filter(|w| w.prefix == prefix && w.after == after && Boot::now() < w.end);
        let mut stream = match kept {
            Some(w) => w,
            None => match self.open_watch(prefix, after, left)? {
                Some(w) => w,
                None => return Ok(idle),
            },
        };
        let url = stream.url.clone();
        loop {
            let Some(line) = stream.lines.next() else {
                if over() {
                    return Ok(idle);
                }
                return Err(err(format!("{url}: the watch ended")));
            };
            let line = match line {
                Ok(l) => l,
                // The stream's own timeout (every T/3): the next call opens another.
                Err(_) if over() || Boot::now().plus(Duration::from_millis(50)) >= stream.end => {
                    return Ok(idle)
                }
                Err(e) => return Err(err(format!("{url}: {e}"))),
            };
            let v: Value = serde_json::from_str(&line)
                .map_err(|e| err(format!("{url}: not JSON ({e}): {line}")))?;
            if !v["error"].is_null() {
                return Err(err(format!("{url}: {line}")));
            }
            let r = &v["result"];
            if r["canceled"] == true {
                let revision = num(&r["compact_revision"]).max(num(&r["header"]["revision"]));
                return Ok(Watched::Gap { revision });
            }
            let mut changes = Vec::new();
            for e in r["events"].as_array().into_iter().flatten() {
                let k = unb64(e["kv"]["key"].as_str().unwrap_or(""))
                    .ok_or_else(|| err("bad base64 key"))?;
                changes.push(Change {
                    key: String::from_utf8_lossy(&k).into_owned(),
                    revision: num(&e["kv"]["mod_revision"]),
                    deleted: e["type"] == "DELETE",
                    prev: num(&e["prev_kv"]["mod_revision"]),
                });
            }
            if let Some(revision) = changes.iter().map(|c| c.revision).max() {
                stream.after = revision;
                *self.watching.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(stream);
                return Ok(Watched::Changes { changes, revision });
            }
        }
    }
}

impl EtcdStore {
    /// Posts a watch of `prefix` from the revision after `after`, its stream to be read
    /// for `left` at the most.
    fn open_watch(
        &mut self,
        prefix: &str,
        after: u64,
        left: Duration,
    ) -> Result<Option<WatchStream>, StoreError> {
        let (key, end) = (b64(prefix.as_bytes()), b64(&range_end(prefix)));
        let until = Boot::now().plus(left);
        // The endpoint that answered last, with the token of etcd's authentication
        // (got by a call first when there is none yet); on a failure the next call
        // starts at the next endpoint.
        if self.auth.is_some() && self.conn().token.is_none() {
            self.identity()?;
        }
        let n = self.endpoints.len();
        let i = self.conn().current % n;
        let token = self.conn().token.clone().filter(|t| !t.is_empty());
        let url = format!("{}/v3/watch", self.endpoints[i]);
        let body = json!({"create_request": {
            "key": key, "range_end": end, "prev_kv": true,
            "start_revision": (after + 1).to_string(),
        }});
        let mut req = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(left))
            .build()
            .header("content-type", "application/json");
        if let Some(t) = &token {
            req = req.header("authorization", t);
        }
        let resp = match req.send(body.to_string()) {
            Ok(r) => r,
            Err(_) if Boot::now().plus(Duration::from_millis(50)) >= until => return Ok(None),
            Err(e) => {
                self.conn().current = (i + 1) % n;
                return Err(err(format!("{url}: {e}")));
            }
        };
        if resp.status().as_u16() >= 400 {
            if resp.status().as_u16() == 401 {
                self.conn().token = None;
            }
            self.conn().current = (i + 1) % n;
            return Err(err(format!("{url}: {}", resp.status())));
        }
        use std::io::BufRead;
        let lines = std::io::BufReader::new(resp.into_body().into_reader()).lines();
        Ok(Some(WatchStream {
            prefix: prefix.to_string(),
            url,
            after,
            end: until,
            lines,
        }))
    }
}

/// The identity in an answer's header: etcd's `cluster_id` (a new one when the cluster
/// is made anew with other members) and the revision now.
fn identity_of(header: &Value) -> Identity {
    let id = match num(&header["cluster_id"]) {
        0 => String::new(),
        n => format!("etcd:{n:x}"),
    };
    Identity {
        id,
        revision: num(&header["revision"]),
    }
}

/// The end of the range of keys that start with `prefix`.
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as the gateway wants bytes.
pub fn b64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64; `None` on a character outside the alphabet.
pub fn unb64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = B64.iter().position(|x| *x == c)? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits & 0xff) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        assert_eq!(b64(b"/svc/leader"), "L3N2Yy9sZWFkZXI=");
        for s in [
            "",
            "f",
            "fo",
            "foo",
            "foob",
            "fooba",
            "foobar",
            "/sup/lease/engine/",
        ] {
            assert_eq!(
                unb64(&b64(s.as_bytes())).as_deref(),
                Some(s.as_bytes()),
                "{s}"
            );
        }
        assert_eq!(unb64("a!b"), None);
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        for (ms, secs) in [(300, 1), (1000, 1), (1001, 2), (2500, 3), (10_000, 10)] {
            assert_eq!(whole_seconds(Duration::from_millis(ms)), secs, "{ms}ms");
        }
    }

    fn open(urls: &str, opts: &StoreOptions) -> Result<EtcdStore, StoreError> {
        EtcdStore::new(urls, Duration::from_secs(1), opts)
    }

    #[test]
    fn endpoints_are_urls_separated_by_commas() {
        let s = open(
            "http://a:2379, http://b:2379/,HTTPS://c:2379",
            &Default::default(),
        )
        .map_err(|e| e.0)
        .map(|s| s.endpoints);
        assert_eq!(
            s,
            Ok(vec![
                "http://a:2379".to_string(),
                "http://b:2379".to_string(),
                "HTTPS://c:2379".to_string()
            ])
        );
        for bad in ["", "a:2379", "http://a:2379,", "ftp://a", "http://"] {
            let e = open(bad, &Default::default()).err().expect(bad).0;
            assert!(e.contains("not an etcd endpoint"), "{bad}: {e}");
        }
    }

    #[test]
    fn options_that_do_not_go_together_are_said() {
        let file = |s: &str| Some(std::path::PathBuf::from(s));
        let tls = StoreOptions {
            cacert: file("/nowhere/ca.pem"),
            ..Default::default()
        };
        let e = open("http://a:2379", &tls).err().expect("refused").0;
        assert!(e.contains("are for https:// endpoints"), "{e}");
        let e = open("https://a:2379", &tls).err().expect("refused").0;
        assert!(e.contains("cannot read --cacert /nowhere/ca.pem"), "{e}");
        let user = StoreOptions {
            user: Some("node".into()),
            ..Default::default()
        };
        let e = open("http://a:2379", &user).err().expect("refused").0;
        assert!(e.contains("--user needs --password-file"), "{e}");
        let colon = StoreOptions {
            user: Some("node:secret".into()),
            password_file: file("/nowhere/pw"),
            ..Default::default()
        };
        let e = open("http://a:2379", &colon).err().expect("refused").0;
        assert!(e.contains("its password in --password-file"), "{e}");
    }

    #[test]
    fn an_answer_header_names_the_cluster_and_its_revision() {
        let h = json!({"cluster_id": "14841639068965178418", "member_id": "1", "revision": "25", "raft_term": "2"});
        assert_eq!(
            identity_of(&h),
            Identity {
                id: "etcd:cdf818194e3a8c32".into(),
                revision: 25
            }
        );
        assert_eq!(identity_of(&json!({})), Identity::default());
    }

    #[test]
    fn gateway_numbers() {
        assert_eq!(num(&json!("1471729471015842823")), 1471729471015842823);
        assert_eq!(num(&json!(5)), 5);
        assert_eq!(num(&Value::Null), 0, "omitted zero");
    }
}
