//! SA payload proposals: building them from the configuration and selecting one from a peer's
//! offer (RFC 7296 §2.7, §3.3). As strongSwan does by default, the responder walks *its own*
//! proposals in configured order and takes the first that the peer also offers; within a
//! proposal, algorithms are taken in our order.

use crate::{Error, EspProposal, IkeProposal};
use crypto::transform::{EncrId, EsnId, IntegId, KeId};
use crypto::{DhGroup, Encr, Integ, Prf};
use wire::ike::{Proposal, ProtocolId, Transform, TransformType};

/// The transforms of a negotiated IKE SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IkeAlgs {
    pub(crate) encr: Encr,
    pub(crate) integ: Option<Integ>,
    pub(crate) prf: Prf,
    pub(crate) dh: DhGroup,
}

/// The transforms of a negotiated CHILD_SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EspAlgs {
    pub(crate) encr: Encr,
    pub(crate) integ: Option<Integ>,
    pub(crate) esn: bool,
    /// The PFS group of the exchange that created it (None without KE).
    pub(crate) dh: Option<DhGroup>,
}

fn encr_name(e: Encr) -> &'static str {
    match e {
        Encr::AesGcm16_128 => "AES_GCM_16_128",
        Encr::AesGcm16_256 => "AES_GCM_16_256",
        Encr::ChaCha20Poly1305 => "CHACHA20_POLY1305_256",
        Encr::AesCbc128 => "AES_CBC_128",
        Encr::AesCbc256 => "AES_CBC_256",
    }
}

fn integ_name(i: Integ) -> &'static str {
    match i {
        Integ::HmacSha1_96 => "HMAC_SHA1_96",
        Integ::HmacSha256_128 => "HMAC_SHA2_256_128",
        Integ::HmacSha384_192 => "HMAC_SHA2_384_192",
        Integ::HmacSha512_256 => "HMAC_SHA2_512_256",
    }
}

fn prf_name(p: Prf) -> &'static str {
    match p {
        Prf::HmacSha1 => "PRF_HMAC_SHA1",
        Prf::HmacSha256 => "PRF_HMAC_SHA2_256",
        Prf::HmacSha384 => "PRF_HMAC_SHA2_384",
        Prf::HmacSha512 => "PRF_HMAC_SHA2_512",
    }
}

pub(crate) fn dh_name(d: DhGroup) -> &'static str {
    match d {
        DhGroup::Modp2048 => "MODP_2048",
        DhGroup::Ecp256 => "ECP_256",
        DhGroup::Ecp384 => "ECP_384",
        DhGroup::Curve25519 => "CURVE_25519",
    }
}

impl IkeAlgs {
    /// strongSwan-style name, e.g. `AES_GCM_16_256/PRF_HMAC_SHA2_256/CURVE_25519`.
    pub(crate) fn name(&self) -> String {
        let mut s = encr_name(self.encr).to_string();
        if let Some(i) = self.integ {
            s.push('/');
            s.push_str(integ_name(i));
        }
        s.push('/');
        s.push_str(prf_name(self.prf));
        s.push('/');
        s.push_str(dh_name(self.dh));
        s
    }

    /// True if one of `cfg` contains every transform of `self`.
    pub(crate) fn acceptable_to(&self, cfg: &[IkeProposal]) -> bool {
        cfg.iter().any(|p| {
            p.encr.contains(&self.encr)
                && p.prf.contains(&self.prf)
                && p.dh.contains(&self.dh)
                && match self.integ {
                    Some(i) => p.integ.contains(&i),
                    None => p.integ.is_empty(),
                }
        })
    }
}

impl EspAlgs {
    /// strongSwan-style name, e.g. `AES_GCM_16_256/NO_EXT_SEQ`.
    pub(crate) fn name(&self) -> String {
        let mut s = encr_name(self.encr).to_string();
        if let Some(i) = self.integ {
            s.push('/');
            s.push_str(integ_name(i));
        }
        if let Some(d) = self.dh {
            s.push('/');
            s.push_str(dh_name(d));
        }
        s.push_str(if self.esn { "/EXT_SEQ" } else { "/NO_EXT_SEQ" });
        s
    }
}

