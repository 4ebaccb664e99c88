//! Protection of IKE messages with the Encrypted (SK) payload (RFC 7296 §3.14; RFC 5282 for
//! AES-GCM, RFC 7634 for ChaCha20-Poly1305): the AAD / integrity-protected range is the header,
//! any unencrypted payloads and the SK generic header. IVs come from a per-SA counter through
//! `SaCipher::iv_from_counter` (unique for AEAD, unpredictable for CBC), so no RNG is needed and
//! a restored SA continues the sequence.

use crate::{sa::IkeSa, Error};
use wire::ike::{
    emit_chain, emit_encrypted, parse_chain, strip_padding, ExchangeType, Message, Payload,
    PayloadType,
};

impl IkeSa {
    /// Builds an SK-protected message (RFC 7296 §3.14).
    pub(crate) fn protect(
        &mut self,
        exchange: ExchangeType,
        id: u32,
        response: bool,
        payloads: &[Payload],
    ) -> Result<Vec<u8>, Error> {
        let keys = self.keys.as_ref().ok_or(Error::InvalidSyntax {
            spi: self.spi,
            exchange: "encrypted",
            what: "no keys yet",
        })?;
        let cipher = keys.outbound(self.initiator);
        let mut inner = Vec::new();
        let first = emit_chain(payloads, PayloadType::NONE, &mut inner).map_err(|source| {
            Error::Malformed {
                spi: self.spi,
                source,
            }
        })?;
        let header = self.header(exchange, id, response);
        let mut out = Vec::new();
        let layout = emit_encrypted(
            &header,
            first,
            &inner,
            cipher.iv_len(),
            cipher.block_size(),
            cipher.icv_len(),
            &mut out,
        )
        .map_err(|source| Error::Malformed {
            spi: self.spi,
            source,
        })?;
        self.iv_counter += 1;
        cipher.iv_from_counter(self.iv_counter, &mut out[layout.iv.clone()]);
        let (head, rest) = out.split_at_mut(layout.iv.end);
        let (pt, icv) = rest.split_at_mut(layout.plaintext.len());
        cipher
            .seal_in_place(&head[layout.iv.clone()], &head[..layout.aad_len], pt, icv)
            .map_err(|source| Error::Crypto {
                spi: self.spi,
                source,
            })?;
        Ok(out)
    }

    /// Verifies and decrypts the SK payload of `msg` (parsed from `data`), returning the inner
    /// payloads. An ICV failure is an error the caller drops silently (RFC 7296 §2.21.1).
    pub(crate) fn unprotect(&self, data: &[u8], msg: &Message) -> Result<Vec<Payload>, Error> {
        let syntax = |what| Error::InvalidSyntax {
            spi: self.spi,
            exchange: "encrypted",
            what,
        };
        let keys = self.keys.as_ref().ok_or(syntax("no keys yet"))?;
        let enc = msg
            .encrypted
            .as_ref()
            .ok_or(syntax("no encrypted payload"))?;
        if !msg.payloads.is_empty() {
            // Nothing may travel unprotected next to the SK payload in the exchanges we speak.
            return Err(syntax("unencrypted payloads beside the encrypted payload"));
        }
        let cipher = keys.inbound(self.initiator);
        let body = data
            .get(enc.body.clone())
            .ok_or(syntax("encrypted payload out of range"))?;
        let (iv_len, icv_len) = (cipher.iv_len(), cipher.icv_len());
        if body.len() < iv_len + icv_len + 1 {
            return Err(syntax("encrypted payload too short"));
        }
        let iv = &body[..iv_len];
        let icv = &body[body.len() - icv_len..];
        let mut pt = body[iv_len..body.len() - icv_len].to_vec();
        cipher
            .open_in_place(iv, &data[..enc.body.start], &mut pt, icv)
            .map_err(|source| Error::Crypto {
                spi: self.spi,
                source,
            })?;
        let inner = strip_padding(&pt).map_err(|source| Error::Malformed {
            spi: self.spi,
            source,
        })?;
        let (payloads, _) =
            parse_chain(enc.next_inner, inner, 0, false).map_err(|source| Error::Malformed {
                spi: self.spi,
                source,
            })?;
        Ok(payloads)
    }
}
