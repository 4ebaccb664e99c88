//! IANA "Internet Key Exchange Version 2 (IKEv2) Parameters" registries used in the message
//! header and payloads (RFC 7296 §3). Open newtypes: unknown values are representable and print
//! in hex.

crate::iana_registry! {
    /// Exchange Type (RFC 7296 §3.1).
    ExchangeType(u8) {
        /// IKE_SA_INIT.
        IKE_SA_INIT = 34,
        /// IKE_AUTH.
        IKE_AUTH = 35,
        /// CREATE_CHILD_SA.
        CREATE_CHILD_SA = 36,
        /// INFORMATIONAL.
        INFORMATIONAL = 37,
        /// IKE_SESSION_RESUME (RFC 5723).
        IKE_SESSION_RESUME = 38,
        /// IKE_INTERMEDIATE (RFC 9242).
        IKE_INTERMEDIATE = 43,
        /// IKE_FOLLOWUP_KE (RFC 9370).
        IKE_FOLLOWUP_KE = 44,
    }
}

crate::iana_registry! {
    /// Payload Type, the "Next Payload" values (RFC 7296 §3.2).
    PayloadType(u8) {
        /// No Next Payload.
        NONE = 0,
        /// Security Association.
        SA = 33,
        /// Key Exchange.
        KE = 34,
        /// Identification - Initiator.
        IDI = 35,
        /// Identification - Responder.
        IDR = 36,
        /// Certificate.
        CERT = 37,
        /// Certificate Request.
        CERTREQ = 38,
        /// Authentication.
        AUTH = 39,
        /// Nonce.
        NONCE = 40,
        /// Notify.
        NOTIFY = 41,
        /// Delete.
        DELETE = 42,
        /// Vendor ID.
        VENDOR_ID = 43,
        /// Traffic Selector - Initiator.
        TSI = 44,
        /// Traffic Selector - Responder.
        TSR = 45,
        /// Encrypted and Authenticated.
        SK = 46,
        /// Configuration.
        CP = 47,
        /// Extensible Authentication.
        EAP = 48,
        /// Generic Secure Password Methods (RFC 6467).
        GSPM = 49,
        /// Encrypted and Authenticated Fragment (RFC 7383).
        SKF = 53,
        /// Puzzle Solution (RFC 8019).
        PS = 54,
    }
}

impl PayloadType {
    /// True for the payload types RFC 7296 defines (33..=48), for which the critical bit MUST be
    /// ignored (RFC 7296 §3.2: "MUST be ignored ... for payload types defined in this document").
    pub fn is_rfc7296(self) -> bool {
        (33..=48).contains(&self.0)
    }
}

