//! Line charts for `protego sim --plot`, drawn as SVG (text) and as PNG (a palette image drawn
//! here pixel by pixel, encoded by [`super::png`]): axes with ticks and a grid, a legend, and
//! series drawn as lines, steps or markers, solid or dashed.

use super::font;
use super::png::{encode, IndexedImage};

/// Image size in pixels (SVG user units).
const WIDTH: usize = 1000;
const HEIGHT: usize = 560;
/// The plot area's margins.
const LEFT: usize = 70;
const RIGHT: usize = 24;
const TOP: usize = 84;
const BOTTOM: usize = 52;

/// One axis: its range and its labelled ticks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Axis {
    /// The value at the low end.
    pub(crate) min: f64,
    /// The value at the high end (above `min`).
    pub(crate) max: f64,
    /// Ticks: value and label.
    pub(crate) ticks: Vec<(f64, String)>,
}

impl Axis {
    /// An axis from `min` to a round value at or above `max`, with about `count` ticks at
    /// round steps (1, 2 or 5 × a power of ten).
    pub(crate) fn nice(min: f64, max: f64, count: usize) -> Self {
        let span = if max > min { max - min } else { 1.0 };
        let raw = span / count.max(1) as f64;
        let power = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .map(|m| m * power)
            .find(|&s| s >= raw)
            .unwrap_or(10.0 * power);
        let lo = (min / step).floor() * step;
        let hi = (max / step).ceil() * step;
        let hi = if hi > lo { hi } else { lo + step };
        let decimals = if step >= 1.0 {
            0
        } else {
            (-step.log10().floor()) as usize
        };
        let n = ((hi - lo) / step).round() as usize;
        let ticks = (0..=n)
            .map(|k| {
                let v = lo + k as f64 * step;
                (v, format!("{v:.decimals$}"))
            })
            .collect();
        Self {
            min: lo,
            max: hi,
            ticks,
        }
    }
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// Straight lines between points.
    Line,
    /// Each value held until the next point (active capacity changes in steps).
    Step,
    /// Lines with a marker at every point.
    LineMarkers,
    /// A marker at every point, no line (values of separate things side by side).
    Markers,
}

impl Style {
    /// Whether points are joined by lines.
    fn lines(self) -> bool {
        self != Style::Markers
    }

    /// Whether each point gets a marker.
    fn markers(self) -> bool {
        matches!(self, Style::LineMarkers | Style::Markers)
    }
}

/// One series.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    /// Legend text.
    pub(crate) name: String,
    /// Colour.
    pub(crate) color: [u8; 3],
    /// Points, in x order.
    pub(crate) points: Vec<(f64, f64)>,
    /// How it is drawn.
    pub(crate) style: Style,
    /// Dashed instead of solid.
    pub(crate) dashed: bool,
    /// A label beside each point (empty: none).
    pub(crate) labels: Vec<String>,
}

impl Series {
    /// A series without point labels.
    pub(crate) fn new(
        name: impl Into<String>,
        color: [u8; 3],
        points: Vec<(f64, f64)>,
        style: Style,
        dashed: bool,
    ) -> Self {
        Self {
            name: name.into(),
            color,
            points,
            style,
            dashed,
            labels: Vec::new(),
        }
    }
}

/// A chart: title, axes and series.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chart {
    /// Title, above the plot.
    pub(crate) title: String,
    /// What the x axis shows.
    pub(crate) x_label: String,
    /// What the y axis shows.
    pub(crate) y_label: String,
    /// The x axis.
    pub(crate) x: Axis,
    /// The y axis.
    pub(crate) y: Axis,
    /// The series, drawn in order.
    pub(crate) series: Vec<Series>,
}

impl Chart {
    fn px(&self, x: f64) -> f64 {
        let span = (self.x.max - self.x.min).max(f64::MIN_POSITIVE);
        LEFT as f64 + (x - self.x.min) / span * (WIDTH - LEFT - RIGHT) as f64
    }

    fn py(&self, y: f64) -> f64 {
        let span = (self.y.max - self.y.min).max(f64::MIN_POSITIVE);
        (HEIGHT - BOTTOM) as f64 - (y - self.y.min) / span * (HEIGHT - TOP - BOTTOM) as f64
    }

