#include "CUploadCertificates.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

void upload_certificates_free(void *pointer) {
    free(pointer);
}

/// Sets *error to `what` and libcrypto's last error, and returns -1.
static int fail(char **error, const char *what) {
    char detail[256] = "";
    unsigned long code = ERR_get_error();
    if (code != 0) ERR_error_string_n(code, detail, sizeof detail);
    ERR_clear_error();
    if (error != NULL) {
        size_t length = strlen(what) + strlen(detail) + 3;
        *error = malloc(length);
        if (*error != NULL) snprintf(*error, length, "%s%s%s", what, detail[0] ? ": " : "", detail);
    }
    return -1;
}

/// What `bio` holds, as a NUL-terminated string in *out (malloc'd).
static int take_text(BIO *bio, char **out) {
    char *data = NULL;
    long length = BIO_get_mem_data(bio, &data);
    if (length < 0 || (*out = malloc((size_t)length + 1)) == NULL) return -1;
    memcpy(*out, data, (size_t)length);
    (*out)[length] = 0;
    return 0;
}

static EVP_PKEY *read_key(const char *pem) {
    BIO *bio = BIO_new_mem_buf(pem, -1);
    if (bio == NULL) return NULL;
    EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
    BIO_free(bio);
    return key;
}

int upload_certificates_make_key(char **key_pem, char **error) {
    EVP_PKEY *key = EVP_EC_gen("P-256");
    if (key == NULL) return fail(error, "cannot make a P-256 key");
    BIO *bio = BIO_new(BIO_s_mem());
    int status = -1;
    if (bio != NULL && PEM_write_bio_PrivateKey(bio, key, NULL, NULL, 0, NULL, NULL) == 1 && take_text(bio, key_pem) == 0) {
        status = 0;
    } else {
        fail(error, "cannot write a private key");
    }
    BIO_free(bio);
    EVP_PKEY_free(key);
    return status;
}

int upload_certificates_key_is_valid(const char *key_pem) {
    EVP_PKEY *key = read_key(key_pem);
    ERR_clear_error();
    if (key == NULL) return 0;
    EVP_PKEY_free(key);
    return 1;
}

static int add_extension(X509 *certificate, X509V3_CTX *context, int nid, const char *value) {
    X509_EXTENSION *extension = X509V3_EXT_conf_nid(NULL, context, nid, value);
    if (extension == NULL) return -1;
    int added = X509_add_ext(certificate, extension, -1);
    X509_EXTENSION_free(extension);
    return added == 1 ? 0 : -1;
}

/// The subjectAltName entries, built one by one (a name is never parsed as configuration text).
static int add_alternative_names(X509 *certificate, const char *const *dns_names, int dns_count, const char *const *ip_addresses,
                                 int ip_count) {
    GENERAL_NAMES *names = sk_GENERAL_NAME_new_null();
    if (names == NULL) return -1;
    int status = 0;
    for (int i = 0; i < dns_count && status == 0; i++) {
        GENERAL_NAME *name = GENERAL_NAME_new();
        ASN1_IA5STRING *text = ASN1_IA5STRING_new();
        if (name == NULL || text == NULL || ASN1_STRING_set(text, dns_names[i], -1) != 1) {
            GENERAL_NAME_free(name);
            ASN1_IA5STRING_free(text);
            status = -1;
            break;
        }
        GENERAL_NAME_set0_value(name, GEN_DNS, text);
        if (sk_GENERAL_NAME_push(names, name) == 0) {
            GENERAL_NAME_free(name);
            status = -1;
        }
    }
    for (int i = 0; i < ip_count && status == 0; i++) {
        ASN1_OCTET_STRING *address = a2i_IPADDRESS(ip_addresses[i]);
        GENERAL_NAME *name = GENERAL_NAME_new();
        if (address == NULL || name == NULL) {
            ASN1_OCTET_STRING_free(address);
            GENERAL_NAME_free(name);
            status = -1;
            break;
        }
        GENERAL_NAME_set0_value(name, GEN_IPADD, address);
        if (sk_GENERAL_NAME_push(names, name) == 0) {
            GENERAL_NAME_free(name);
            status = -1;
        }
    }
    if (status == 0 && X509_add1_ext_i2d(certificate, NID_subject_alt_name, names, 0, X509V3_ADD_DEFAULT) != 1) status = -1;
    GENERAL_NAMES_free(names);
    return status;
}