fn encr_transform(e: Encr) -> Transform {
    let (id, bits) = e.id();
    Transform::with_key_length(TransformType::ENCR, id.0, bits)
}

/// Our IKE proposals as SA payload proposals; `spi` is empty in IKE_SA_INIT and our new SPI
/// when rekeying (RFC 7296 §2.18). `group_first` moves a group to the front (INVALID_KE retry).
pub(crate) fn ike_offer(
    cfg: &[IkeProposal],
    spi: &[u8],
    group_first: Option<DhGroup>,
) -> Vec<Proposal> {
    cfg.iter()
        .enumerate()
        .map(|(n, p)| {
            let mut t: Vec<Transform> = p.encr.iter().map(|e| encr_transform(*e)).collect();
            t.extend(
                p.prf
                    .iter()
                    .map(|f| Transform::new(TransformType::PRF, f.id().0)),
            );
            t.extend(
                p.integ
                    .iter()
                    .map(|i| Transform::new(TransformType::INTEG, i.id().0)),
            );
            let mut groups = p.dh.clone();
            if let Some(g) = group_first {
                if let Some(pos) = groups.iter().position(|x| *x == g) {
                    let g = groups.remove(pos);
                    groups.insert(0, g);
                }
            }
            t.extend(
                groups
                    .iter()
                    .map(|d| Transform::new(TransformType::KE, d.id().0)),
            );
            Proposal {
                number: proposal_number(n),
                protocol: ProtocolId::IKE,
                spi: spi.to_vec(),
                transforms: t,
            }
        })
        .collect()
}

fn proposal_number(index: usize) -> u8 {
    u8::try_from(index + 1).unwrap_or(u8::MAX)
}

/// Our ESP proposals; with `pfs` the configured groups are included (CREATE_CHILD_SA), without
/// they are stripped (the IKE_AUTH exchange has no KE payload, RFC 7296 §1.2).
pub(crate) fn esp_offer(
    cfg: &[EspProposal],
    spi: u32,
    pfs: bool,
    group_first: Option<DhGroup>,
) -> Vec<Proposal> {
    cfg.iter()
        .enumerate()
        .map(|(n, p)| {
            let mut t: Vec<Transform> = p.encr.iter().map(|e| encr_transform(*e)).collect();
            t.extend(
                p.integ
                    .iter()
                    .map(|i| Transform::new(TransformType::INTEG, i.id().0)),
            );
            if pfs {
                let mut groups = p.dh.clone();
                if let Some(g) = group_first {
                    if let Some(pos) = groups.iter().position(|x| *x == g) {
                        let g = groups.remove(pos);
                        groups.insert(0, g);
                    }
                }
                t.extend(
                    groups
                        .iter()
                        .map(|d| Transform::new(TransformType::KE, d.id().0)),
                );
            }
            t.extend(p.esn.iter().map(|e| {
                Transform::new(
                    TransformType::ESN,
                    if *e { EsnId::ESN.0 } else { EsnId::NO_ESN.0 },
                )
            }));
            Proposal {
                number: proposal_number(n),
                protocol: ProtocolId::ESP,
                spi: spi.to_be_bytes().to_vec(),
                transforms: t,
            }
        })
        .collect()
}

/// Transforms of one type in a peer proposal that we can evaluate (no unknown attributes,
/// RFC 7296 §3.3.6).
fn usable(p: &Proposal, ty: TransformType) -> impl Iterator<Item = &Transform> {
    p.transforms_of(ty).filter(|t| !t.has_unknown_attributes())
}

fn offers_encr(p: &Proposal, e: Encr) -> bool {
    usable(p, TransformType::ENCR).any(|t| Encr::from_id(EncrId(t.id), t.key_length()) == Some(e))
}

