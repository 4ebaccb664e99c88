//! Assertions on IKE_SA_INIT and CREATE_CHILD_SA rounds as seen on the wire: COOKIE
//! (RFC 7296 §2.6), INVALID_KE_PAYLOAD (§1.2, §1.3) and both together (§2.6.1).

use std::collections::BTreeSet;

use super::*;

/// The IKE_SA_INIT messages of one side's attempt: requests from `initiator`, and the answers.
pub fn init_exchange<'m>(msgs: &'m [IkeMsg], initiator: &str, port: u16) -> Vec<&'m IkeMsg> {
    let ispis: BTreeSet<&str> = msgs
        .iter()
        .filter(|m| {
            m.exchange == IKE_SA_INIT && !m.response && m.src == initiator && m.sport == port
        })
        .map(|m| m.ispi.as_str())
        .collect();
    msgs.iter()
        .filter(|m| m.exchange == IKE_SA_INIT && ispis.contains(m.ispi.as_str()))
        .collect()
}

/// Checks a COOKIE round (RFC 7296 §2.6) in `init`, the IKE_SA_INIT messages of one attempt:
/// the first request has no cookie, every answer before the last is a bare COOKIE notify with a
/// zero responder SPI, every later request repeats that cookie as its first payload with the
/// same SPI, and the last answer is a real one. Returns the cookie.
pub fn assert_cookie_round(init: &[&IkeMsg], all: &str) -> String {
    let (Some(first), Some(last)) = (init.first(), init.last()) else {
        panic!("no IKE_SA_INIT:\n{all}");
    };
    assert!(
        !first.response && !first.notifies.contains(&COOKIE),
        "{all}"
    );
    assert!(
        last.response && !last.rspi_zero() && last.payloads.first() == Some(&PAYLOAD_SA),
        "{all}"
    );
    let answer = init
        .iter()
        .find(|m| m.response)
        .unwrap_or_else(|| panic!("no answer:\n{all}"));
    assert!(answer.rspi_zero(), "{all}");
    assert_eq!(
        answer.payloads,
        [PAYLOAD_NOTIFY],
        "the COOKIE answer is a bare notify:\n{all}"
    );
    assert_eq!(answer.notifies, [COOKIE], "{all}");
    let cookie = answer.notify(COOKIE).expect("checked above").to_owned();
    assert!(!cookie.is_empty() && cookie != "<MISSING>", "{all}");
    let retries: Vec<&&IkeMsg> = init
        .iter()
        .filter(|m| !m.response && m.frame > answer.frame)
        .collect();
    assert!(!retries.is_empty(), "no retry after the COOKIE:\n{all}");
    for r in retries {
        assert_eq!(r.ispi, first.ispi, "the retry keeps the SPI:\n{all}");
        assert_eq!(
            r.payloads.first(),
            Some(&PAYLOAD_NOTIFY),
            "COOKIE must come first:\n{all}"
        );
        assert_eq!(r.notifies.first(), Some(&COOKIE), "{all}");
        assert_eq!(r.notify(COOKIE), Some(cookie.as_str()), "{all}");
    }
    for m in init.iter().filter(|m| m.response && m.frame != last.frame) {
        assert_eq!(m.notifies, [COOKIE], "{all}");
    }
    cookie
}

/// Checks an INVALID_KE_PAYLOAD round (RFC 7296 §1.2) in `init`: the first request's KE is of
/// group `offered`, the answer is a bare INVALID_KE_PAYLOAD with a zero responder SPI naming
/// `wanted`, and the exchange completes with a request and an answer of group `wanted`.
pub fn assert_invalid_ke_round(init: &[&IkeMsg], offered: u16, wanted: u16, all: &str) {
    assert_eq!(init.len(), 4, "{all}");
    let (req1, refusal, req2, answer) = (init[0], init[1], init[2], init[3]);
    assert!(!req1.response && req1.ke_group == Some(offered), "{all}");
    assert!(refusal.response && refusal.rspi_zero(), "{all}");
    assert_eq!(refusal.payloads, [PAYLOAD_NOTIFY], "{all}");
    assert_eq!(refusal.notifies, [INVALID_KE_PAYLOAD], "{all}");
    assert_eq!(
        refusal.notify(INVALID_KE_PAYLOAD),
        Some(format!("{wanted:04x}").as_str()),
        "{all}"
    );
    assert!(!req2.response && req2.ke_group == Some(wanted), "{all}");
    assert!(
        answer.response && !answer.rspi_zero() && answer.ke_group == Some(wanted),
        "{all}"
    );
}

