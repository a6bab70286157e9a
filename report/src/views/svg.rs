//! Small inline-SVG charts for report.html: axes with ticks, linear or log scales, points with error bars, bars,
//! and shaded bands. Each chart is a string of SVG markup with every value escaped; `<title>` children give hover
//! text without a script.

use std::fmt::Write as _;

pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A value axis mapped onto a pixel range.
#[derive(Clone, Copy)]
pub struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    pub px_lo: f64,
    pub px_hi: f64,
}

impl Scale {
    /// A scale that covers `values` (log when asked and every value is positive), padded a little.
    pub fn fit(values: &[f64], log: bool, px_lo: f64, px_hi: f64) -> Scale {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite() && (!log || *v > 0.0)).collect();
        let (mut lo, mut hi) =
            finite.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
        if finite.is_empty() {
            (lo, hi) = if log { (1e-4, 1.0) } else { (0.0, 1.0) };
        }
        if log {
            let (l, h) = (lo.log10().floor(), hi.log10().ceil());
            let h = if h <= l { l + 1.0 } else { h };
            Scale { lo: 10f64.powf(l), hi: 10f64.powf(h), log, px_lo, px_hi }
        } else {
            let span = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
            Scale {
                lo: (lo - 0.08 * span).min(if lo >= 0.0 { 0.0 } else { lo }),
                hi: hi + 0.08 * span,
                log,
                px_lo,
                px_hi,
            }
        }
    }

    pub fn px(&self, v: f64) -> f64 {
        let t = if self.log {
            (v.max(self.lo * 1e-3).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        self.px_lo + t * (self.px_hi - self.px_lo)
    }

    /// Tick values: each power of ten on a log scale, about five round steps on a linear one.
    pub fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (l, h) = (self.lo.log10().round() as i32, self.hi.log10().round() as i32);
            return (l..=h).map(|e| 10f64.powi(e)).collect();
        }
        let raw = (self.hi - self.lo) / 5.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(raw);
        let mut t = (self.lo / step).ceil() * step;
        let mut out = Vec::new();
        while t <= self.hi + step * 1e-9 {
            out.push(t);
            t += step;
        }
        out
    }
}

pub fn tick_label(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e5) {
        format!("{v:.0e}")
    } else {
        crate::gates::expr::fmt_num(v)
    }
}

/// A chart: an SVG of `w`×`h` with a plot area inside margins, and its axes.
pub struct Chart {
    pub svg: String,
    pub x: Scale,
    pub y: Scale,
}

pub const W: f64 = 640.0;
pub const H: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 44.0;

impl Chart {
    pub fn new(label: &str, xs: &[f64], xlog: bool, xlabel: &str, ys: &[f64], ylog: bool, ylabel: &str) -> Chart {
        let x = Scale::fit(xs, xlog, LEFT, W - RIGHT);
        let y = Scale::fit(ys, ylog, H - BOTTOM, TOP);
        Chart::with_scales(label, x, xlabel, y, ylabel, true)
    }

    /// A chart whose x axis is categories (no numeric ticks).
    pub fn categories(label: &str, n: usize, ys: &[f64], ylog: bool, ylabel: &str) -> Chart {
        let x = Scale { lo: -0.5, hi: n.max(1) as f64 - 0.5, log: false, px_lo: LEFT, px_hi: W - RIGHT };
        let y = Scale::fit(ys, ylog, H - BOTTOM, TOP);
        Chart::with_scales(label, x, "", y, ylabel, false)
    }

    pub fn x_band(&self) -> f64 {
        (self.x.px(1.0) - self.x.px(0.0)).abs()
    }

