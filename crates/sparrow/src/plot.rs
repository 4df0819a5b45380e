//! SVG plots of a bench (`sparrow bench --plot FILE.svg`), drawn with plotters' SVG backend only: text
//! goes into the SVG as `<text>` elements (no font files are read; plotters estimates their size), so
//! the plot renders wherever SVG does. Layout: the per-token decode latency histogram of each mode,
//! and, when the bench compared modes or swept memory budgets, decode tok/s along them.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// One mode's decode step times.
pub struct Latencies {
    /// Legend name (`dense`, `sparse`, `offloaded`, or a budget).
    pub name: String,
    /// Seconds per decode step.
    pub seconds: Vec<f64>,
}

/// Decode speed along what the bench varied.
pub struct Curve {
    /// Panel title.
    pub title: String,
    /// The x axis's description.
    pub x_desc: String,
    /// `(label, x, tok/s)`, in order; each point is labelled on the plot.
    pub points: Vec<(String, f64, f64)>,
    /// The x values are only positions (modes side by side): no x scale is drawn.
    pub categorical: bool,
}

/// Series colours, one per mode.
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Bins of the latency histogram.
const BINS: usize = 30;

/// The SVG text of the bench's plots.
pub fn bench_svg(latencies: &[Latencies], curve: Option<&Curve>) -> Result<String> {
    let mut svg = String::new();
    let size = if curve.is_some() {
        (1200, 500)
    } else {
        (700, 500)
    };
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        match curve {
            Some(c) => {
                let (left, right) = root.split_horizontally(size.0 / 2);
                histogram(&left, latencies)?;
                speed_curve(&right, c)?;
            }
            None => histogram(&root, latencies)?,
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Writes `svg` to `path`, whole or not at all.
pub fn write(path: &Path, svg: &str) -> Result<()> {
    atomic_out::write_atomic(path, svg.as_bytes())
        .map_err(|e| anyhow!("writing the plot {}: {e}", path.display()))
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the plot: {e}")
}

/// Overlaid histograms of milliseconds per decode step, one semi-transparent series per mode.
fn histogram<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[Latencies],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let all = series
        .iter()
        .flat_map(|s| s.seconds.iter().map(|t| t * 1e3));
    let (lo, hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo, hi)
    } else if lo.is_finite() {
        (lo * 0.9, lo * 1.1 + 1e-3)
    } else {
        (0.0, 1.0)
    };
    let width = (hi - lo) / BINS as f64;
    let counts: Vec<Vec<u32>> = series
        .iter()
        .map(|s| {
            let mut c = vec![0u32; BINS];
            for t in &s.seconds {
                let b = (((t * 1e3 - lo) / width) as usize).min(BINS - 1);
                c[b] += 1;
            }
            c
        })
        .collect();
    let top = counts.iter().flatten().copied().max().unwrap_or(1).max(1);
    let mut chart = ChartBuilder::on(area)
        .caption("Per-token decode latency", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(lo..hi, 0u32..top + top / 10 + 1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("ms per token")
        .y_desc("decode steps")
        .draw()
        .map_err(err)?;
    for (i, (s, c)) in series.iter().zip(&counts).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(c.iter().enumerate().filter(|(_, &n)| n > 0).map(|(b, &n)| {
                let x0 = lo + b as f64 * width;
                Rectangle::new([(x0, 0), (x0 + width, n)], colour.mix(0.5).filled())
            }))
            .map_err(err)?
            .label(format!("{} ({} steps)", s.name, s.seconds.len()))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Decode tok/s along the curve's x, each point labelled.
fn speed_curve<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    c: &Curve,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let xs = c.points.iter().map(|p| p.1);
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let (x0, x1) = if c.categorical {
        (x0 - 0.5, x1 + 0.5)
    } else if x0.is_finite() && x1 > x0 {
        let pad = (x1 - x0) * 0.1;
        (x0 - pad, x1 + pad)
    } else if x0.is_finite() {
        (x0 - 1.0, x0 + 1.0)
    } else {
        (0.0, 1.0)
    };
    let top = c.points.iter().map(|p| p.2).fold(0.0, f64::max).max(1e-9);
    let mut chart = ChartBuilder::on(area)
        .caption(&c.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x0..x1, 0.0..top * 1.2)
        .map_err(err)?;
    let mut mesh = chart.configure_mesh();
    if c.categorical {
        mesh.x_labels(0).disable_x_mesh();
    }
    mesh.x_desc(c.x_desc.as_str())
        .y_desc("decode tok/s")
        .draw()
        .map_err(err)?;
    let colour = COLOURS[0];
    chart
        .draw_series(LineSeries::new(
            c.points.iter().map(|p| (p.1, p.2)),
            colour.stroke_width(2),
        ))
        .map_err(err)?
        .label("decode tok/s")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], colour));
    chart
        .draw_series(
            c.points
                .iter()
                .map(|p| Circle::new((p.1, p.2), 4, colour.filled())),
        )
        .map_err(err)?;
    chart
        .draw_series(c.points.iter().map(|p| {
            Text::new(
                format!("{} {:.1}", p.0, p.2),
                (p.1, p.2 + top * 0.04),
                ("sans-serif", 13),
            )
        }))
        .map_err(err)?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}