fn pick_encr_integ(
    ours_encr: &[Encr],
    ours_integ: &[Integ],
    p: &Proposal,
) -> Option<(Encr, Option<Integ>)> {
    let encr = *ours_encr.iter().find(|e| offers_encr(p, **e))?;
    let integ = if encr.is_aead() {
        // RFC 5282 §8: with a combined-mode cipher, no integrity transform or only NONE.
        if p.transforms_of(TransformType::INTEG)
            .any(|t| t.id != IntegId::NONE.0)
        {
            return None;
        }
        None
    } else {
        Some(*ours_integ.iter().find(|i| {
            usable(p, TransformType::INTEG).any(|t| Integ::from_id(IntegId(t.id)) == Some(**i))
        })?)
    };
    Some((encr, integ))
}

/// A proposal containing a transform type we do not know must be rejected (RFC 7296 §3.3.6).
fn only_known_types(p: &Proposal, allowed: &[TransformType]) -> bool {
    p.transforms.iter().all(|t| allowed.contains(&t.ty))
}

fn response_proposal(number: u8, protocol: ProtocolId, t: Vec<Transform>) -> Proposal {
    Proposal {
        number,
        protocol,
        spi: Vec::new(),
        transforms: t,
    }
}

/// Selects the IKE transforms (responder, or checks a response with `theirs` = the single
/// returned proposal). `ke_group` is the group of the peer's KE payload: among the common
/// groups of the chosen proposal it is preferred, saving an INVALID_KE round trip.
/// Returns the algorithms and the proposal to answer with (SPI left empty).
pub(crate) fn select_ike(
    ours: &[IkeProposal],
    theirs: &[Proposal],
    ke_group: Option<u16>,
    spi_len: usize,
) -> Result<(IkeAlgs, Proposal), Error> {
    for o in ours {
        for p in theirs {
            if p.protocol != ProtocolId::IKE
                || p.spi.len() != spi_len
                || !only_known_types(
                    p,
                    &[
                        TransformType::ENCR,
                        TransformType::PRF,
                        TransformType::INTEG,
                        TransformType::KE,
                    ],
                )
            {
                continue;
            }
            let Some((encr, integ)) = pick_encr_integ(&o.encr, &o.integ, p) else {
                continue;
            };
            let Some(prf) = o
                .prf
                .iter()
                .find(|f| usable(p, TransformType::PRF).any(|t| t.id == f.id().0))
            else {
                continue;
            };
            let common: Vec<DhGroup> =
                o.dh.iter()
                    .copied()
                    .filter(|d| usable(p, TransformType::KE).any(|t| t.id == d.id().0))
                    .collect();
            let Some(dh) = common
                .iter()
                .find(|d| Some(d.id().0) == ke_group)
                .or(common.first())
                .copied()
            else {
                continue;
            };
            let mut t = vec![
                encr_transform(encr),
                Transform::new(TransformType::PRF, prf.id().0),
            ];
            if let Some(i) = integ {
                t.push(Transform::new(TransformType::INTEG, i.id().0));
            }
            t.push(Transform::new(TransformType::KE, dh.id().0));
            return Ok((
                IkeAlgs {
                    encr,
                    integ,
                    prf: *prf,
                    dh,
                },
                response_proposal(p.number, ProtocolId::IKE, t),
            ));
        }
    }
    Err(Error::NoProposalChosen { what: "IKE" })
}

/// Checks that a responder's single proposal is one we offered, with exactly one transform of
/// each type (RFC 7296 §3.3: "the responder MUST accept a single proposal").
pub(crate) fn check_ike_response(
    ours: &[IkeProposal],
    resp: &[Proposal],
    spi_len: usize,
) -> Result<IkeAlgs, Error> {
    let [p] = resp else {
        return Err(Error::NoProposalChosen { what: "IKE" });
    };
    for ty in [TransformType::ENCR, TransformType::PRF, TransformType::KE] {
        if p.transforms_of(ty).count() != 1 {
            return Err(Error::NoProposalChosen { what: "IKE" });
        }
    }
    if p.transforms_of(TransformType::INTEG).count() > 1 {
        return Err(Error::NoProposalChosen { what: "IKE" });
    }
    select_ike(ours, resp, None, spi_len).map(|(a, _)| a)
}

/// The outcome of ESP proposal selection.
pub(crate) struct EspChoice {
    pub(crate) algs: EspAlgs,
    /// The proposal to answer with (SPI left empty).
    pub(crate) proposal: Proposal,
    /// The peer's SPI from its proposal (our outbound SPI).
    pub(crate) peer_spi: u32,
}