    /// The pixel path of a series (steps expanded), clamped to the plot area.
    fn path(&self, series: &Series) -> Vec<(f64, f64)> {
        let clamp = |(x, y): (f64, f64)| {
            (
                x.clamp(LEFT as f64, (WIDTH - RIGHT) as f64),
                y.clamp(TOP as f64, (HEIGHT - BOTTOM) as f64),
            )
        };
        let mut path = Vec::with_capacity(series.points.len() * 2);
        for (k, &(x, y)) in series.points.iter().enumerate() {
            if series.style == Style::Step && k > 0 {
                let previous = series.points[k - 1].1;
                path.push(clamp((self.px(x), self.py(previous))));
            }
            path.push(clamp((self.px(x), self.py(y))));
        }
        path
    }

    /// The chart as an SVG document.
    pub(crate) fn svg(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
             viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n"
        ));
        s.push_str(&format!(
            "<rect width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"white\"/>\n"
        ));
        s.push_str(&format!(
            "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n",
            WIDTH / 2,
            escape(&self.title)
        ));
        let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM);
        for (v, label) in &self.x.ticks {
            let x = self.px(*v);
            s.push_str(&format!(
                "<line x1=\"{x:.1}\" y1=\"{y0}\" x2=\"{x:.1}\" y2=\"{y1}\" stroke=\"#e0e0e0\"/>\n\
                 <text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                y1 + 16,
                escape(label)
            ));
        }
        for (v, label) in &self.y.ticks {
            let y = self.py(*v);
            s.push_str(&format!(
                "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#e0e0e0\"/>\n\
                 <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                x0 - 6,
                y + 4.0,
                escape(label)
            ));
        }
        s.push_str(&format!(
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n",
            x1 - x0,
            y1 - y0
        ));
        s.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            (x0 + x1) / 2,
            HEIGHT - 12,
            escape(&self.x_label)
        ));
        s.push_str(&format!(
            "<text x=\"16\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {})\">{}</text>\n",
            (y0 + y1) / 2,
            (y0 + y1) / 2,
            escape(&self.y_label)
        ));
        for series in &self.series {
            let color = hex(series.color);
            let points: Vec<String> = self
                .path(series)
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            let dash = if series.dashed {
                " stroke-dasharray=\"8 5\""
            } else {
                ""
            };
            if series.style.lines() {
                s.push_str(&format!(
                    "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"/>\n",
                    points.join(" ")
                ));
            }
            if series.style.markers() {
                for (k, &(x, y)) in series.points.iter().enumerate() {
                    let (px, py) = (self.px(x), self.py(y));
                    s.push_str(&format!(
                        "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"4\" fill=\"{color}\"/>\n"
                    ));
                    if let Some(label) = series.labels.get(k) {
                        s.push_str(&format!(
                            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\">{}</text>\n",
                            px + 6.0,
                            py - 6.0,
                            escape(label)
                        ));
                    }
                }
            }
        }
        for (k, (x, y, series)) in self.legend().into_iter().enumerate() {
            let _ = k;
            let color = hex(series.color);
            let dash = if series.dashed {
                " stroke-dasharray=\"8 5\""
            } else {
                ""
            };
            s.push_str(&format!(
                "<line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>\n\
                 <text x=\"{}\" y=\"{}\">{}</text>\n",
                x + 24,
                x + 30,
                y + 4,
                escape(&series.name)
            ));
        }
        s.push_str("</svg>\n");
        s
    }

    /// Where each legend entry goes: two rows under the title.
    fn legend(&self) -> Vec<(usize, usize, &Series)> {
        let per_row = self.series.len().div_ceil(2).max(1);
        let width = (WIDTH - LEFT - RIGHT) / per_row;
        self.series
            .iter()
            .enumerate()
            .map(|(k, series)| {
                (
                    LEFT + (k % per_row) * width,
                    38 + (k / per_row) * 14,
                    series,
                )
            })
            .collect()
    }

    /// The chart as a PNG file.
    pub(crate) fn png(&self) -> Result<Vec<u8>, String> {
        let mut c = Canvas::new(WIDTH, HEIGHT);
        let black = c.color([0, 0, 0]);
        let grid = c.color([224, 224, 224]);
        c.text(&self.title, WIDTH / 2, 12, 2, black, Align::Center);
        let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM);
        for (v, label) in &self.x.ticks {
            let x = self.px(*v);
            c.line((x, y0 as f64), (x, y1 as f64), grid, 1, false);
            c.text(label, x.round() as usize, y1 + 8, 1, black, Align::Center);
        }
        for (v, label) in &self.y.ticks {
            let y = self.py(*v);
            c.line((x0 as f64, y), (x1 as f64, y), grid, 1, false);
            let top = (y.round() as usize).saturating_sub(3);
            c.text(label, x0 - 6, top, 1, black, Align::Right);
        }
        let corners = [
            (x0 as f64, y0 as f64),
            (x1 as f64, y0 as f64),
            (x1 as f64, y1 as f64),
            (x0 as f64, y1 as f64),
            (x0 as f64, y0 as f64),
        ];
        for w in corners.windows(2) {
            c.line(w[0], w[1], black, 1, false);
        }
        c.text(
            &self.x_label,
            (x0 + x1) / 2,
            HEIGHT - 20,
            1,
            black,
            Align::Center,
        );
        c.text(&self.y_label, 4, y0 - 14, 1, black, Align::Left);
        for series in &self.series {
            let color = c.color(series.color);
            let path = self.path(series);
            // Steps change every minute or so: thin lines keep them readable.
            let size = if series.style == Style::Step { 1 } else { 2 };
            let mut dash = 0usize;
            if series.style.lines() {
                for w in path.windows(2) {
                    dash = c.line_dashed(w[0], w[1], color, size, series.dashed, dash);
                }
            }
            if series.style.markers() {
                for (k, &(x, y)) in series.points.iter().enumerate() {
                    let (px, py) = (self.px(x), self.py(y));
                    c.disc(px, py, 4, color);
                    if let Some(label) = series.labels.get(k) {
                        let top = (py.round() as usize).saturating_sub(14);
                        c.text(label, px.round() as usize + 6, top, 1, color, Align::Left);
                    }
                }
            }
        }
        for (x, y, series) in self.legend() {
            let color = c.color(series.color);
            c.line_dashed(
                (x as f64, y as f64),
                ((x + 24) as f64, y as f64),
                color,
                2,
                series.dashed,
                0,
            );
            c.text(
                &series.name,
                x + 30,
                y.saturating_sub(3),
                1,
                black,
                Align::Left,
            );
        }
        encode(&c.into_image())
    }
}