int upload_certificates_make_certificate(const char *subject_key_pem, const char *issuer_key_pem, const char *issuer_certificate_pem,
                                         const char *organization, const char *common_name, int days, const char *const *dns_names,
                                         int dns_count, const char *const *ip_addresses, int ip_count, char **certificate_pem,
                                         char **error) {
    int status = -1;
    const char *what = "cannot make a certificate";
    EVP_PKEY *subject_key = read_key(subject_key_pem);
    EVP_PKEY *issuer_key = read_key(issuer_key_pem);
    X509 *issuer = NULL;
    X509 *certificate = X509_new();
    X509_NAME *name = X509_NAME_new();
    BIGNUM *serial = BN_new();
    BIO *out = BIO_new(BIO_s_mem());
    if (subject_key == NULL || issuer_key == NULL) {
        what = "cannot read a private key";
        goto done;
    }
    if (issuer_certificate_pem != NULL) {
        BIO *bio = BIO_new_mem_buf(issuer_certificate_pem, -1);
        issuer = bio != NULL ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
        BIO_free(bio);
        if (issuer == NULL) {
            what = "cannot read the CA certificate";
            goto done;
        }
    }
    if (certificate == NULL || name == NULL || serial == NULL || out == NULL) goto done;
    // A random positive 127-bit serial.
    if (BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1) goto done;
    if (X509_set_version(certificate, X509_VERSION_3) != 1) goto done;
    if (BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(certificate)) == NULL) goto done;
    if (X509_gmtime_adj(X509_getm_notBefore(certificate), -3600) == NULL) goto done;
    if (X509_time_adj_ex(X509_getm_notAfter(certificate), days, 0, NULL) == NULL) goto done;
    if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, (const unsigned char *)organization, -1, -1, 0) != 1) goto done;
    if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)common_name, -1, -1, 0) != 1) goto done;
    if (X509_set_subject_name(certificate, name) != 1) goto done;
    if (X509_set_issuer_name(certificate, issuer != NULL ? X509_get_subject_name(issuer) : name) != 1) goto done;
    if (X509_set_pubkey(certificate, subject_key) != 1) goto done;
    X509V3_CTX context;
    X509V3_set_ctx(&context, issuer != NULL ? issuer : certificate, certificate, NULL, NULL, 0);
    if (issuer == NULL) {
        if (add_extension(certificate, &context, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") != 0) goto done;
        if (add_extension(certificate, &context, NID_key_usage, "critical,keyCertSign,cRLSign") != 0) goto done;
    } else {
        if (add_extension(certificate, &context, NID_basic_constraints, "critical,CA:FALSE") != 0) goto done;
        if (add_extension(certificate, &context, NID_key_usage, "critical,digitalSignature") != 0) goto done;
        if (add_extension(certificate, &context, NID_ext_key_usage, "serverAuth") != 0) goto done;
        if (add_alternative_names(certificate, dns_names, dns_count, ip_addresses, ip_count) != 0) {
            what = "cannot put the names in the certificate";
            goto done;
        }
    }
    if (X509_sign(certificate, issuer_key, EVP_sha256()) <= 0) goto done;
    if (PEM_write_bio_X509(out, certificate) != 1 || take_text(out, certificate_pem) != 0) goto done;
    status = 0;
done:
    if (status != 0) fail(error, what);
    BIO_free(out);
    BN_free(serial);
    X509_NAME_free(name);
    X509_free(certificate);
    X509_free(issuer);
    EVP_PKEY_free(subject_key);
    EVP_PKEY_free(issuer_key);
    return status;
}
