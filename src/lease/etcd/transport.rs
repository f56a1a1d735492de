//! How a call reaches etcd: one endpoint at a time, within the call's time; its
//! token for etcd's authentication; its failures said for people, and whether the
//! request may have reached etcd (what decides whether it may be sent again elsewhere).

use super::files::read_password;
use super::{err, EtcdStore};
use crate::lease::store::StoreError;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// etcd's authentication: the user, and the file its password is read from at each
/// authentication (a changed password is picked up without a restart).
pub(super) struct Auth {
    pub(super) user: String,
    pub(super) password_file: PathBuf,
}

/// What one call leaves for the next.
#[derive(Default)]
pub(super) struct Conn {
    /// The endpoint that answered last: the next call starts there.
    pub(super) current: usize,
    /// etcd's token for `auth` once authenticated; empty when etcd's authentication
    /// turned out to be off.
    pub(super) token: Option<String>,
}

/// Why one endpoint gave no answer to use.
pub(super) enum Fail {
    /// etcd answered with an error: its HTTP status, its own words (`said`: what the
    /// callers that must tell one refusal from another read, as etcd gives no finer
    /// code), and the error as the operator reads it (the URL, the status, the words and
    /// a hint).
    Answer {
        status: u16,
        said: String,
        error: StoreError,
    },
    /// The request never reached etcd (refused, unreachable, no TLS session): any other
    /// endpoint may be asked.
    Unsent(String),
    /// The request may have reached etcd (no answer in time, the connection lost): a read
    /// is asked of the next endpoint, a write is not repeated.
    Lost(String),
}

