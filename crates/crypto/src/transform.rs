//! IANA "Internet Key Exchange Version 2 (IKEv2) Parameters": transform types and IDs
//! (RFC 7296 §3.3.2). Open newtypes: unknown values are representable and print in hex.

wire::iana_registry! {
    /// Transform Type (RFC 7296 §3.3.2).
    TransformType(u8) {
        /// Encryption algorithm.
        ENCR = 1,
        /// Pseudorandom function.
        PRF = 2,
        /// Integrity algorithm.
        INTEG = 3,
        /// Key exchange method (Diffie-Hellman group).
        KE = 4,
        /// Extended sequence numbers.
        ESN = 5,
    }
}

wire::iana_registry! {
    /// Transform Type 1 - Encryption Algorithm Transform IDs.
    EncrId(u16) {
        /// ENCR_3DES (not supported, recognised only).
        DES3 = 3,
        /// ENCR_NULL.
        NULL = 11,
        /// ENCR_AES_CBC (RFC 3602), key length attribute required.
        AES_CBC = 12,
        /// ENCR_AES_CTR (RFC 3686).
        AES_CTR = 13,
        /// ENCR_AES_GCM_8 (RFC 4106).
        AES_GCM_8 = 18,
        /// ENCR_AES_GCM_12 (RFC 4106).
        AES_GCM_12 = 19,
        /// ENCR_AES_GCM_16 (RFC 4106).
        AES_GCM_16 = 20,
        /// ENCR_CHACHA20_POLY1305 (RFC 7634).
        CHACHA20_POLY1305 = 28,
    }
}

wire::iana_registry! {
    /// Transform Type 2 - Pseudorandom Function Transform IDs.
    PrfId(u16) {
        /// PRF_HMAC_MD5 (not supported).
        HMAC_MD5 = 1,
        /// PRF_HMAC_SHA1.
        HMAC_SHA1 = 2,
        /// PRF_AES128_XCBC (not supported).
        AES128_XCBC = 4,
        /// PRF_HMAC_SHA2_256.
        HMAC_SHA2_256 = 5,
        /// PRF_HMAC_SHA2_384.
        HMAC_SHA2_384 = 6,
        /// PRF_HMAC_SHA2_512.
        HMAC_SHA2_512 = 7,
    }
}

wire::iana_registry! {
    /// Transform Type 3 - Integrity Algorithm Transform IDs.
    IntegId(u16) {
        /// NONE (with AEAD ciphers).
        NONE = 0,
        /// AUTH_HMAC_MD5_96 (not supported).
        HMAC_MD5_96 = 1,
        /// AUTH_HMAC_SHA1_96 (RFC 2404).
        HMAC_SHA1_96 = 2,
        /// AUTH_AES_XCBC_96 (not supported).
        AES_XCBC_96 = 5,
        /// AUTH_HMAC_SHA2_256_128 (RFC 4868).
        HMAC_SHA2_256_128 = 12,
        /// AUTH_HMAC_SHA2_384_192 (RFC 4868).
        HMAC_SHA2_384_192 = 13,
        /// AUTH_HMAC_SHA2_512_256 (RFC 4868).
        HMAC_SHA2_512_256 = 14,
    }
}

wire::iana_registry! {
    /// Transform Type 4 - Key Exchange Method Transform IDs (Diffie-Hellman groups).
    KeId(u16) {
        /// NONE (no PFS in a CHILD_SA proposal).
        NONE = 0,
        /// 1024-bit MODP (not supported).
        MODP1024 = 2,
        /// 2048-bit MODP Group (RFC 3526).
        MODP2048 = 14,
        /// 3072-bit MODP Group (not supported).
        MODP3072 = 15,
        /// 256-bit random ECP group (RFC 5903).
        ECP256 = 19,
        /// 384-bit random ECP group (RFC 5903).
        ECP384 = 20,
        /// 521-bit random ECP group (not supported).
        ECP521 = 21,
        /// Curve25519 (RFC 8031).
        CURVE25519 = 31,
        /// Curve448 (not supported).
        CURVE448 = 32,
    }
}

wire::iana_registry! {
    /// Transform Type 5 - Extended Sequence Numbers Transform IDs.
    EsnId(u16) {
        /// No Extended Sequence Numbers.
        NO_ESN = 0,
        /// Extended Sequence Numbers.
        ESN = 1,
    }
}

/// Transform attribute type "Key Length" (RFC 7296 §3.3.5), always TV format.
pub const ATTR_KEY_LENGTH: u16 = 14;
