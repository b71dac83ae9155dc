//! The demo's chart: upstream load over time, one line per stack.

use std::path::Path;

use plotters::prelude::*;

use crate::upstream::Schedule;

/// One line on the chart.
#[derive(Debug)]
pub struct Series<'a> {
    /// The legend label.
    pub label: &'a str,
    /// Requests per second at the upstream, one value per bucket.
    pub rates: &'a [f64],
    /// The line colour.
    pub color: RGBColor,
}

/// Writes an SVG chart of `series` (buckets `bucket_secs` wide) with the
/// schedule's phases marked, to `path`.
pub fn write_svg(
    path: &Path,
    schedule: &Schedule,
    bucket_secs: f64,
    series: &[Series<'_>],
) -> Result<(), tower::BoxError> {
    let total = schedule.total().as_secs_f64();
    let peak = series
        .iter()
        .flat_map(|s| s.rates.iter().copied())
        .fold(1.0f64, f64::max);
    let root = SVGBackend::new(path, (1000, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Requests reaching the upstream", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..total, 0.0..peak * 1.15)?;
    chart
        .configure_mesh()
        .x_desc("seconds since start")
        .y_desc("requests / s")
        .draw()?;

    let mut start = 0.0;
    for (phase, length) in schedule.phases() {
        let end = start + length.as_secs_f64();
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(start, 0.0), (start, peak * 1.15)],
            BLACK.mix(0.25),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            phase.name().to_string(),
            (start + 0.1, peak * 1.1),
            ("sans-serif", 13),
        )))?;
        start = end;
    }

    for line in series {
        let points = line
            .rates
            .iter()
            .enumerate()
            .map(|(i, rate)| (i as f64 * bucket_secs, *rate))
            .take_while(|(t, _)| *t <= total);
        let color = line.color;
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(line.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK.mix(0.4))
        .background_style(WHITE.mix(0.9))
        // Between the storm and the budgeted line, where the chart is empty.
        .position(SeriesLabelPosition::Coordinate(560, 150))
        .draw()?;
    root.present()?;
    Ok(())
}
