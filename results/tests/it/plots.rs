//! The plots in report.html: present, with fault bands, offline, deterministic.

use crate::fixture;
use crate::html::{assert_offline, count_elements};
use results::report_html;

/// The `<svg id="ID">…</svg>` of a plot.
pub fn plot_svg<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html.find(&format!("<svg id=\"{id}\"")).unwrap_or_else(|| panic!("plot {id}"));
    let end = start + html[start..].find("</svg>").expect("svg closed") + "</svg>".len();
    &html[start..end]
}

pub const PLOTS: [&str; 3] = ["plot-latency", "plot-throughput", "plot-lease-margin"];

#[test]
fn report_has_every_plot_with_the_fault_window_as_a_band() {
    let events = fixture::history();
    let html = report_html(&fixture::run(&events), &events);
    for id in PLOTS {
        let svg = plot_svg(&html, id);
        // The fixture's one fault as it happened: it took effect at 1201 ms and was healed at
        // 4001 ms (scheduled 1200 to 4000) of 6000 ms, plot from x=70 over 1000 px.
        assert!(svg.contains("<rect class=\"band\" x=\"270.2\""), "{id} has the fault band:\n{svg}");
        assert!(svg.contains("delayed-heartbeats on r1: 1.201 s to 4.001 s"), "{id}");
        assert!(count_elements(svg) < 200, "{id}: {}", count_elements(svg));
    }
    let margin = plot_svg(&html, "plot-lease-margin");
    assert!(margin.contains("<path class=\"dots m-accepted\""));
    assert!(margin.contains("<path class=\"cross m-refused\""), "j1-a1's refused heartbeat is marked");
    assert!(html.contains("4 heartbeats (3 accepted, 1 refused)"), "caption counts the ledger's heartbeats");
    assert!(plot_svg(&html, "plot-latency").contains("claim: 1 requests (1 accepted)"));
    assert!(html.contains("id=\"plots-legend\""));
    assert_offline(&html);
}
