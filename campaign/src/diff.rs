//! `fencelab diff RUN_A RUN_B`: reads two run folders (their results.json, through the typed
//! results model, and the fault schedule it holds) and prints what differs
//! (`results::diff`). A folder without a readable results.json is bad input.

use std::path::Path;

use results::diff::{FaultLine, Side};

use crate::CampaignError;

/// One run folder as a side of the comparison.
pub fn read_side(folder: &Path) -> Result<Side, CampaignError> {
    let results = runfolder::folder::RunFolder::at(folder)
        .results()?
        .ok_or_else(|| CampaignError::NotARunFolder(folder.to_path_buf()))?;
    let faults = serde_json::from_value::<Vec<workloads::faults::Fault>>(results.schedule.clone())
        .ok()
        .map(|faults| faults.iter().map(line).collect());
    Ok(Side { label: folder.display().to_string(), results, faults })
}

fn line(fault: &workloads::faults::Fault) -> FaultLine {
    FaultLine {
        at_ms: fault.at_ms,
        duration_ms: fault.duration_ms,
        kind: fault.kind.name().to_string(),
        runner: fault.runner.map(|runner| format!("r{}", runner + 1)),
        variant: serde_json::to_string(&fault.variant).unwrap_or_default(),
    }
}
