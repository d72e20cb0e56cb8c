//! `fencelab check` of a history too long to draw whole, from the outside: a real run's
//! folder checked with a small drawing bound gives the same verdicts, counts, timings and
//! anomaly stories as the same folder drawn whole; its report says what it is drawn from
//! and every event an anomaly cites is in it.

use std::path::Path;

use crate::run::caught;

fn results(folder: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(folder.join("results.json")).unwrap()).unwrap()
}

fn copy_history(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for name in ["history.jsonl", "config.json", "schedule.json", "run.json"] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sampled_check_says_what_the_whole_check_says_and_draws_every_anomaly() {
    let (finished, repeat) =
        caught(&["--time-limit", "8", "--bug", "accept-stale-result", "--nemesis", "reconnects"]).await;
    let work = tempfile::tempdir().unwrap();
    let (whole, sampled) = (work.path().join("whole"), work.path().join("sampled"));
    copy_history(&finished.folder(), &whole);
    copy_history(&finished.folder(), &sampled);
    let check = |folder: &Path, draw: Option<&str>| {
        let mut args = vec!["check".to_string(), folder.display().to_string()];
        if let Some(draw) = draw {
            args.extend(["--draw-events".to_string(), draw.to_string()]);
        }
        async move {
            let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
            super::fencelab_output(&args, std::time::Duration::from_secs(120)).await
        }
    };
    let (whole_code, whole_said) = check(&whole, None).await;
    let (sampled_code, sampled_said) = check(&sampled, Some("100")).await;
    assert_eq!((whole_code, sampled_code), (Some(1), Some(1)), "{repeat}\n{whole_said}\n{sampled_said}");
    let (whole_doc, sampled_doc) = (results(&whole), results(&sampled));
    for field in ["overall", "checkers", "anomaly_groups", "counts", "timings", "sources", "stories"] {
        assert_eq!(whole_doc[field], sampled_doc[field], "{field} differs when sampled ({repeat})");
    }
    assert!(whole_doc.get("drawn_from").is_none(), "a whole drawing says nothing of a sample");
    let drawn = &sampled_doc["drawn_from"];
    let events = whole_doc["counts"]["events"].as_u64().unwrap();
    assert_eq!(drawn["of"].as_u64(), Some(events), "{drawn}");
    assert!(drawn["events"].as_u64().unwrap() < events && drawn["jobs_one_in"].as_u64().unwrap() >= 2, "{drawn}");
    let html = std::fs::read_to_string(sampled.join("report.html")).unwrap();
    assert!(html.contains("id=\"drawn-from\""), "the report says it is drawn from a sample");
    assert!(!html.contains("proof missing"), "every event an anomaly cites is in the sampled report");
    let anomalies = whole_doc["anomaly_count"].as_u64().unwrap();
    assert!(anomalies > 0, "{repeat}");
}
