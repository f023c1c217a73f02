#ifndef C_UPLOAD_CERTIFICATES_H
#define C_UPLOAD_CERTIFICATES_H

/// `upload-relay serve --dev`'s certificates, made with the system's libcrypto (OpenSSL 3): P-256 keys, a CA and a
/// server certificate signed by it. Every function returns 0 on success; on failure -1 and, in *error, what libcrypto
/// said (free it with upload_certificates_free). PEM text out is allocated, freed with upload_certificates_free.

/// A new P-256 private key, as PKCS#8 PEM.
int upload_certificates_make_key(char **key_pem, char **error);

/// Whether `key_pem` is a private key libcrypto can read (1) or not (0).
int upload_certificates_key_is_valid(const char *key_pem);

/// A v3 certificate for the public key of `subject_key_pem`, named O=organization, CN=common_name, valid from an hour
/// ago for `days` days, signed (ECDSA with SHA-256) by `issuer_key_pem`. With `issuer_certificate_pem` NULL it is a
/// self-signed CA (basicConstraints CA:TRUE pathlen 0, keyUsage keyCertSign and cRLSign, both critical); otherwise a
/// server certificate issued by that CA (CA:FALSE, keyUsage digitalSignature, extendedKeyUsage serverAuth, and the
/// subjectAltName entries: `dns_count` DNS names, `ip_count` IP addresses in text, IPv4 or IPv6).
int upload_certificates_make_certificate(
    const char *subject_key_pem, const char *issuer_key_pem, const char *issuer_certificate_pem,
    const char *organization, const char *common_name, int days,
    const char *const *dns_names, int dns_count, const char *const *ip_addresses, int ip_count,
    char **certificate_pem, char **error);

void upload_certificates_free(void *pointer);

#endif