/// The CREATE_CHILD_SA exchanges of `msgs` that rekey a CHILD_SA (ESP proposal), with their
/// answers: (request, response) pairs in order.
pub fn child_rekey_pairs(msgs: &[IkeMsg]) -> Vec<(&IkeMsg, &IkeMsg)> {
    let reqs = msgs
        .iter()
        .filter(|m| m.exchange == CREATE_CHILD_SA && !m.response && m.notifies.contains(&REKEY_SA));
    reqs.filter_map(|req| {
        msgs.iter()
            .find(|m| {
                m.exchange == CREATE_CHILD_SA
                    && m.response
                    && m.ispi == req.ispi
                    && m.mid == req.mid
                    && m.frame > req.frame
            })
            .map(|resp| (req, resp))
    })
    .collect()
}

/// Checks a PFS CHILD_SA rekey that needed an INVALID_KE_PAYLOAD round: a request with a KE of
/// `offered` refused naming `wanted`, then a request of `wanted` answered with a KE of it.
pub fn assert_child_invalid_ke(msgs: &[IkeMsg], offered: u16, wanted: u16, all: &str) {
    let pairs = child_rekey_pairs(msgs);
    assert!(pairs.len() >= 2, "{all}");
    let (req, refusal) = pairs[0];
    assert!(req.decrypted && refusal.decrypted, "{all}");
    assert_eq!(req.ke_group, Some(offered), "{all}");
    assert_eq!(refusal.notifies, [INVALID_KE_PAYLOAD], "{all}");
    assert_eq!(
        refusal.notify(INVALID_KE_PAYLOAD),
        Some(format!("{wanted:04x}").as_str()),
        "{all}"
    );
    let (retry, answer) = pairs[1];
    assert_eq!(retry.ke_group, Some(wanted), "{all}");
    assert_eq!(answer.ke_group, Some(wanted), "{all}");
    assert!(!answer.notifies.contains(&INVALID_KE_PAYLOAD), "{all}");
}

/// Checks an IKE_SA_INIT that needed a COOKIE and an INVALID_KE_PAYLOAD round (RFC 7296
/// §2.6.1): first request with `offered` and no cookie, answered by a COOKIE; every later
/// request carries a COOKIE first; an INVALID_KE_PAYLOAD names `wanted`; the last request has
/// `wanted` and is answered for real. Prints how many round trips it took.
pub fn assert_cookie_then_invalid_ke(init: &[&IkeMsg], offered: u16, wanted: u16, all: &str) {
    let requests: Vec<&&IkeMsg> = init.iter().filter(|m| !m.response).collect();
    let answers: Vec<&&IkeMsg> = init.iter().filter(|m| m.response).collect();
    assert!(requests.len() >= 3 && answers.len() >= 3, "{all}");
    assert!(
        init.iter().all(|m| m.ispi == init[0].ispi),
        "one SPI throughout:\n{all}"
    );
    assert_eq!(requests[0].ke_group, Some(offered), "{all}");
    assert!(!requests[0].notifies.contains(&COOKIE), "{all}");
    assert_eq!(answers[0].notifies, [COOKIE], "{all}");
    for r in &requests[1..] {
        assert_eq!(
            r.notifies.first(),
            Some(&COOKIE),
            "the cookie is kept in every retry:\n{all}"
        );
        assert_eq!(r.payloads.first(), Some(&PAYLOAD_NOTIFY), "{all}");
    }
    assert!(
        answers.iter().any(|a| a.notifies == [INVALID_KE_PAYLOAD]
            && a.notify(INVALID_KE_PAYLOAD) == Some(format!("{wanted:04x}").as_str())),
        "{all}"
    );
    let (last_req, last) = (requests[requests.len() - 1], answers[answers.len() - 1]);
    assert_eq!(last_req.ke_group, Some(wanted), "{all}");
    assert!(!last.rspi_zero() && last.ke_group == Some(wanted), "{all}");
    eprintln!(
        "COOKIE + INVALID_KE_PAYLOAD took {} round trips:\n{all}",
        requests.len()
    );
}