impl EtcdStore {
    pub(super) fn conn(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One endpoint: connected within `connect`, answered within `total`; authenticated
    /// first when etcd's authentication is used and there is no token yet, and again
    /// when etcd says the token is no good any more (expired, invalidated by a password
    /// change, from before a restart).
    pub(super) fn attempt(
        &self,
        i: usize,
        path: &str,
        body: &Value,
        connect: Duration,
        total: Duration,
    ) -> Result<Value, Fail> {
        let base = &self.endpoints[i];
        let deadline = Instant::now() + total;
        let Some(auth) = &self.auth else {
            return self.post(base, path, body, None, connect, deadline);
        };
        let token = self.conn().token.clone();
        let token = match token {
            Some(t) => t,
            None => self.authenticate(base, auth, connect, deadline)?,
        };
        match self.post(base, path, body, Some(&token), connect, deadline) {
            Err(Fail::Answer { said, error, .. }) if token_refused(&said) => {
                log::info!(
                    "{base}: etcd no longer takes this node's token ({error}); authenticating again"
                );
                self.conn().token = None;
                let token = self.authenticate(base, auth, connect, deadline)?;
                self.post(base, path, body, Some(&token), connect, deadline)
            }
            r => r,
        }
    }

    /// Authenticates `auth` at `base`: the token, remembered for the next calls (empty
    /// when etcd's authentication is off). Nothing of the call itself was sent yet, so a
    /// failure here leaves any endpoint free to be asked.
    pub(super) fn authenticate(
        &self,
        base: &str,
        auth: &Auth,
        connect: Duration,
        deadline: Instant,
    ) -> Result<String, Fail> {
        let password =
            read_password(&auth.password_file, &auth.user).map_err(|error| Fail::Answer {
                status: 400,
                said: String::new(),
                error,
            })?;
        let body = json!({"name": auth.user, "password": password});
        let token = match self.post(base, "auth/authenticate", &body, None, connect, deadline) {
            Ok(v) => match v["token"].as_str() {
                Some(t) if !t.is_empty() => t.to_string(),
                _ => {
                    return Err(Fail::Unsent(format!(
                        "{base}: etcd authenticated user '{}' without a token: {v}",
                        auth.user
                    )))
                }
            },
            Err(Fail::Answer { said, .. }) if said.contains("authentication is not enabled") => {
                log::info!("{base}: etcd's authentication is off; --user is not used");
                String::new()
            }
            Err(Fail::Answer { status, said, .. }) if said.contains("authentication failed") => {
                return Err(Fail::Answer {
                    status,
                    said,
                    error: err(format!(
                        "{base}: etcd refused user '{}': wrong user name or password (the \
                         password is read from {}); check --user and --password-file \
                         (etcdctl user passwd {} changes it)",
                        auth.user,
                        auth.password_file.display(),
                        auth.user
                    )),
                })
            }
            // The call itself was not sent: another endpoint may be asked.
            Err(Fail::Lost(e)) => return Err(Fail::Unsent(e)),
            Err(Fail::Answer { status, error, .. }) if status >= 500 => {
                return Err(Fail::Unsent(error.0))
            }
            Err(e) => return Err(e),
        };
        self.conn().token = Some(token.clone());
        Ok(token)
    }

    /// One POST of `body` to `base/v3/PATH`, with `token` when there is one.
    pub(super) fn post(
        &self,
        base: &str,
        path: &str,
        body: &Value,
        token: Option<&str>,
        connect: Duration,
        deadline: Instant,
    ) -> Result<Value, Fail> {
        let url = format!("{base}/v3/{path}");
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Fail::Unsent(format!("{base}: no time left to ask it")));
        }
        let mut req = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(left))
            .timeout_connect(Some(connect.min(left)))
            .build()
            .header("content-type", "application/json");
        if let Some(t) = token.filter(|t| !t.is_empty()) {
            req = req.header("authorization", t);
        }
        let mut resp = req
            .send(body.to_string())
            .map_err(|e| self.failed(base, e, connect.min(left), left))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| Fail::Lost(format!("{url}: the answer was cut: {e}")))?;
        // A keepalive answers a stream of lines: the first one is enough.
        let first = text.lines().next().unwrap_or("");
        let v: Value = match serde_json::from_str(first) {
            Ok(v) => v,
            Err(_) if status >= 400 => {
                return Err(Fail::Answer {
                    status,
                    said: first.to_string(),
                    error: err(format!("{url}: {status}: {first}")),
                })
            }
            Err(e) => {
                return Err(Fail::Lost(format!(
                    "{url}: not JSON ({e}): {first}; is this etcd's client URL?"
                )))
            }
        };
        if status >= 400 {
            let said = v["message"]
                .as_str()
                .or(v["error"].as_str())
                .unwrap_or(first);
            return Err(Fail::Answer {
                status,
                said: said.to_string(),
                error: err(format!("{url}: {status}: {said}{}", self.hint(said))),
            });
        }
        Ok(v)
    }

    /// What an operator does about an error etcd answered.
    pub(super) fn hint(&self, said: &str) -> String {
        let user = self.auth.as_ref().map(|a| a.user.as_str());
        if said.contains("user name is empty") && user.is_none() {
            return "; etcd's authentication is on: give --user NAME --password-file FILE".into();
        }
        if said.contains("permission denied") {
            let who = match user {
                Some(u) => format!("etcd user '{u}'"),
                None => "the user this node is to etcd".to_string(),
            };
            return format!(
                "; {who} may not do this: grant its role readwrite on the prefix /sup/ \
                 (etcdctl role grant-permission ROLE --prefix=true readwrite /sup/)"
            );
        }
        String::new()
    }

    /// An error of ureq, said for people: whether the request may have reached etcd.
    pub(super) fn failed(
        &self,
        base: &str,
        e: ureq::Error,
        connect: Duration,
        total: Duration,
    ) -> Fail {
        use std::io::ErrorKind as K;
        use ureq::Timeout as T;
        match e {
            ureq::Error::Io(io)
                if matches!(
                    io.kind(),
                    K::ConnectionRefused
                        | K::HostUnreachable
                        | K::NetworkUnreachable
                        | K::AddrNotAvailable
                ) =>
            {
                Fail::Unsent(format!("{base}: cannot connect: {io}"))
            }
            ureq::Error::Io(io) => match tls_error(&io) {
                Some(t) => Fail::Unsent(self.tls_failed(base, t)),
                None if https(base)
                    && matches!(
                        io.kind(),
                        K::BrokenPipe
                            | K::ConnectionReset
                            | K::ConnectionAborted
                            | K::UnexpectedEof
                    ) =>
                {
                    // etcd ends a TLS session whose client certificate it refuses
                    // (TLS 1.3 tells after the handshake, when the request is on its way).
                    Fail::Lost(format!(
                        "{base}: {io}: etcd closed the connection; {}",
                        if self.client_cert {
                            "check that --cert is signed by the CA in etcd's \
                             --trusted-ca-file and made for client auth"
                        } else {
                            "if it runs with --client-cert-auth it wants a client \
                             certificate: give --cert FILE --key FILE"
                        }
                    ))
                }
                None => Fail::Lost(format!("{base}: {io}")),
            },
            ureq::Error::Timeout(T::Resolve | T::Connect) => Fail::Unsent(format!(
                "{base}: no connection within {}",
                crate::time::Human(connect)
            )),
            ureq::Error::Timeout(_) => Fail::Lost(format!(
                "{base}: no answer within {}",
                crate::time::Human(total)
            )),
            ureq::Error::HostNotFound => {
                Fail::Unsent(format!("{base}: no such host (its name does not resolve)"))
            }
            ureq::Error::ConnectionFailed => Fail::Unsent(format!("{base}: cannot connect")),
            ureq::Error::Rustls(t) => Fail::Unsent(self.tls_failed(base, &t)),
            ureq::Error::Tls(t) => Fail::Unsent(format!("{base}: TLS: {t}")),
            e => Fail::Lost(format!("{base}: {e}")),
        }
    }

    /// A TLS failure, with what to do about it.
    pub(super) fn tls_failed(&self, base: &str, e: &rustls::Error) -> String {
        use rustls::{AlertDescription as A, CertificateError as C, Error as E};
        let what = match e {
            E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
                if self.cacert {
                    "etcd's certificate is not signed by the CA in --cacert: give the CA that \
                     signed etcd's --cert-file"
                } else {
                    "etcd's certificate is not signed by a CA this node trusts: give --cacert \
                     FILE, the CA that signed etcd's --cert-file"
                }
            }
            E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                "etcd's certificate is not made for this host name or address: name etcd in \
                 STORE as its certificate does (its subjectAltName)"
            }
            E::InvalidCertificate(
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. },
            ) => {
                "etcd's certificate has expired or is not valid yet: renew it, or check the clocks"
            }
            E::AlertReceived(
                A::CertificateRequired | A::BadCertificate | A::HandshakeFailure | A::UnknownCA,
            ) if !self.client_cert => {
                "etcd refused the connection without a client certificate (it runs with \
                 --client-cert-auth): give --cert FILE --key FILE, signed by the CA in its \
                 --trusted-ca-file"
            }
            E::AlertReceived(
                A::CertificateRequired
                | A::BadCertificate
                | A::UnknownCA
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnsupportedCertificate,
            ) => {
                "etcd refused this node's client certificate (--cert): give one signed by the \
                 CA in etcd's --trusted-ca-file, valid now and made for client auth"
            }
            _ => "check that this is etcd's https:// client URL, and --cacert, --cert and --key",
        };
        format!("{base}: TLS failed ({e}): {what}")
    }
}

