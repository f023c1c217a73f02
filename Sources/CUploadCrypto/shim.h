#ifndef C_UPLOAD_CRYPTO_SHIM_H
#define C_UPLOAD_CRYPTO_SHIM_H
/* SHA-1 with an inspectable context: the low-level SHA1_* calls are the only
   libcrypto API whose state can be exported and imported again (EVP hides it).
   They are deprecated in OpenSSL 3 but supported; silence the notice here only. */
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include <openssl/sha.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif
