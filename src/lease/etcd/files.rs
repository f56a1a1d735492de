//! What the etcd client reads from files: the CA, this node's certificate and key
//! (checked against each other at the start), the password of etcd's user.

use super::err;
use crate::lease::store::{StoreError, StoreOptions};
use std::path::Path;

/// The password for `user` in `file`: its content without the line's end.
pub(super) fn read_password(file: &Path, user: &str) -> Result<String, StoreError> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        err(format!(
            "cannot read --password-file {}: {e}; give a file holding etcd's password for \
             user '{user}' (readable by this user only)",
            file.display()
        ))
    })?;
    let password = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(err(format!(
            "--password-file {} is empty: it must hold etcd's password for user '{user}'",
            file.display()
        )));
    }
    Ok(password.to_string())
}

/// The system's CA bundles, as Debian and RHEL (and SUSE, Alpine) place them.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

const CACERT: &str =
    "give the PEM file of the CA that signed etcd's certificate (etcdctl's --cacert)";
const CERT: &str =
    "give this node's client certificate in PEM, signed by the CA in etcd's --trusted-ca-file";
const KEY: &str = "give the private key of --cert, in PEM and not encrypted";

/// What https endpoints are checked against (`--cacert`, else the system's CAs, else
/// the Mozilla roots built in), and this node's certificate (`--cert`, `--key`).
pub(super) fn tls_config(opts: &StoreOptions) -> Result<ureq::tls::TlsConfig, StoreError> {
    use ureq::tls::{ClientCert, RootCerts, TlsConfig};
    let roots = match &opts.cacert {
        Some(path) => RootCerts::new_with_certs(&certificates(path, "--cacert", CACERT)?),
        None => match SYSTEM_BUNDLES
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .and_then(|p| certificates(p, "the system's CA bundle", "").ok())
        {
            Some(certs) => RootCerts::new_with_certs(&certs),
            None => RootCerts::WebPki,
        },
    };
    let client = match (&opts.cert, &opts.key) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "--cert", CERT)?;
            let (key_pem, pem) = private_key(key)?;
            check_pair(&chain, &pem, cert, key)?;
            Some(ClientCert::new_with_certs(&chain, key_pem))
        }
        (Some(_), None) => {
            return Err(err(
                "--cert needs --key FILE, the private key of the client certificate",
            ))
        }
        (None, Some(_)) => {
            return Err(err(
                "--key needs --cert FILE, the client certificate the key belongs to",
            ))
        }
    };
    Ok(TlsConfig::builder()
        .root_certs(roots)
        .client_cert(client)
        .build())
}

pub(super) fn read_file(path: &Path, flag: &str, what: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| {
        err(format!(
            "cannot read {flag} {}: {e}; {what}",
            path.display()
        ))
    })
}

/// The certificates in a PEM file; at least one.
pub(super) fn certificates(
    path: &Path,
    flag: &str,
    what: &str,
) -> Result<Vec<ureq::tls::Certificate<'static>>, StoreError> {
    let pem = read_file(path, flag, what)?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => {
                return Err(err(format!(
                    "{flag} {}: a bad PEM file ({e}); {what}",
                    path.display()
                )))
            }
        }
    }
    if certs.is_empty() {
        return Err(err(format!(
            "{flag} {} holds no PEM certificate (-----BEGIN CERTIFICATE-----); {what}",
            path.display()
        )));
    }
    Ok(certs)
}

/// The first private key in a PEM file, and the file.
pub(super) fn private_key(
    path: &Path,
) -> Result<(ureq::tls::PrivateKey<'static>, Vec<u8>), StoreError> {
    let pem = read_file(path, "--key", KEY)?;
    let mut found = None;
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::PrivateKey(k)) => {
                found = Some(k);
                break;
            }
            Ok(_) => {}
            Err(e) => {
                return Err(err(format!(
                    "--key {}: a bad PEM file ({e}); {KEY}",
                    path.display()
                )))
            }
        }
    }
    if let Some(k) = found {
        return Ok((k, pem));
    }
    Err(err(format!(
        "--key {} holds no private key (-----BEGIN PRIVATE KEY-----, RSA or EC); {KEY}",
        path.display()
    )))
}

/// That the key is one TLS can use and is the certificate's (checked now: a bad pair
/// would only show at the first connection).
pub(super) fn check_pair(
    chain: &[ureq::tls::Certificate<'static>],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<(), StoreError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |e: &dyn std::fmt::Display| {
        err(format!(
            "--key {} cannot be used with --cert {} ({e}): give the private key the \
             certificate was made for",
            key_path.display(),
            cert_path.display()
        ))
    };
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| bad(&e))?;
    let chain: Vec<CertificateDer<'static>> = chain
        .iter()
        .map(|c| CertificateDer::from(c.der().to_vec()))
        .collect();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(err)?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain, key)
        .map(|_| ())
        .map_err(|e| bad(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_file_loses_its_line_end() {
        let dir = crate::scratch::Scratch::new("etcd-pw");
        for (text, want) in [("pw\n", Ok("pw")), ("pw\r\n", Ok("pw")), ("p w", Ok("p w"))] {
            std::fs::write(dir.join("pw"), text).expect("write");
            assert_eq!(
                read_password(&dir.join("pw"), "u").map_err(|e| e.0),
                want.map(String::from)
            );
        }
        std::fs::write(dir.join("pw"), "\n").expect("write");
        let e = read_password(&dir.join("pw"), "u").expect_err("empty");
        assert!(e.0.contains("is empty"), "{e}");
    }
}