fn hex([r, g, b]: [u8; 3]) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Horizontal text alignment around the given x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Center,
    Right,
}

/// A palette image being drawn.
struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
    palette: Vec<[u8; 3]>,
}

impl Canvas {
    /// A white canvas.
    fn new(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            pixels: vec![0; width * height],
            palette: vec![[255, 255, 255]],
        }
    }

    /// The palette index of a colour, added if new (the last entry is reused past 256).
    fn color(&mut self, rgb: [u8; 3]) -> u8 {
        if let Some(k) = self.palette.iter().position(|&c| c == rgb) {
            return k as u8;
        }
        if self.palette.len() < 256 {
            self.palette.push(rgb);
        }
        (self.palette.len() - 1) as u8
    }

    fn set(&mut self, x: i64, y: i64, color: u8) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            self.pixels[y as usize * self.width + x as usize] = color;
        }
    }

    /// A square dot of `size` pixels at (x, y).
    fn dot(&mut self, x: i64, y: i64, size: i64, color: u8) {
        for dy in 0..size {
            for dx in 0..size {
                self.set(x + dx, y + dy, color);
            }
        }
    }

    fn line(&mut self, a: (f64, f64), b: (f64, f64), color: u8, size: i64, dashed: bool) {
        self.line_dashed(a, b, color, size, dashed, 0);
    }

    /// A line by Bresenham's algorithm; a dashed line is 8 pixels on, 5 off, continuing the
    /// pattern from `phase`. Returns the phase at the end.
    fn line_dashed(
        &mut self,
        a: (f64, f64),
        b: (f64, f64),
        color: u8,
        size: i64,
        dashed: bool,
        mut phase: usize,
    ) -> usize {
        let (mut x, mut y) = (a.0.round() as i64, a.1.round() as i64);
        let (x1, y1) = (b.0.round() as i64, b.1.round() as i64);
        let dx = (x1 - x).abs();
        let dy = -(y1 - y).abs();
        let sx = if x < x1 { 1 } else { -1 };
        let sy = if y < y1 { 1 } else { -1 };
        let mut err = dx + dy;
        loop {
            if !dashed || phase % 13 < 8 {
                self.dot(x - size / 2, y - size / 2, size, color);
            }
            phase += 1;
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
        phase
    }

    /// A filled disc.
    fn disc(&mut self, cx: f64, cy: f64, r: i64, color: u8) {
        let (cx, cy) = (cx.round() as i64, cy.round() as i64);
        for dy in -r..=r {
            for dx in -r..=r {
                if dx * dx + dy * dy <= r * r {
                    self.set(cx + dx, cy + dy, color);
                }
            }
        }
    }

    /// Text in the 5×7 font at `scale`, its top at `top`.
    fn text(&mut self, text: &str, x: usize, top: usize, scale: usize, color: u8, align: Align) {
        let advance = (font::WIDTH + 1) * scale;
        let width = text.chars().count() * advance;
        let left = match align {
            Align::Left => x,
            Align::Center => x.saturating_sub(width / 2),
            Align::Right => x.saturating_sub(width),
        };
        for (k, c) in text.chars().enumerate() {
            let Some(rows) = font::glyph(c) else { continue };
            for (row, bits) in rows.iter().enumerate() {
                for (col, bit) in bits.chars().enumerate() {
                    if bit == '#' {
                        let px = (left + k * advance + col * scale) as i64;
                        let py = (top + row * scale) as i64;
                        self.dot(px, py, scale as i64, color);
                    }
                }
            }
        }
    }

    fn into_image(self) -> IndexedImage {
        IndexedImage {
            width: self.width,
            height: self.height,
            pixels: self.pixels,
            palette: self.palette,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart {
            title: "Test <chart>".into(),
            x_label: "hour".into(),
            y_label: "Gbit/s".into(),
            x: Axis::nice(0.0, 24.0, 12),
            y: Axis::nice(0.0, 93.0, 5),
            series: vec![
                Series {
                    name: "demand".into(),
                    color: [0, 0, 0],
                    points: vec![(0.0, 10.0), (12.0, 80.0), (24.0, 30.0)],
                    style: Style::Line,
                    dashed: false,
                    labels: Vec::new(),
                },
                Series {
                    name: "active".into(),
                    color: [200, 0, 0],
                    points: vec![(0.0, 20.0), (6.0, 50.0), (24.0, 150.0)],
                    style: Style::Step,
                    dashed: true,
                    labels: Vec::new(),
                },
                Series {
                    name: "points".into(),
                    color: [0, 0, 200],
                    points: vec![(3.0, 40.0), (9.0, 60.0)],
                    style: Style::LineMarkers,
                    dashed: false,
                    labels: vec!["3 min".into(), "9 min".into()],
                },
            ],
        }
    }

    #[test]
    fn nice_axes() {
        let a = Axis::nice(0.0, 93.0, 5);
        assert_eq!((a.min, a.max), (0.0, 100.0));
        assert_eq!(a.ticks.len(), 6);
        assert_eq!(a.ticks[1], (20.0, "20".to_string()));
        let a = Axis::nice(84.2, 88.9, 5);
        assert_eq!((a.min, a.max), (84.0, 89.0));
        let a = Axis::nice(0.0, 0.35, 4);
        assert_eq!(a.ticks[1].1, "0.1");
        let a = Axis::nice(5.0, 5.0, 4);
        assert!(a.max > a.min);
    }

    #[test]
    fn svg_has_every_series_escaped_text_and_stays_in_the_plot() {
        let svg = chart().svg();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("Test &lt;chart&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.contains("stroke-dasharray"));
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains(">9 min</text>"));
        // The step series goes off the top (150 > 100) and is clamped to the plot area.
        assert!(svg.contains(&format!(",{TOP}.0")));
    }

    #[test]
    fn png_draws_the_series() {
        let png = chart().png().unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let mut c = Canvas::new(20, 10);
        let red = c.color([255, 0, 0]);
        assert_eq!(c.color([255, 0, 0]), red);
        c.line((0.0, 5.0), (19.0, 5.0), red, 1, false);
        assert!(c.pixels[5 * 20..6 * 20].iter().all(|&p| p == red));
        let mut d = Canvas::new(30, 3);
        let blue = d.color([0, 0, 255]);
        d.line((0.0, 1.0), (29.0, 1.0), blue, 1, true);
        let lit = d.pixels[30..60].iter().filter(|&&p| p == blue).count();
        assert!(lit > 10 && lit < 30, "{lit}");
        let mut t = Canvas::new(40, 10);
        let black = t.color([0, 0, 0]);
        t.text("1", 0, 0, 1, black, Align::Left);
        // The glyph of 1 has 10 lit pixels.
        assert_eq!(t.pixels.iter().filter(|&&p| p == black).count(), 10);
    }
}
