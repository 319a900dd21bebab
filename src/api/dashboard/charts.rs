//! SVG charts drawn here, inline in the page: lines over time and bars. No
//! script and no font files: text is the browser's own, colours come from
//! the page's stylesheet by class, and every chart has a text title for
//! screen readers.

use maud::{Markup, html};

/// Drawing area, in the SVG's own units (it scales to the page's width).
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 180.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 26.0;

/// One line of a chart over time.
pub struct Series<'a> {
    /// What it shows, for the legend.
    pub name: &'a str,
    /// Its stylesheet class (`c1`…`c4`).
    pub class: &'a str,
    /// (time in unix ms, value), oldest first.
    pub points: Vec<(i64, i64)>,
}

/// The grid for values up to `max`: a "round" step (1, 2 or 5 times a
/// power of ten) and how many steps (at most five) reach `max`, so every
/// grid line has a readable label.
fn scale(max: i64) -> (i64, i64) {
    let mut power = 1i64;
    loop {
        for m in [1, 2, 5] {
            let step = power.saturating_mul(m);
            let lines = (max + step - 1) / step;
            if lines <= 5 {
                return (step, lines.max(1));
            }
        }
        power = power.saturating_mul(10);
    }
}

/// Horizontal grid lines with their labels, from 0 to `top`
/// (`lines` steps of `step`).
fn grid((step, lines): (i64, i64)) -> Markup {
    let plot_h = HEIGHT - TOP - BOTTOM;
    html! {
        @for i in 0..=lines {
            @let y = TOP + plot_h - plot_h * i as f64 / lines as f64;
            line.grid x1=(LEFT) x2=(WIDTH - RIGHT) y1=(y) y2=(y) {}
            text.axis x=(LEFT - 4.0) y=(y + 6.0) text-anchor="end" { (super::format::count(step * i)) }
        }
    }
}

/// A line chart of `series` between `from` and `to` (unix ms), with a
/// label under each multiple of `tick` made by `label`. A point more than
/// `gap` after the one before starts a new line, so that time the daemon
/// was down shows as a gap.
pub fn lines(
    title: &str,
    series: &[Series<'_>],
    (from, to): (i64, i64),
    (tick, label): (i64, fn(i64) -> String),
    gap: i64,
) -> Markup {
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0);
    let scale = scale(max.max(0));
    let top = scale.0 * scale.1;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let span = (to - from).max(1) as f64;
    let x = |t: i64| LEFT + plot_w * ((t - from) as f64 / span).clamp(0.0, 1.0);
    let y = |v: i64| TOP + plot_h - plot_h * (v as f64 / top as f64).clamp(0.0, 1.0);
    let first_tick = (from / tick + 1) * tick;
    let empty = series.iter().all(|s| s.points.is_empty());
    html! {
        figure {
            svg.chart viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(title) {
                title { (title) }
                (grid(scale))
                @for t in (first_tick..to).step_by(tick.max(1) as usize) {
                    text.axis x=(x(t)) y=(HEIGHT - 6.0) text-anchor="middle" { (label(t)) }
                }
                @for s in series {
                    @for run in runs(&s.points, gap) {
                        @if run.len() == 1 {
                            circle class=(s.class) cx=(x(run[0].0)) cy=(y(run[0].1)) r="2" {}
                        } @else {
                            polyline class=(s.class) fill="none" points=(
                                run.iter().map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
                                    .collect::<Vec<_>>().join(" ")
                            ) {}
                        }
                    }
                }
                @if empty {
                    text.axis x=(LEFT + plot_w / 2.0) y=(TOP + plot_h / 2.0) text-anchor="middle" {
                        "no history yet: a snapshot is taken every minute"
                    }
                }
            }
            figcaption {
                @for s in series {
                    span.legend { span class=(format!("swatch {}", s.class)) {} (s.name) }
                }
            }
        }
    }
}

