//! Integration tests of the renderers: one test binary, one module per output.

#[path = "../support/browser.rs"]
mod browser;
mod chromium;
mod fixture;
mod html;
mod json;
mod junit;
mod long_run;
mod plots;
mod scale;