crate::iana_registry! {
    /// Notify Message Type (RFC 7296 §3.10.1 and the IANA registry). Values below 16384 are
    /// errors, the rest status types.
    NotifyType(u16) {
        /// A critical payload was not understood.
        UNSUPPORTED_CRITICAL_PAYLOAD = 1,
        /// The IKE SPI is not known.
        INVALID_IKE_SPI = 4,
        /// The major version is not supported.
        INVALID_MAJOR_VERSION = 5,
        /// The message was malformed.
        INVALID_SYNTAX = 7,
        /// The message ID was out of range.
        INVALID_MESSAGE_ID = 9,
        /// An ESP/AH SPI is not known.
        INVALID_SPI = 11,
        /// None of the proposals was acceptable.
        NO_PROPOSAL_CHOSEN = 14,
        /// The KE payload's group was not the selected one; data = the wanted group (2 bytes).
        INVALID_KE_PAYLOAD = 17,
        /// Authentication failed.
        AUTHENTICATION_FAILED = 24,
        /// Only a single pair of traffic selectors is acceptable.
        SINGLE_PAIR_REQUIRED = 34,
        /// No more CHILD_SAs are accepted.
        NO_ADDITIONAL_SAS = 35,
        /// No internal address could be assigned.
        INTERNAL_ADDRESS_FAILURE = 36,
        /// A CP payload was required.
        FAILED_CP_REQUIRED = 37,
        /// The traffic selectors are not acceptable.
        TS_UNACCEPTABLE = 38,
        /// An ESP packet did not match the SA's selectors.
        INVALID_SELECTORS = 39,
        /// The request cannot be served now; retry later (RFC 7296 §2.25).
        TEMPORARY_FAILURE = 43,
        /// The CHILD_SA to rekey or delete does not exist.
        CHILD_SA_NOT_FOUND = 44,
        /// Invalid group ID (RFC 6407).
        INVALID_GROUP_ID = 45,
        /// Authorization failed (RFC 6407).
        AUTHORIZATION_FAILED = 46,
        /// State not found (RFC 9370).
        STATE_NOT_FOUND = 47,
        /// The responder will not create more CHILD_SAs with these traffic selectors
        /// (RFC 9611 §3.2): the initiator stops asking until one of them is gone.
        TS_MAX_QUEUE = 48,
        /// This is the first IKE SA with the peer (RFC 7296 §2.4).
        INITIAL_CONTACT = 16384,
        /// Message ID window size.
        SET_WINDOW_SIZE = 16385,
        /// More traffic selectors would be acceptable.
        ADDITIONAL_TS_POSSIBLE = 16386,
        /// IP compression supported.
        IPCOMP_SUPPORTED = 16387,
        /// NAT detection: hash of the sender's address and port (RFC 7296 §2.23).
        NAT_DETECTION_SOURCE_IP = 16388,
        /// NAT detection: hash of the receiver's address and port.
        NAT_DETECTION_DESTINATION_IP = 16389,
        /// Stateless cookie (RFC 7296 §2.6).
        COOKIE = 16390,
        /// Transport mode requested.
        USE_TRANSPORT_MODE = 16391,
        /// Certificate lookup by URL supported.
        HTTP_CERT_LOOKUP_SUPPORTED = 16392,
        /// The CHILD_SA (or IKE SA) this exchange rekeys.
        REKEY_SA = 16393,
        /// The sender does not accept TFC padding.
        ESP_TFC_PADDING_NOT_SUPPORTED = 16394,
        /// Non-first fragments are sent on this SA too.
        NON_FIRST_FRAGMENTS_ALSO = 16395,
        /// MOBIKE supported (RFC 4555).
        MOBIKE_SUPPORTED = 16396,
        /// Additional IPv4 address (RFC 4555).
        ADDITIONAL_IP4_ADDRESS = 16397,
        /// Additional IPv6 address (RFC 4555).
        ADDITIONAL_IP6_ADDRESS = 16398,
        /// No additional addresses (RFC 4555).
        NO_ADDITIONAL_ADDRESSES = 16399,
        /// Update SA addresses (RFC 4555).
        UPDATE_SA_ADDRESSES = 16400,
        /// Return routability check (RFC 4555).
        COOKIE2 = 16401,
        /// NATs not allowed (RFC 4555).
        NO_NATS_ALLOWED = 16402,
        /// Authentication lifetime (RFC 4478).
        AUTH_LIFETIME = 16403,
        /// Multiple authentication supported (RFC 4739).
        MULTIPLE_AUTH_SUPPORTED = 16404,
        /// Another authentication follows (RFC 4739).
        ANOTHER_AUTH_FOLLOWS = 16405,
        /// Redirect supported (RFC 5685).
        REDIRECT_SUPPORTED = 16406,
        /// Redirect (RFC 5685).
        REDIRECT = 16407,
        /// Redirected from (RFC 5685).
        REDIRECTED_FROM = 16408,
        /// EAP-only authentication (RFC 5998).
        EAP_ONLY_AUTHENTICATION = 16417,
        /// Childless IKE SA initiation supported (RFC 6023).
        CHILDLESS_IKEV2_SUPPORTED = 16418,
        /// Quick crash detection (RFC 6290).
        QUICK_CRASH_DETECTION = 16419,
        /// Message ID sync supported (RFC 6311).
        IKEV2_MESSAGE_ID_SYNC_SUPPORTED = 16420,
        /// Replay counter sync supported (RFC 6311).
        IPSEC_REPLAY_COUNTER_SYNC_SUPPORTED = 16421,
        /// Message ID sync (RFC 6311).
        IKEV2_MESSAGE_ID_SYNC = 16422,
        /// Replay counter sync (RFC 6311).
        IPSEC_REPLAY_COUNTER_SYNC = 16423,
        /// Secure password methods (RFC 6467).
        SECURE_PASSWORD_METHODS = 16424,
        /// IKE fragmentation supported (RFC 7383).
        IKEV2_FRAGMENTATION_SUPPORTED = 16430,
        /// Signature hash algorithms (RFC 7427).
        SIGNATURE_HASH_ALGORITHMS = 16431,
        /// Clone IKE SA supported (RFC 7791).
        CLONE_IKE_SA_SUPPORTED = 16432,
        /// Clone IKE SA (RFC 7791).
        CLONE_IKE_SA = 16433,
        /// Puzzle (RFC 8019).
        PUZZLE = 16434,
        /// Use PPK (RFC 8784).
        USE_PPK = 16435,
        /// PPK identity (RFC 8784).
        PPK_IDENTITY = 16436,
        /// No PPK auth (RFC 8784).
        NO_PPK_AUTH = 16437,
        /// IKE_INTERMEDIATE supported (RFC 9242).
        INTERMEDIATE_EXCHANGE_SUPPORTED = 16438,
        /// Additional key exchange (RFC 9370).
        ADDITIONAL_KEY_EXCHANGE = 16441,
        /// Use AGGFRAG (RFC 9347).
        USE_AGGFRAG = 16442,
        /// This CHILD_SA is one of a group with the same traffic selectors, each bound to a
        /// resource such as a CPU (RFC 9611 §3.1); data: an optional opaque resource identifier.
        SA_RESOURCE_INFO = 16444,
    }
}