/// Splits `points` where two neighbours are more than `gap` apart.
fn runs(points: &[(i64, i64)], gap: i64) -> Vec<&[(i64, i64)]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=points.len() {
        if i == points.len() || points[i].0 - points[i - 1].0 > gap {
            if start < i {
                out.push(&points[start..i]);
            }
            start = i;
        }
    }
    out
}

/// A bar chart: one bar per (label, value), in order, each with its value
/// in its tooltip.
pub fn bars(title: &str, class: &str, bars: &[(String, i64)], unit: &str) -> Markup {
    let max = bars.iter().map(|b| b.1).max().unwrap_or(0);
    let scale = scale(max.max(0));
    let top = scale.0 * scale.1;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let slot = plot_w / bars.len().max(1) as f64;
    let width = (slot * 0.8).clamp(1.0, 48.0);
    // Labels only where they fit.
    let label_every = ((bars.len() as f64 * 90.0 / plot_w).ceil() as usize).max(1);
    html! {
        figure {
            svg.chart viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(title) {
                title { (title) }
                (grid(scale))
                @for (i, (label, value)) in bars.iter().enumerate() {
                    @let h = plot_h * (*value as f64 / top as f64).clamp(0.0, 1.0);
                    @let x = LEFT + slot * i as f64 + (slot - width) / 2.0;
                    rect class=(class) x=(format!("{x:.1}")) y=(format!("{:.1}", TOP + plot_h - h))
                        width=(format!("{width:.1}")) height=(format!("{h:.1}")) {
                        title { (label) ": " (super::format::count(*value)) (unit) }
                    }
                    @if i % label_every == 0 {
                        text.axis x=(format!("{:.1}", x + width / 2.0)) y=(HEIGHT - 6.0)
                            text-anchor="middle" { (label) }
                    }
                }
                @if bars.is_empty() {
                    text.axis x=(LEFT + plot_w / 2.0) y=(TOP + plot_h / 2.0) text-anchor="middle" {
                        "nothing yet"
                    }
                }
            }
        }
    }
}

/// A share as a small horizontal bar, for table cells.
pub fn share(part: i64, whole: i64) -> Markup {
    let w = if whole > 0 {
        100.0 * (part as f64 / whole as f64).clamp(0.0, 1.0)
    } else {
        0.0
    };
    html! {
        svg.share viewBox="0 0 100 8" preserveAspectRatio="none" aria-hidden="true" {
            rect.track x="0" y="0" width="100" height="8" {}
            rect.c1 x="0" y="0" width=(format!("{w:.1}")) height="8" {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_lines_fall_on_round_numbers() {
        assert_eq!(scale(0), (1, 1));
        assert_eq!(scale(1), (1, 1));
        assert_eq!(scale(7), (2, 4));
        assert_eq!(scale(12), (5, 3));
        assert_eq!(scale(480), (100, 5));
        assert_eq!(scale(1_000), (200, 5));
    }

    #[test]
    fn a_gap_splits_a_line() {
        let points = [(0, 1), (60, 2), (120, 3), (1_000, 4), (1_060, 5)];
        let r = runs(&points, 120);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].len(), r[1].len()), (3, 2));
        assert!(runs(&[], 10).is_empty());
    }

    #[test]
    fn charts_are_svg_with_a_title() {
        let s = Series {
            name: "servable",
            class: "c1",
            points: vec![(0, 5), (60_000, 7)],
        };
        let svg = lines(
            "Servable",
            &[s],
            (0, 120_000),
            (60_000, |t| t.to_string()),
            120_000,
        )
        .into_string();
        assert!(svg.contains("<svg") && svg.contains("<title>Servable</title>"));
        assert!(svg.contains("<polyline"));
        let b = bars("Latency", "c2", &[("<100 ms".into(), 3)], " proxies").into_string();
        assert!(b.contains("&lt;100 ms: 3 proxies"));
    }
}
