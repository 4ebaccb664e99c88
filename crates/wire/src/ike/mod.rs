//! The IKEv2 message codec (RFC 7296 §3): header, generic payload header, SA (proposals,
//! transforms, attributes), KE, IDi/IDr, AUTH, Nonce, Notify, Delete, Vendor ID, TSi/TSr and
//! the Encrypted (SK) payload.
//!
//! Structures have public fields and `parse` / `emit` / `buffer_len`. Parsing never panics on
//! any input; lengths are written in explicit finish steps. Decryption and integrity checking of
//! the SK payload belong to the engine, which uses [`Encrypted`] and [`emit_encrypted`] to find
//! and lay out the protected bytes.

mod auth;
mod codec;
mod delete;
mod error;
mod header;
mod id;
mod ke;
mod message;
mod nonce;
mod notify;
mod payload;
mod registry;
mod sa;
mod sk;
mod ts;
mod vendor;

pub use auth::AuthPayload;
pub use codec::{LenField, Reader};
pub use delete::DeletePayload;
pub use error::IkeWireError;
pub use header::{Flags, Header};
pub use id::IdPayload;
pub use ke::KePayload;
pub use message::{find_notify, Message};
pub use nonce::{NoncePayload, MAX_NONCE_LEN, MIN_NONCE_LEN};
pub use notify::NotifyPayload;
pub use payload::{chain_len, emit_chain, parse_chain, Encrypted, Payload, UnknownPayload};
pub use registry::{
    AuthMethod, EncrId, EsnId, ExchangeType, IdType, IntegId, KeId, NotifyType, PayloadType, PrfId,
    ProtocolId, TransformType, TsType,
};
pub use sa::{Attribute, AttributeValue, Proposal, SaPayload, Transform, ATTR_KEY_LENGTH};
pub use sk::{emit_encrypted, strip_padding, SealLayout};
pub use ts::{TrafficSelector, TsPayload, TsSyntaxError};
pub use vendor::VendorIdPayload;

#[cfg(test)]
mod tests;