impl NotifyType {
    /// True for error types (below 16384, RFC 7296 §3.10.1).
    pub fn is_error(self) -> bool {
        self.0 < 16384
    }

    /// True for the errors by which a responder says it takes no more CHILD_SAs:
    /// NO_ADDITIONAL_SAS (RFC 7296 §3.10.1) and TS_MAX_QUEUE (RFC 9611 §3.2). Asking again is
    /// pointless until one of them is gone.
    pub fn no_more_children(self) -> bool {
        self == Self::NO_ADDITIONAL_SAS || self == Self::TS_MAX_QUEUE
    }
}

crate::iana_registry! {
    /// Protocol ID in proposals, notifies and deletes (RFC 7296 §3.3.1).
    ProtocolId(u8) {
        /// None (notify without SPI).
        NONE = 0,
        /// IKE.
        IKE = 1,
        /// AH.
        AH = 2,
        /// ESP.
        ESP = 3,
    }
}

crate::iana_registry! {
    /// Transform Type (RFC 7296 §3.3.2).
    TransformType(u8) {
        /// Encryption algorithm.
        ENCR = 1,
        /// Pseudorandom function.
        PRF = 2,
        /// Integrity algorithm.
        INTEG = 3,
        /// Key exchange method.
        KE = 4,
        /// Extended sequence numbers.
        ESN = 5,
    }
}

crate::iana_registry! {
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

crate::iana_registry! {
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

crate::iana_registry! {
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

crate::iana_registry! {
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

crate::iana_registry! {
    /// Transform Type 5 - Extended Sequence Numbers Transform IDs.
    EsnId(u16) {
        /// No Extended Sequence Numbers.
        NO_ESN = 0,
        /// Extended Sequence Numbers.
        ESN = 1,
    }
}

crate::iana_registry! {
    /// ID Type (RFC 7296 §3.5).
    IdType(u8) {
        /// A single four-octet IPv4 address.
        IPV4_ADDR = 1,
        /// A fully qualified domain name.
        FQDN = 2,
        /// An RFC 822 email address.
        RFC822_ADDR = 3,
        /// A single sixteen-octet IPv6 address.
        IPV6_ADDR = 5,
        /// An ASN.1 X.500 Distinguished Name.
        DER_ASN1_DN = 9,
        /// An ASN.1 X.509 GeneralName.
        DER_ASN1_GN = 10,
        /// An opaque octet stream.
        KEY_ID = 11,
    }
}

crate::iana_registry! {
    /// Authentication Method (RFC 7296 §3.8, RFC 7427).
    AuthMethod(u8) {
        /// RSA digital signature.
        RSA_SIG = 1,
        /// Shared Key Message Integrity Code.
        SHARED_KEY_MIC = 2,
        /// DSS digital signature.
        DSS_SIG = 3,
        /// ECDSA with SHA-256 on P-256.
        ECDSA_256 = 9,
        /// ECDSA with SHA-384 on P-384.
        ECDSA_384 = 10,
        /// ECDSA with SHA-512 on P-521.
        ECDSA_521 = 11,
        /// NULL authentication (RFC 7619).
        NULL_AUTH = 13,
        /// Digital signature (RFC 7427).
        DIGITAL_SIGNATURE = 14,
    }
}

crate::iana_registry! {
    /// Traffic Selector Type (RFC 7296 §3.13.1).
    TsType(u8) {
        /// IPv4 address range.
        IPV4_ADDR_RANGE = 7,
        /// IPv6 address range.
        IPV6_ADDR_RANGE = 8,
    }
}
