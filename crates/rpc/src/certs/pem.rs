//! PEM (RFC 7468) for the certificate and key files, with key material only ever in zeroized
//! buffers. Encoding is `pem-rfc7468`'s; decoding keeps this module's lenient framing (text
//! around blocks, several blocks per file, lines of any length, CRLF) and decodes each block's
//! base64 with `base64ct`, whose time does not depend on the characters decoded, so that reading
//! a private key leaks nothing of it through timing (a table lookup per character would).

use base64ct::{Base64, Base64Unpadded, Encoding};
use pem_rfc7468::LineEnding;
use zeroize::Zeroizing;

/// One PEM block: its label and decoded content.
pub(super) struct PemBlock {
    /// The label, e.g. `CERTIFICATE`.
    pub(super) label: String,
    /// The decoded content (DER).
    pub(super) der: Zeroizing<Vec<u8>>,
}

/// `-----BEGIN label-----`, base64 in lines of 64, `-----END label-----`, each line ending
/// in `\n`.
pub(super) fn pem_encode(label: &str, der: &[u8]) -> Zeroizing<String> {
    let len = pem_rfc7468::encoded_len(label, LineEnding::LF, der)
        .expect("labels are constants that RFC 7468 allows");
    let mut out = Zeroizing::new(vec![0u8; len]);
    let written = pem_rfc7468::encode(label, LineEnding::LF, der, &mut out)
        .expect("the buffer has the encoded length")
        .len();
    out.truncate(written);
    // The Vec moves into the String: the text exists once, in a zeroized buffer.
    Zeroizing::new(String::from_utf8(std::mem::take(&mut *out)).expect("PEM is ASCII"))
}

/// A block's base64 body, gathered across lines and checked as it comes (padding only at the
/// end, every character of the alphabet), then decoded whole.
struct Body {
    /// The base64 characters so far, line breaks removed.
    text: Zeroizing<Vec<u8>>,
    /// How many of them are padding (`=`).
    pad: usize,
}

impl Body {
    fn new(room: usize) -> Body {
        Body {
            text: Zeroizing::new(Vec::with_capacity(room)),
            pad: 0,
        }
    }

    fn push_line(&mut self, line: &str) -> Result<(), String> {
        for c in line.bytes() {
            // Where padding sits is not secret (it follows from the length).
            if c == b'=' {
                self.pad += 1;
                self.text.push(c);
                continue;
            }
            if self.pad > 0 {
                return Err("base64 data after padding".into());
            }
            if !is_base64(c) {
                return Err("invalid base64 character".into());
            }
            self.text.push(c);
        }
        Ok(())
    }

    /// The decoded bytes: the padding must complete the last group of four characters.
    fn finish(self) -> Result<Zeroizing<Vec<u8>>, String> {
        let data = self.text.len() - self.pad;
        // Data characters left in the last group: 0 (no padding), 3 (`=`) or 2 (`==`).
        let consistent = matches!((self.pad, data % 4), (0, 0) | (1, 3) | (2, 2));
        if !self.text.len().is_multiple_of(4) || !consistent {
            return Err("truncated base64".into());
        }
        let mut der = Zeroizing::new(vec![0u8; self.text.len() / 4 * 3]);
        let len = Base64::decode(&self.text, &mut der)
            .map_err(|_| "non-canonical base64 (bits set after the data)".to_owned())?
            .len();
        der.truncate(len);
        Ok(der)
    }
}

/// Whether `c` is in the base64 alphabet, in time independent of `c`: `base64ct` decodes it
/// with `A` (zero bits) after it, which fails only for a character outside the alphabet.
fn is_base64(c: u8) -> bool {
    Base64Unpadded::decode([c, b'A'], &mut [0u8; 1]).is_ok()
}

/// Every PEM block in `text`; text around blocks is ignored.
pub(super) fn pem_decode(text: &str) -> Result<Vec<PemBlock>, String> {
    let mut blocks = Vec::new();
    let mut current: Option<(String, Body)> = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        let lineno = n + 1;
        match current.take() {
            None => {
                if let Some(label) = line
                    .strip_prefix("-----BEGIN ")
                    .and_then(|l| l.strip_suffix("-----"))
                {
                    // Room for the whole rest of the text: never reallocates.
                    current = Some((label.to_owned(), Body::new(text.len())));
                }
            }
            Some((label, body)) if line.starts_with("-----END ") => {
                if line != format!("-----END {label}-----") {
                    return Err(format!(
                        "line {lineno}: {line} does not close BEGIN {label}"
                    ));
                }
                let der = body
                    .finish()
                    .map_err(|e| format!("line {lineno}: {label} block: {e}"))?;
                if der.is_empty() {
                    return Err(format!("line {lineno}: empty {label} block"));
                }
                blocks.push(PemBlock { label, der });
            }
            Some((label, mut body)) => {
                if line.contains(':') {
                    return Err(format!(
                        "line {lineno}: PEM headers (an encrypted key?) are not supported"
                    ));
                }
                body.push_line(line)
                    .map_err(|e| format!("line {lineno}: {e}"))?;
                current = Some((label, body));
            }
        }
    }
    if let Some((label, _)) = current {
        return Err(format!("BEGIN {label} without END"));
    }
    if blocks.is_empty() {
        return Err("no PEM block found".into());
    }
    Ok(blocks)
}
