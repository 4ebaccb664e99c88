//! A small PNG encoder for the simulator's plots: 8-bit palette images (plots have a handful
//! of colours), compressed with DEFLATE fixed-Huffman blocks whose only matches are runs
//! (distance 1) and repeats of the row above (distance = the row's length). That is all a plot
//! of flat colours needs, and it keeps the command free of image and compression crates.
//!
//! References: the PNG specification (ISO/IEC 15948), RFC 1950 (zlib) and RFC 1951 (DEFLATE).

/// An image of palette indices, row by row.
#[derive(Debug, Clone)]
pub(crate) struct IndexedImage {
    /// Width in pixels (1 to 32 767).
    pub(crate) width: usize,
    /// Height in pixels (at least 1).
    pub(crate) height: usize,
    /// `width × height` palette indices, row by row.
    pub(crate) pixels: Vec<u8>,
    /// The palette, at most 256 RGB colours; every pixel's index must be in it.
    pub(crate) palette: Vec<[u8; 3]>,
}

/// Encodes `image` as a PNG file, or says why it cannot.
pub(crate) fn encode(image: &IndexedImage) -> Result<Vec<u8>, String> {
    let (w, h) = (image.width, image.height);
    if w == 0 || h == 0 || w > 32_767 || h > 32_767 {
        return Err(format!("PNG: image of {w}×{h} pixels is out of range"));
    }
    if image.pixels.len() != w * h {
        return Err(format!(
            "PNG: {} pixels for a {w}×{h} image",
            image.pixels.len()
        ));
    }
    if image.palette.is_empty() || image.palette.len() > 256 {
        return Err(format!(
            "PNG: palette of {} colours (1 to 256)",
            image.palette.len()
        ));
    }
    if let Some(&bad) = image
        .pixels
        .iter()
        .find(|&&p| usize::from(p) >= image.palette.len())
    {
        return Err(format!("PNG: pixel index {bad} is not in the palette"));
    }
    // Each row: filter type 0 (none), then the indices.
    let mut raw = Vec::with_capacity((w + 1) * h);
    for row in image.pixels.chunks(w) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut out = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 3, 0, 0, 0]); // depth 8, palette, deflate, filter 0, no interlace
    chunk(&mut out, b"IHDR", &ihdr);
    let plte: Vec<u8> = image.palette.iter().flatten().copied().collect();
    chunk(&mut out, b"PLTE", &plte);
    chunk(&mut out, b"IDAT", &zlib(&raw, w + 1));
    chunk(&mut out, b"IEND", &[]);
    Ok(out)
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// CRC-32 (ISO 3309, polynomial 0xEDB88320 reflected), as PNG chunks use it.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// Adler-32 (RFC 1950).
pub(crate) fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for block in data.chunks(5552) {
        for &byte in block {
            a += u32::from(byte);
            b += a;
        }
        a %= 65_521;
        b %= 65_521;
    }
    (b << 16) | a
}

