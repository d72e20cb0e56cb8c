//! The one table of exit codes every fencelab program answers with (Jepsen's), shared by
//! the `fencelab` command, the lab's `fencelab-lab` and the `exit_code` that
//! `results.json`, `conform.json` and a suite write: a verdict on a history and the process
//! that reached it cannot disagree.

/// What an exit code says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Exit {
    /// Valid: every checker passed (or the command did what it was asked).
    Valid,
    /// Invalid: anomalies were found (or an expectation, a replay, a suite row failed).
    Invalid,
    /// Unknown: the run was incomplete or its evidence could not be read or decided.
    Unknown,
    /// Bad arguments or input: nothing was started and nothing was changed.
    BadArguments,
    /// An internal error (a panic included).
    Internal,
}

impl Exit {
    /// Every exit, in the order of its code.
    pub const ALL: [Exit; 5] = [Exit::Valid, Exit::Invalid, Exit::Unknown, Exit::BadArguments, Exit::Internal];

    /// The process exit code: 0, 1, 2, 254, 255.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Valid => 0,
            Exit::Invalid => 1,
            Exit::Unknown => 2,
            Exit::BadArguments => 254,
            Exit::Internal => 255,
        }
    }

    /// The exit a code stands for, if it is one of the table's.
    pub fn from_code(code: i32) -> Option<Exit> {
        Exit::ALL.into_iter().find(|exit| i32::from(exit.code()) == code)
    }

    /// Valid when `passed`, else invalid: for commands whose answer is a yes or no.
    pub fn passed(passed: bool) -> Exit {
        if passed {
            Exit::Valid
        } else {
            Exit::Invalid
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Exit;

    #[test]
    fn every_code_reads_back_to_its_exit_and_nothing_else_does() {
        for exit in Exit::ALL {
            assert_eq!(Exit::from_code(i32::from(exit.code())), Some(exit));
        }
        assert_eq!(Exit::from_code(101), None, "Rust's panic code is not in the table");
        assert_eq!(Exit::ALL.map(Exit::code), [0, 1, 2, 254, 255]);
    }
}
