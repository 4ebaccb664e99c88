//! Which payloads each message may carry, and how many (RFC 7296 §1.2-§1.4), in one table as
//! strongSwan's `encoding/message.c` keeps it. Checked on every decoded message before the
//! exchange logic sees it: a request that breaks the table is answered INVALID_SYNTAX, a
//! response is dropped. Responses that carry an error notify (or a COOKIE) only have their
//! maxima checked, since they legitimately omit the rest.

use wire::ike::{ExchangeType, Payload, PayloadType};

/// Bounds for one payload type in one message kind.
struct Rule {
    ty: PayloadType,
    min: u8,
    max: u8,
}

const fn r(ty: PayloadType, min: u8, max: u8) -> Rule {
    Rule { ty, min, max }
}

/// Unlimited.
const ANY: u8 = u8::MAX;

use PayloadType as P;

const INIT_REQUEST: &[Rule] = &[
    r(P::SA, 1, 1),
    r(P::KE, 1, 1),
    r(P::NONCE, 1, 1),
    r(P::NOTIFY, 0, ANY),
    r(P::VENDOR_ID, 0, ANY),
];
const INIT_RESPONSE: &[Rule] = &[
    r(P::SA, 1, 1),
    r(P::KE, 1, 1),
    r(P::NONCE, 1, 1),
    r(P::NOTIFY, 0, ANY),
    r(P::VENDOR_ID, 0, ANY),
    r(P::CERTREQ, 0, ANY),
];
const AUTH_REQUEST: &[Rule] = &[
    r(P::IDI, 1, 1),
    r(P::IDR, 0, 1),
    r(P::AUTH, 1, 1),
    r(P::SA, 0, 1),
    r(P::TSI, 0, 1),
    r(P::TSR, 0, 1),
    r(P::NOTIFY, 0, ANY),
    r(P::VENDOR_ID, 0, ANY),
    r(P::CERT, 0, ANY),
    r(P::CERTREQ, 0, ANY),
    r(P::CP, 0, 1),
];
const AUTH_RESPONSE: &[Rule] = &[
    r(P::IDR, 1, 1),
    r(P::AUTH, 1, 1),
    r(P::SA, 0, 1),
    r(P::TSI, 0, 1),
    r(P::TSR, 0, 1),
    r(P::NOTIFY, 0, ANY),
    r(P::VENDOR_ID, 0, ANY),
    r(P::CERT, 0, ANY),
    r(P::CP, 0, 1),
];
const CREATE_CHILD: &[Rule] = &[
    r(P::SA, 1, 1),
    r(P::NONCE, 1, 1),
    r(P::KE, 0, 1),
    r(P::TSI, 0, 1),
    r(P::TSR, 0, 1),
    r(P::NOTIFY, 0, ANY),
    r(P::VENDOR_ID, 0, ANY),
];
const INFORMATIONAL: &[Rule] = &[
    r(P::NOTIFY, 0, ANY),
    r(P::DELETE, 0, ANY),
    r(P::VENDOR_ID, 0, ANY),
    r(P::CP, 0, 1),
];

fn rules(exchange: ExchangeType, response: bool) -> Option<&'static [Rule]> {
    Some(match (exchange, response) {
        (ExchangeType::IKE_SA_INIT, false) => INIT_REQUEST,
        (ExchangeType::IKE_SA_INIT, true) => INIT_RESPONSE,
        (ExchangeType::IKE_AUTH, false) => AUTH_REQUEST,
        (ExchangeType::IKE_AUTH, true) => AUTH_RESPONSE,
        (ExchangeType::CREATE_CHILD_SA, _) => CREATE_CHILD,
        (ExchangeType::INFORMATIONAL, _) => INFORMATIONAL,
        _ => return None,
    })
}

/// Checks a decoded message against the table. Returns what is wrong, if anything. Payload
/// types the table does not list for the message (known or unknown, non-critical) are ignored
/// by the exchange logic and therefore allowed here too, except the ones that would change the
/// meaning of the exchange: an SA, KE, ID, AUTH or TS where none belongs.
pub(crate) fn check(
    exchange: ExchangeType,
    response: bool,
    payloads: &[Payload],
) -> Result<(), &'static str> {
    let Some(table) = rules(exchange, response) else {
        return Ok(());
    };
    let refused = payloads.iter().any(|p| match p {
        Payload::Notify(n) => n.ty.is_error() || n.ty == wire::ike::NotifyType::COOKIE,
        _ => false,
    });
    let count = |ty: PayloadType| payloads.iter().filter(|p| p.ty() == ty).count();
    for rule in table {
        let n = count(rule.ty);
        if n > usize::from(rule.max) {
            return Err("payload repeated");
        }
        if n < usize::from(rule.min) && !(response && refused) {
            return Err("payload missing");
        }
    }
    for ty in [
        P::SA,
        P::KE,
        P::IDI,
        P::IDR,
        P::AUTH,
        P::TSI,
        P::TSR,
        P::DELETE,
    ] {
        if count(ty) > 0 && !table.iter().any(|r| r.ty == ty) {
            return Err("payload not allowed in this message");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::ike::{NotifyPayload, NotifyType, SaPayload};

    #[test]
    fn table() {
        let sa = Payload::Sa(SaPayload::default());
        let nonce = Payload::Nonce(wire::ike::NoncePayload { data: vec![0; 16] });
        let fail = Payload::Notify(NotifyPayload::new(NotifyType::NO_PROPOSAL_CHOSEN, vec![]));
        assert!(check(
            ExchangeType::CREATE_CHILD_SA,
            false,
            &[sa.clone(), nonce.clone()]
        )
        .is_ok());
        assert_eq!(
            check(
                ExchangeType::CREATE_CHILD_SA,
                false,
                std::slice::from_ref(&sa)
            ),
            Err("payload missing")
        );
        assert_eq!(
            check(
                ExchangeType::CREATE_CHILD_SA,
                false,
                &[sa.clone(), sa.clone(), nonce.clone()]
            ),
            Err("payload repeated")
        );
        // An error answer omits everything else.
        assert!(check(
            ExchangeType::CREATE_CHILD_SA,
            true,
            std::slice::from_ref(&fail)
        )
        .is_ok());
        assert!(check(ExchangeType::IKE_AUTH, true, std::slice::from_ref(&fail)).is_ok());
        assert_eq!(
            check(ExchangeType::INFORMATIONAL, false, &[sa]),
            Err("payload not allowed in this message")
        );
        assert!(check(ExchangeType::INFORMATIONAL, false, &[]).is_ok());
        assert!(check(ExchangeType(99), false, &[nonce]).is_ok());
    }
}