/// LSB-first bit writer (DEFLATE's bit order).
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn put(&mut self, value: u32, count: u32) {
        self.acc |= u64::from(value) << self.n;
        self.n += count;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code, which DEFLATE stores most significant bit first.
    fn code(&mut self, code: u32, len: u32) {
        let reversed = code.reverse_bits() >> (32 - len);
        self.put(reversed, len);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// Base values and extra bits of the DEFLATE length codes 257..=285.
const LENGTHS: [(u16, u8); 29] = [
    (3, 0),
    (4, 0),
    (5, 0),
    (6, 0),
    (7, 0),
    (8, 0),
    (9, 0),
    (10, 0),
    (11, 1),
    (13, 1),
    (15, 1),
    (17, 1),
    (19, 2),
    (23, 2),
    (27, 2),
    (31, 2),
    (35, 3),
    (43, 3),
    (51, 3),
    (59, 3),
    (67, 4),
    (83, 4),
    (99, 4),
    (115, 4),
    (131, 5),
    (163, 5),
    (195, 5),
    (227, 5),
    (258, 0),
];

/// Base values and extra bits of the DEFLATE distance codes 0..=29.
const DISTANCES: [(u16, u8); 30] = [
    (1, 0),
    (2, 0),
    (3, 0),
    (4, 0),
    (5, 1),
    (7, 1),
    (9, 2),
    (13, 2),
    (17, 3),
    (25, 3),
    (33, 4),
    (49, 4),
    (65, 5),
    (97, 5),
    (129, 6),
    (193, 6),
    (257, 7),
    (385, 7),
    (513, 8),
    (769, 8),
    (1025, 9),
    (1537, 9),
    (2049, 10),
    (3073, 10),
    (4097, 11),
    (6145, 11),
    (8193, 12),
    (12289, 12),
    (16385, 13),
    (24577, 13),
];

/// The fixed-Huffman code of a literal/length symbol (RFC 1951, 3.2.6).
fn fixed_code(symbol: u16) -> (u32, u32) {
    let s = u32::from(symbol);
    match s {
        0..=143 => (0x30 + s, 8),
        144..=255 => (0x190 + s - 144, 9),
        256..=279 => (s - 256, 7),
        _ => (0xC0 + s - 280, 8),
    }
}

/// The last table entry whose base is at most `value`.
fn lookup(table: &[(u16, u8)], value: usize) -> (usize, u16, u8) {
    let mut k = 0;
    while k + 1 < table.len() && usize::from(table[k + 1].0) <= value {
        k += 1;
    }
    (k, table[k].0, table[k].1)
}

/// A zlib stream of `data` in one fixed-Huffman DEFLATE block, with matches at distance 1
/// and `stride` (when at most 32 768).
fn zlib(data: &[u8], stride: usize) -> Vec<u8> {
    let mut bits = Bits {
        out: vec![0x78, 0x01],
        acc: 0,
        n: 0,
    };
    bits.put(1, 1); // BFINAL
    bits.put(1, 2); // BTYPE = 01, fixed Huffman
    let mut i = 0;
    while i < data.len() {
        let mut best = (0usize, 0usize);
        for distance in [1, stride] {
            if distance == 0 || distance > 32_768 || distance > i {
                continue;
            }
            let mut len = 0;
            while len < 258 && i + len < data.len() && data[i + len] == data[i + len - distance] {
                len += 1;
            }
            if len > best.0 {
                best = (len, distance);
            }
        }
        let (len, distance) = best;
        if len >= 3 {
            let (k, base, extra) = lookup(&LENGTHS, len);
            let (code, n) = fixed_code(257 + k as u16);
            bits.code(code, n);
            bits.put((len - usize::from(base)) as u32, u32::from(extra));
            let (k, base, extra) = lookup(&DISTANCES, distance);
            bits.code(k as u32, 5);
            bits.put((distance - usize::from(base)) as u32, u32::from(extra));
            i += len;
        } else {
            let (code, n) = fixed_code(u16::from(data[i]));
            bits.code(code, n);
            i += 1;
        }
    }
    let (code, n) = fixed_code(256);
    bits.code(code, n);
    let mut out = bits.finish();
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal inflater for what `zlib` writes (fixed-Huffman blocks), to check round trips.
    fn inflate_fixed(stream: &[u8]) -> Vec<u8> {
        assert_eq!(&stream[..2], &[0x78, 0x01]);
        let body = &stream[2..stream.len() - 4];
        let mut pos = 0usize;
        let mut bit = |n: u32| -> u32 {
            let mut v = 0;
            for k in 0..n {
                let b = (body[pos / 8] >> (pos % 8)) & 1;
                v |= u32::from(b) << k;
                pos += 1;
            }
            v
        };
        let mut out: Vec<u8> = Vec::new();
        loop {
            let last = bit(1);
            assert_eq!(bit(2), 1, "fixed Huffman block");
            loop {
                // Read a fixed code MSB first: 7 bits, then up to 9.
                let mut code = 0u32;
                let mut len = 0;
                let symbol = loop {
                    code = (code << 1) | bit(1);
                    len += 1;
                    match len {
                        7 if code <= 0x17 => break code + 256,
                        8 if (0x30..=0xBF).contains(&code) => break code - 0x30,
                        8 if (0xC0..=0xC7).contains(&code) => break code - 0xC0 + 280,
                        9 if (0x190..=0x1FF).contains(&code) => break code - 0x190 + 144,
                        9 => panic!("bad code"),
                        _ => {}
                    }
                };
                if symbol < 256 {
                    out.push(symbol as u8);
                } else if symbol == 256 {
                    break;
                } else {
                    let (base, extra) = LENGTHS[(symbol - 257) as usize];
                    let len = usize::from(base) + bit(u32::from(extra)) as usize;
                    let mut d = 0u32;
                    for _ in 0..5 {
                        d = (d << 1) | bit(1);
                    }
                    let (base, extra) = DISTANCES[d as usize];
                    let distance = usize::from(base) + bit(u32::from(extra)) as usize;
                    for _ in 0..len {
                        out.push(out[out.len() - distance]);
                    }
                }
            }
            if last == 1 {
                break;
            }
        }
        let adler = u32::from_be_bytes(stream[stream.len() - 4..].try_into().unwrap());
        assert_eq!(adler, adler32(&out));
        out
    }

    #[test]
    fn checksums_match_known_values() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
        assert_eq!(adler32(&[]), 1);
    }

    #[test]
    fn deflate_round_trips() {
        let mut data: Vec<u8> = (0..=255u8).collect();
        data.extend(std::iter::repeat_n(7u8, 1000));
        data.extend((0..600).map(|i| (i % 13) as u8));
        data.extend_from_slice(b"ab");
        for stride in [1, 2, 13, 101, 40_000] {
            assert_eq!(inflate_fixed(&zlib(&data, stride)), data, "stride {stride}");
        }
        assert_eq!(inflate_fixed(&zlib(&[], 5)), Vec::<u8>::new());
    }

    #[test]
    fn png_structure_and_pixels() {
        let (w, h) = (37usize, 11usize);
        let pixels: Vec<u8> = (0..w * h)
            .map(|i| ((i % w) / 10 + (i / w) % 2) as u8)
            .collect();
        let image = IndexedImage {
            width: w,
            height: h,
            pixels: pixels.clone(),
            palette: vec![
                [255, 255, 255],
                [0, 0, 0],
                [200, 0, 0],
                [0, 0, 200],
                [9, 9, 9],
            ],
        };
        let png = encode(&image).unwrap();
        assert_eq!(&png[..8], &[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]);
        // Walk the chunks, checking every CRC, and collect IDAT.
        let mut pos = 8;
        let mut kinds = Vec::new();
        let mut idat = Vec::new();
        while pos < png.len() {
            let len = u32::from_be_bytes(png[pos..pos + 4].try_into().unwrap()) as usize;
            let kind = &png[pos + 4..pos + 8];
            let data = &png[pos + 8..pos + 8 + len];
            let crc = u32::from_be_bytes(png[pos + 8 + len..pos + 12 + len].try_into().unwrap());
            assert_eq!(crc, crc32(&png[pos + 4..pos + 8 + len]));
            if kind == b"IHDR" {
                assert_eq!(u32::from_be_bytes(data[..4].try_into().unwrap()), w as u32);
                assert_eq!(u32::from_be_bytes(data[4..8].try_into().unwrap()), h as u32);
                assert_eq!(&data[8..], &[8, 3, 0, 0, 0]);
            }
            if kind == b"PLTE" {
                assert_eq!(data.len(), 15);
            }
            if kind == b"IDAT" {
                idat.extend_from_slice(data);
            }
            kinds.push(String::from_utf8(kind.to_vec()).unwrap());
            pos += 12 + len;
        }
        assert_eq!(kinds, ["IHDR", "PLTE", "IDAT", "IEND"]);
        let raw = inflate_fixed(&idat);
        assert_eq!(raw.len(), (w + 1) * h);
        for (y, row) in raw.chunks(w + 1).enumerate() {
            assert_eq!(row[0], 0);
            assert_eq!(&row[1..], &pixels[y * w..(y + 1) * w]);
        }
    }

    #[test]
    fn bad_images_are_rejected() {
        let ok = IndexedImage {
            width: 2,
            height: 1,
            pixels: vec![0, 1],
            palette: vec![[0, 0, 0], [1, 1, 1]],
        };
        assert!(encode(&ok).is_ok());
        let bad = IndexedImage {
            pixels: vec![0, 2],
            ..ok.clone()
        };
        assert!(encode(&bad).unwrap_err().contains("index 2"));
        let bad = IndexedImage {
            width: 0,
            ..ok.clone()
        };
        assert!(encode(&bad).is_err());
        let bad = IndexedImage {
            pixels: vec![0],
            ..ok.clone()
        };
        assert!(encode(&bad).is_err());
        let bad = IndexedImage {
            palette: Vec::new(),
            ..ok
        };
        assert!(encode(&bad).is_err());
    }
}
