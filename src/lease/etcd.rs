//! etcd v3 through its JSON gateway (`/v3/...`, etcd 3.4), over plain HTTP/1.1 with a
//! small synchronous client. What etcd does that matters here (../shared/notes):
//! keys and values are base64; 64-bit numbers come back as strings; zero and false
//! fields are omitted (a failed transaction has no "succeeded"); a keepalive of a dead
//! lease has no TTL; a keepalive succeeds even after someone else took a key, so
//! ownership is proven by a transaction (`check`).

use super::store::{Change, Cond, Kv, LeaseId, Store, StoreError, Watched};
use crate::time::Boot;
use serde_json::{json, Value};
use std::time::Duration;

/// A client of one etcd endpoint.
pub struct EtcdStore {
    base: String,
    agent: ureq::Agent,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl EtcdStore {
    /// `http://HOST:PORT`.
    /// Every call gives up after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<EtcdStore, StoreError> {
        if !url.starts_with("http://") {
            return Err(err(format!(
                "'{url}': the etcd store speaks plain http://HOST:PORT"
            )));
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build();
        Ok(EtcdStore {
            base: url.trim_end_matches('/').to_string(),
            agent: config.into(),
        })
    }

    /// POSTs `body` to `/v3/PATH`; the JSON answer, or the gateway's error.
    fn call(&self, path: &str, body: Value) -> Result<Value, StoreError> {
        let url = format!("{}/v3/{path}", self.base);
        let mut resp = self
            .agent
            .post(&url)
            .header("content-type", "application/json")
            .send(body.to_string())
            .map_err(|e| err(format!("{url}: {e}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| err(format!("{url}: {e}")))?;
        // A keepalive answers a stream of lines: the first one is enough.
        let first = text.lines().next().unwrap_or("");
        let v: Value = serde_json::from_str(first)
            .map_err(|e| err(format!("{url}: not JSON ({e}): {first}")))?;
        if status >= 400 {
            return Err(err(format!(
                "{url}: {status}: {}",
                v["message"]
                    .as_str()
                    .or(v["error"].as_str())
                    .unwrap_or(first)
            )));
        }
        Ok(v)
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
        match self.call("lease/revoke", json!({"ID": id.to_string()})) {
            Ok(_) => Ok(()),
            // Already gone: what a revoke wants.
            Err(e) if e.0.contains(": 404:") => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn range(&mut self, prefix: &str) -> Result<Vec<Kv>, StoreError> {
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
        Ok(out)
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
    /// the gateway streams newline-delimited results. A compacted history is a gap.
    fn watch(&mut self, prefix: &str, after: u64, deadline: Boot) -> Result<Watched, StoreError> {
        use std::io::BufRead;
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
        let url = format!("{}/v3/watch", self.base);
        let body = json!({"create_request": {
            "key": key, "range_end": end, "prev_kv": true,
            "start_revision": (after + 1).to_string(),
        }});
        let resp = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(left))
            .build()
            .header("content-type", "application/json")
            .send(body.to_string());
        let resp = match resp {
            Ok(r) => r,
            Err(_) if over() => return Ok(idle),
            Err(e) => return Err(err(format!("{url}: {e}"))),
        };
        if resp.status().as_u16() >= 400 {
            return Err(err(format!("{url}: {}", resp.status())));
        }
        let lines = std::io::BufReader::new(resp.into_body().into_reader()).lines();
        for line in lines {
            let line = match line {
                Ok(l) => l,
                Err(_) if over() => return Ok(idle),
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
                return Ok(Watched::Changes { changes, revision });
            }
        }
        if over() {
            return Ok(idle);
        }
        Err(err(format!("{url}: the watch ended")))
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

    #[test]
    fn gateway_numbers() {
        assert_eq!(num(&json!("1471729471015842823")), 1471729471015842823);
        assert_eq!(num(&json!(5)), 5);
        assert_eq!(num(&Value::Null), 0, "omitted zero");
    }
}