/// Selects ESP transforms. `pfs` is false in IKE_AUTH, where KE transforms are ignored.
pub(crate) fn select_esp(
    ours: &[EspProposal],
    theirs: &[Proposal],
    ke_group: Option<u16>,
    pfs: bool,
) -> Result<EspChoice, Error> {
    for o in ours {
        for p in theirs {
            let Ok(spi) = <[u8; 4]>::try_from(p.spi.as_slice()) else {
                continue;
            };
            let peer_spi = u32::from_be_bytes(spi);
            if p.protocol != ProtocolId::ESP
                || peer_spi < 256
                || !only_known_types(
                    p,
                    &[
                        TransformType::ENCR,
                        TransformType::INTEG,
                        TransformType::KE,
                        TransformType::ESN,
                    ],
                )
            {
                continue;
            }
            let Some((encr, integ)) = pick_encr_integ(&o.encr, &o.integ, p) else {
                continue;
            };
            let their_esn: Vec<bool> = p
                .transforms_of(TransformType::ESN)
                .map(|t| t.id == EsnId::ESN.0)
                .collect();
            let their_esn = if their_esn.is_empty() {
                vec![false]
            } else {
                their_esn
            };
            let Some(esn) = o.esn.iter().copied().find(|e| their_esn.contains(e)) else {
                continue;
            };
            let dh = if pfs {
                // No configured group means NONE; a peer offering no KE transform offers NONE.
                let ours_ke: Vec<u16> = if o.dh.is_empty() {
                    vec![KeId::NONE.0]
                } else {
                    o.dh.iter().map(|d| d.id().0).collect()
                };
                let theirs_ke: Vec<u16> = {
                    let v: Vec<u16> = usable(p, TransformType::KE).map(|t| t.id).collect();
                    if v.is_empty() {
                        vec![KeId::NONE.0]
                    } else {
                        v
                    }
                };
                let common: Vec<u16> = ours_ke
                    .into_iter()
                    .filter(|k| theirs_ke.contains(k))
                    .collect();
                let Some(k) = common
                    .iter()
                    .find(|k| Some(**k) == ke_group)
                    .or(common.first())
                    .copied()
                else {
                    continue;
                };
                if k == KeId::NONE.0 {
                    None
                } else {
                    Some(DhGroup::from_id(KeId(k)).ok_or(Error::NoProposalChosen { what: "ESP" })?)
                }
            } else {
                None
            };
            let mut t = vec![encr_transform(encr)];
            if let Some(i) = integ {
                t.push(Transform::new(TransformType::INTEG, i.id().0));
            }
            if let Some(d) = dh {
                t.push(Transform::new(TransformType::KE, d.id().0));
            }
            t.push(Transform::new(
                TransformType::ESN,
                if esn { EsnId::ESN.0 } else { EsnId::NO_ESN.0 },
            ));
            return Ok(EspChoice {
                algs: EspAlgs {
                    encr,
                    integ,
                    esn,
                    dh,
                },
                proposal: response_proposal(p.number, ProtocolId::ESP, t),
                peer_spi,
            });
        }
    }
    Err(Error::NoProposalChosen { what: "ESP" })
}

/// Checks a responder's ESP answer against what we offered.
pub(crate) fn check_esp_response(
    ours: &[EspProposal],
    resp: &[Proposal],
    pfs: bool,
) -> Result<EspChoice, Error> {
    let [p] = resp else {
        return Err(Error::NoProposalChosen { what: "ESP" });
    };
    if p.transforms_of(TransformType::ENCR).count() != 1
        || p.transforms_of(TransformType::INTEG).count() > 1
        || p.transforms_of(TransformType::ESN).count() > 1
        || p.transforms_of(TransformType::KE).count() > 1
    {
        return Err(Error::NoProposalChosen { what: "ESP" });
    }
    // Without a KE transform the answer means NONE, which only matches a proposal without PFS.
    let ke = p.transforms_of(TransformType::KE).next().map(|t| t.id);
    select_esp(ours, resp, ke, pfs)
}
