//! Renderers of a run's results (results.json, report.html, junit.xml); pure.
