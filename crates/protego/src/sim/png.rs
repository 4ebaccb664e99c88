//! PNG files for the simulator's plots: 8-bit palette images (plots have a handful of
//! colours), written by the `png` crate.

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
    let encoding = |e: png::EncodingError| format!("PNG: {e}");
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w as u32, h as u32);
    encoder.set_color(png::ColorType::Indexed);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_palette(image.palette.iter().flatten().copied().collect::<Vec<u8>>());
    let mut writer = encoder.write_header().map_err(encoding)?;
    writer.write_image_data(&image.pixels).map_err(encoding)?;
    writer.finish().map_err(encoding)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `png` with the `png` crate: its header and its rows of palette indices.
    fn decode(png: &[u8]) -> (png::Info<'static>, Vec<u8>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(png))
            .read_info()
            .unwrap();
        let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
        let frame = reader.next_frame(&mut pixels).unwrap();
        pixels.truncate(frame.buffer_size());
        (reader.info().clone(), pixels)
    }

    #[test]
    fn png_decodes_to_the_same_image() {
        let (w, h) = (37usize, 11usize);
        let pixels: Vec<u8> = (0..w * h)
            .map(|i| ((i % w) / 10 + (i / w) % 2) as u8)
            .collect();
        let palette = vec![
            [255, 255, 255],
            [0, 0, 0],
            [200, 0, 0],
            [0, 0, 200],
            [9, 9, 9],
        ];
        let image = IndexedImage {
            width: w,
            height: h,
            pixels: pixels.clone(),
            palette: palette.clone(),
        };
        let png = encode(&image).unwrap();
        assert_eq!(&png[..8], &[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]);
        let (info, decoded) = decode(&png);
        assert_eq!((info.width, info.height), (w as u32, h as u32));
        assert_eq!(info.color_type, png::ColorType::Indexed);
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        let flat: Vec<u8> = palette.iter().flatten().copied().collect();
        assert_eq!(info.palette.as_deref(), Some(&flat[..]));
        assert_eq!(decoded, pixels);
    }

    #[test]
    fn large_flat_images_compress_and_round_trip() {
        // A plot-sized image of flat colours with a few lines, as `sim --plot` draws them.
        let (w, h) = (1200usize, 800usize);
        let mut pixels = vec![0u8; w * h];
        for y in (0..h).step_by(50) {
            pixels[y * w..(y + 1) * w].fill(1);
        }
        for (x, y) in (0..w).map(|x| (x, (x * 7 / 11) % h)) {
            pixels[y * w + x] = 2;
        }
        let image = IndexedImage {
            width: w,
            height: h,
            pixels: pixels.clone(),
            palette: vec![[255, 255, 255], [200, 200, 200], [200, 0, 0]],
        };
        let png = encode(&image).unwrap();
        assert!(png.len() < w * h / 20, "{} bytes", png.len());
        let (info, decoded) = decode(&png);
        assert_eq!((info.width, info.height), (w as u32, h as u32));
        assert_eq!(decoded, pixels);
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