/// Whether a call may be sent again to another endpoint after its request may have
/// reached etcd: reads, unconditional writes (the same again changes nothing), and
/// lease calls (a repeated grant leaves a lease no one renews, which ends at its TTL).
/// A conditional write may not: done once, it would fail its condition the second
/// time and be taken for lost (a node that created `leader` would not know it).
pub(super) fn repeatable(path: &str, body: &Value) -> bool {
    let empty = |v: &Value| v.as_array().is_none_or(|a| a.is_empty());
    match path {
        "kv/txn" => empty(&body["compare"]) || empty(&body["success"]),
        "kv/range"
        | "lease/grant"
        | "lease/keepalive"
        | "lease/revoke"
        | "lease/timetolive"
        | "maintenance/status"
        | "cluster/member/list" => true,
        _ => false,
    }
}

pub(super) fn https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

/// Whether etcd refused a token it gave (expired, invalidated, from an older auth store)
/// or wants one it was not sent: authenticating again helps.
pub(super) fn token_refused(said: &str) -> bool {
    [
        "invalid auth token",
        "auth token",
        "revision of auth store is old",
        "user name is empty",
    ]
    .iter()
    .any(|s| said.contains(s))
}

/// The TLS error inside an I/O error, when it is one (an alert read after the handshake).
pub(super) fn tls_error(io: &std::io::Error) -> Option<&rustls::Error> {
    io.get_ref()?.downcast_ref::<rustls::Error>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_changes_nothing_the_second_time_is_sent_again() {
        let put = json!({"request_put": {"key": "a"}});
        let cond = json!({"key": "a", "target": "CREATE"});
        assert!(repeatable("kv/range", &json!({})));
        assert!(repeatable("lease/keepalive", &json!({})));
        assert!(repeatable(
            "kv/txn",
            &json!({"compare": [cond], "success": []})
        ));
        assert!(repeatable(
            "kv/txn",
            &json!({"compare": [], "success": [put]})
        ));
        assert!(!repeatable(
            "kv/txn",
            &json!({"compare": [cond], "success": [put]})
        ));
        assert!(!repeatable("kv/put", &json!({})));
    }
}