    fn with_scales(label: &str, x: Scale, xlabel: &str, y: Scale, ylabel: &str, xticks: bool) -> Chart {
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" role="img" aria-label="{}" class="chart">"#,
            esc(label)
        );
        let (x0, x1, y0, y1) = (LEFT, W - RIGHT, H - BOTTOM, TOP);
        let _ = write!(svg, r#"<rect x="{x0}" y="{y1}" width="{}" height="{}" class="plot"/>"#, x1 - x0, y0 - y1);
        for t in y.ticks() {
            let py = y.px(t);
            let _ = write!(
                svg,
                r#"<line x1="{x0}" x2="{x1}" y1="{py:.1}" y2="{py:.1}" class="grid"/><text x="{}" y="{:.1}" class="tick" text-anchor="end">{}</text>"#,
                x0 - 6.0,
                py + 4.0,
                esc(&tick_label(t))
            );
        }
        if xticks {
            for t in x.ticks() {
                let px = x.px(t);
                let _ = write!(
                    svg,
                    r#"<line x1="{px:.1}" x2="{px:.1}" y1="{y1}" y2="{y0}" class="grid"/><text x="{px:.1}" y="{}" class="tick" text-anchor="middle">{}</text>"#,
                    y0 + 16.0,
                    esc(&tick_label(t))
                );
            }
        }
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{}" class="axis" text-anchor="middle">{}</text><text transform="translate(14 {:.1}) rotate(-90)" class="axis" text-anchor="middle">{}</text>"#,
            (x0 + x1) / 2.0,
            H - 6.0,
            esc(xlabel),
            (y0 + y1) / 2.0,
            esc(ylabel)
        );
        Chart { svg, x, y }
    }

    /// A point at (x, y) with a vertical error bar of ±err and a label beside it.
    pub fn point(&mut self, x: f64, y: f64, err: f64, label: &str, title: &str, class: &str) {
        let (px, py) = (self.x.px(x), self.y.px(y));
        let (top, bot) = (self.y.px(y + err), self.y.px((y - err).max(self.y.lo)));
        // Labels near the right edge go to the point's left, so they stay inside the chart.
        let (lx, anchor) = if px > W * 0.8 { (px - 7.0, "end") } else { (px + 7.0, "start") };
        let _ = write!(
            self.svg,
            r#"<g class="{class}"><title>{}</title><line x1="{px:.1}" x2="{px:.1}" y1="{top:.1}" y2="{bot:.1}" class="err"/><line x1="{:.1}" x2="{:.1}" y1="{top:.1}" y2="{top:.1}" class="err"/><line x1="{:.1}" x2="{:.1}" y1="{bot:.1}" y2="{bot:.1}" class="err"/><circle cx="{px:.1}" cy="{py:.1}" r="4.5"/><text x="{lx:.1}" y="{:.1}" class="label" text-anchor="{anchor}">{}</text></g>"#,
            esc(title),
            px - 4.0,
            px + 4.0,
            px - 4.0,
            px + 4.0,
            py - 7.0,
            esc(label)
        );
    }

    /// A bar in category slot `i` (of width `frac` of the slot, offset `offset` slots) up to `v`.
    pub fn bar(&mut self, i: usize, offset: f64, frac: f64, v: f64, title: &str, class: &str) {
        let band = self.x_band();
        let cx = self.x.px(i as f64) + offset * band;
        let w = band * frac;
        let base = if self.y.log { self.y.lo } else { 0f64.max(self.y.lo) };
        let (y0, y1) = (self.y.px(base), self.y.px(v));
        let _ = write!(
            self.svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" class="{class}"><title>{}</title></rect>"#,
            cx - w / 2.0,
            y1.min(y0),
            (y0 - y1).abs(),
            esc(title)
        );
    }

    /// A horizontal band from `lo` to `hi` across category slot `i`.
    pub fn band(&mut self, i: usize, lo: f64, hi: f64, title: &str) {
        let band = self.x_band();
        let cx = self.x.px(i as f64);
        let (ya, yb) = (self.y.px(hi), self.y.px(lo));
        let _ = write!(
            self.svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" class="band"><title>{}</title></rect>"#,
            cx - band * 0.45,
            ya.min(yb),
            band * 0.9,
            (yb - ya).abs().max(1.5),
            esc(title)
        );
    }

    /// A short text centred in category slot `i` at value `v` (a bar that cannot be drawn, and why).
    pub fn note(&mut self, i: usize, v: f64, text: &str) {
        let _ = write!(
            self.svg,
            r#"<text x="{:.1}" y="{:.1}" class="label" text-anchor="middle">{}</text>"#,
            self.x.px(i as f64),
            self.y.px(v),
            esc(text)
        );
    }

    /// A category label under slot `i`.
    pub fn category(&mut self, i: usize, label: &str) {
        let _ = write!(
            self.svg,
            r#"<text x="{:.1}" y="{}" class="tick" text-anchor="middle">{}</text>"#,
            self.x.px(i as f64),
            H - BOTTOM + 16.0,
            esc(label)
        );
    }

    /// A polyline through `points` (x, y), with markers.
    pub fn line(&mut self, points: &[(f64, f64)], title: &str, class: &str) {
        let pts: Vec<String> =
            points.iter().map(|&(x, y)| format!("{:.1},{:.1}", self.x.px(x), self.y.px(y))).collect();
        let _ = write!(
            self.svg,
            r#"<g class="{class}"><title>{}</title><polyline points="{}"/>"#,
            esc(title),
            pts.join(" ")
        );
        for &(x, y) in points {
            let _ = write!(self.svg, r#"<circle cx="{:.1}" cy="{:.1}" r="2.5"/>"#, self.x.px(x), self.y.px(y));
        }
        self.svg.push_str("</g>");
    }

    /// A legend entry at row `row` of the top-left corner (rising series leave it free).
    pub fn legend(&mut self, row: usize, label: &str, class: &str) {
        let (x, y) = (LEFT + 10.0, TOP + 14.0 + 16.0 * row as f64);
        let _ = write!(
            self.svg,
            r#"<g class="{class}"><rect x="{x}" y="{}" width="10" height="10"/><text x="{}" y="{y}" class="label">{}</text></g>"#,
            y - 9.0,
            x + 16.0,
            esc(label)
        );
    }

    pub fn finish(mut self) -> String {
        self.svg.push_str("</svg>");
        self.svg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_scale_covers_decades_and_maps_ends() {
        let s = Scale::fit(&[0.0045, 0.42], true, 0.0, 100.0);
        assert_eq!((s.lo, s.hi), (0.001, 1.0));
        assert!((s.px(0.001) - 0.0).abs() < 1e-9 && (s.px(1.0) - 100.0).abs() < 1e-9);
        assert_eq!(s.ticks(), [0.001, 0.01, 0.1, 1.0]);
    }

    #[test]
    fn linear_ticks_are_round() {
        let s = Scale { lo: 0.0, hi: 100.0, log: false, px_lo: 0.0, px_hi: 1.0 };
        assert_eq!(s.ticks(), [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
