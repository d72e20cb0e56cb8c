//! Packet-level partitions on loopback: iptables rules that drop the TCP packets to and
//! from a port on `lo`, so that a runner's packets to its proxy are lost and TCP retransmits
//! (and in the end gives up) instead of the proxy holding bytes.
//!
//! Only loopback is ever touched: every rule matches `-i lo`, source and destination in
//! 127.0.0.0/8, protocol TCP and one port, in the `INPUT` chain (a packet on `lo` passes
//! `OUTPUT` then `INPUT`; dropped in `INPUT` it is lost silently, where a drop in `OUTPUT`
//! would fail the sender's call at once). Every rule carries the comment
//! `fencelab:<pid>:<start ticks>` naming the harness process that installed it, so that no
//! rule outlives it: a [`Partition`] removes its rules when it is removed or dropped,
//! [`remove_own`] removes every rule of this process (the end of a run, Ctrl-C, the panic
//! hook), and [`sweep_dead`] removes the rules of processes that are gone (a harness killed
//! with SIGKILL), as `container::sweep_dead` does for containers.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The chain every rule goes in.
pub const CHAIN: &str = "INPUT";
/// The addresses every rule is confined to (with the interface `lo`).
pub const LOOPBACK: &str = "127.0.0.0/8";
/// What every rule's comment starts with.
pub const TAG_PREFIX: &str = "fencelab:";
/// Longest wait for one iptables command (10 s; it waits at most 5 s for the xtables lock).
const COMMAND_MAX: Duration = Duration::from_secs(10);
/// Seconds iptables waits for the xtables lock (`-w`).
const LOCK_WAIT_S: &str = "5";

/// Whether this process installed a rule (only then does [`remove_own`] ask iptables).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The harness process a rule belongs to: its pid and its start time (clock ticks after
/// boot), so that a reused pid is told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub pid: u32,
    pub start_ticks: u64,
}

impl Tag {
    /// This process's tag.
    pub fn own() -> Tag {
        let pid = std::process::id();
        Tag { pid, start_ticks: crate::container::start_ticks(pid).unwrap_or(0) }
    }

    /// The rule comment: `fencelab:<pid>:<start ticks>`.
    pub fn comment(&self) -> String {
        format!("{TAG_PREFIX}{}:{}", self.pid, self.start_ticks)
    }

    /// Reads a comment written by [`Tag::comment`].
    pub fn parse(comment: &str) -> Option<Tag> {
        let (pid, start_ticks) = comment.strip_prefix(TAG_PREFIX)?.split_once(':')?;
        Some(Tag { pid: pid.parse().ok()?, start_ticks: start_ticks.parse().ok()? })
    }

    /// Whether its process still runs (the same pid, started at the same time).
    pub fn alive(&self) -> bool {
        crate::container::start_ticks(self.pid).is_some_and(|ticks| ticks == self.start_ticks)
    }
}

/// Which packets of a port a rule drops: those sent to it, or those sent from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// `--dport`: packets to the port (a client's to its server).
    ToPort,
    /// `--sport`: packets from the port (the server's answers).
    FromPort,
}

impl Direction {
    fn flag(self) -> &'static str {
        match self {
            Direction::ToPort => "--dport",
            Direction::FromPort => "--sport",
        }
    }
}

/// One DROP rule on loopback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub port: u16,
    pub direction: Direction,
    pub tag: Tag,
}

impl Rule {
    /// The rule's match and target, as `iptables -I/-D CHAIN` takes them.
    pub fn spec(&self) -> Vec<String> {
        let words = ["-i", "lo", "-s", LOOPBACK, "-d", LOOPBACK, "-p", "tcp", "-m", "tcp", self.direction.flag()];
        let mut spec: Vec<String> = words.iter().map(|word| word.to_string()).collect();
        spec.push(self.port.to_string());
        spec.extend(["-m", "comment", "--comment"].map(String::from));
        spec.push(self.tag.comment());
        spec.extend(["-j", "DROP"].map(String::from));
        spec
    }

    /// Reads a line of `iptables -S INPUT` that is one of ours: a DROP on `lo` of TCP
    /// between loopback addresses for one port, with a fencelab comment. Anything else is
    /// not ours (none).
    pub fn parse_listed(line: &str) -> Option<Rule> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |flag: &str| words.iter().position(|word| *word == flag).and_then(|at| words.get(at + 1)).copied();
        if words.first() != Some(&"-A") || after("-A") != Some(CHAIN) {
            return None;
        }
        let confined = after("-i") == Some("lo")
            && after("-s") == Some(LOOPBACK)
            && after("-d") == Some(LOOPBACK)
            && after("-p") == Some("tcp")
            && after("-j") == Some("DROP");
        let tag = Tag::parse(after("--comment")?.trim_matches('"'))?;
        let (direction, port) = match (after("--dport"), after("--sport")) {
            (Some(port), None) => (Direction::ToPort, port),
            (None, Some(port)) => (Direction::FromPort, port),
            _ => return None,
        };
        confined.then_some(Rule { port: port.parse().ok()?, direction, tag })
    }

    /// In words, for the history: `drop to 127.0.0.1:P on lo` or `drop from …`.
    pub fn describe(&self) -> String {
        let way = match self.direction {
            Direction::ToPort => "to",
            Direction::FromPort => "from",
        };
        format!("DROP tcp {way} port {} on lo ({})", self.port, self.tag.comment())
    }
}

/// Why an `iptables` command did not do what was asked; each names the command.
#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    #[error("{command}: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("{command}: no answer within {COMMAND_MAX:?}")]
    NoAnswer { command: String },
    #[error("{command}: {status} {stderr}")]
    Failed { command: String, status: std::process::ExitStatus, stderr: String },
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    NotRemoved(Vec<PacketError>),
}

/// Runs `iptables ARGS` (bounded: killed past [`COMMAND_MAX`]); its stdout, or why it failed.
fn iptables(args: &[String]) -> Result<String, PacketError> {
    let command = format!("iptables {}", args.join(" "));
    let spawn = |source| PacketError::Spawn { command: command.clone(), source };
    let mut child = Command::new("iptables")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    let deadline = Instant::now() + COMMAND_MAX;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PacketError::NoAnswer { command });
            }
            Err(error) => return Err(spawn(error)),
        }
    }
    let output = child.wait_with_output().map_err(spawn)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Err(PacketError::Failed { command, status: output.status, stderr })
}

/// `-w SECONDS` then `words`.
fn with_lock_wait(words: &[&str], spec: Vec<String>) -> Vec<String> {
    let mut args = vec!["-w".to_string(), LOCK_WAIT_S.to_string()];
    args.extend(words.iter().map(|word| word.to_string()));
    args.extend(spec);
    args
}

/// Why this host cannot install packet rules, if it cannot: not root, no `iptables`, or
/// iptables cannot list the `INPUT` chain (no netfilter, no CAP_NET_ADMIN).
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("dropping packets needs root (iptables on lo), and the harness is not root".to_string());
    }
    match iptables(&with_lock_wait(&["-S", CHAIN], vec![])) {
        Ok(_) => None,
        Err(PacketError::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Some("dropping packets needs `iptables`, which is not installed here".to_string())
        }
        Err(why) => Some(format!("dropping packets needs iptables, which fails here: {why}")),
    }
}

/// Every rule of ours in the chain now (any harness's).
pub fn listed() -> Result<Vec<Rule>, PacketError> {
    let text = iptables(&with_lock_wait(&["-S", CHAIN], vec![]))?;
    Ok(text.lines().filter_map(Rule::parse_listed).collect())
}

fn insert(rule: &Rule) -> Result<(), PacketError> {
    INSTALLED.store(true, Ordering::SeqCst);
    iptables(&with_lock_wait(&["-I", CHAIN], rule.spec())).map(drop)
}

fn delete(rule: &Rule) -> Result<(), PacketError> {
    iptables(&with_lock_wait(&["-D", CHAIN], rule.spec())).map(drop)
}

/// Installed rules that drop every packet to and from some loopback ports; removed when
/// [`Partition::remove`]d or dropped (a fault healed, a task aborted, a panic unwinding).
#[derive(Debug)]
pub struct Partition {
    rules: Vec<Rule>,
}

impl Partition {
    /// Drops the TCP packets to and from each of `ports` on loopback, under this process's
    /// tag. When one rule cannot be installed, those installed are removed and the error
    /// says why.
    pub fn install(ports: &[u16]) -> Result<Partition, PacketError> {
        Partition::install_tagged(ports, Tag::own())
    }

    /// [`Partition::install`] under `tag` (a test stands for a harness that is gone).
    pub fn install_tagged(ports: &[u16], tag: Tag) -> Result<Partition, PacketError> {
        let mut partition = Partition { rules: Vec::with_capacity(2 * ports.len()) };
        for &port in ports {
            for direction in [Direction::ToPort, Direction::FromPort] {
                let rule = Rule { port, direction, tag };
                insert(&rule)?;
                partition.rules.push(rule);
            }
        }
        Ok(partition)
    }

    /// The rules it holds.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Removes its rules; an error names those that could not be removed.
    pub fn remove(mut self) -> Result<(), PacketError> {
        self.remove_rules()
    }

    /// Leaves its rules installed (a test that stands for a harness killed with SIGKILL).
    pub fn forget(mut self) {
        self.rules.clear();
    }

    fn remove_rules(&mut self) -> Result<(), PacketError> {
        let errors: Vec<PacketError> = self.rules.drain(..).filter_map(|rule| delete(&rule).err()).collect();
        match errors.is_empty() {
            true => Ok(()),
            false => Err(PacketError::NotRemoved(errors)),
        }
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if let Err(why) = self.remove_rules() {
            eprintln!("fencelab: a packet rule could not be removed: {why}");
        }
    }
}

/// Removes every rule of this process (the end of a run, Ctrl-C, the panic hook): how many.
/// Nothing is asked of iptables when this process never installed one.
pub fn remove_own() -> usize {
    if !INSTALLED.load(Ordering::SeqCst) {
        return 0;
    }
    remove_where(|tag| *tag == Tag::own())
}

/// Removes the rules of harness processes that are gone (a harness killed with SIGKILL
/// cannot remove its own); says so on stderr and answers how many.
pub fn sweep_dead() -> usize {
    let removed = remove_where(|tag| !tag.alive());
    if removed > 0 {
        eprintln!("fencelab: removed {removed} packet rule(s) on lo left by runs whose harness is gone");
    }
    removed
}

/// Removes the rules of ours whose tag `matches`; how many. Nothing when none can be listed.
fn remove_where(matches: impl Fn(&Tag) -> bool) -> usize {
    let Ok(rules) = listed() else { return 0 };
    rules.iter().filter(|rule| matches(&rule.tag)).filter(|rule| delete(rule).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: Tag = Tag { pid: 4242, start_ticks: 987_654 };

    #[test]
    fn a_rule_drops_one_port_on_loopback_only_and_names_its_harness() {
        let rule = Rule { port: 40001, direction: Direction::ToPort, tag: TAG };
        assert_eq!(
            rule.spec().join(" "),
            "-i lo -s 127.0.0.0/8 -d 127.0.0.0/8 -p tcp -m tcp --dport 40001 -m comment --comment \
             fencelab:4242:987654 -j DROP"
        );
        let answers = Rule { direction: Direction::FromPort, ..rule };
        assert!(answers.spec().join(" ").contains("--sport 40001"), "{:?}", answers.spec());
    }

    #[test]
    fn a_listed_rule_reads_back_and_anything_else_is_not_ours() {
        // As iptables 1.8 (nf_tables and legacy) lists the rule `spec` inserts.
        let listed = "-A INPUT -s 127.0.0.0/8 -d 127.0.0.0/8 -i lo -p tcp -m tcp --sport 40001 \
                      -m comment --comment \"fencelab:4242:987654\" -j DROP";
        let rule = Rule::parse_listed(listed).unwrap();
        assert_eq!(rule, Rule { port: 40001, direction: Direction::FromPort, tag: TAG });
        let others = [
            "-P INPUT ACCEPT",
            &listed.replace("-i lo", "-i eth0"),
            &listed.replace("-d 127.0.0.0/8", "-d 10.0.0.0/8"),
            &listed.replace("fencelab:4242:987654", "someone-else"),
            &listed.replace("-j DROP", "-j ACCEPT"),
            &listed.replace("-A INPUT", "-A OUTPUT"),
        ];
        for other in others {
            assert_eq!(Rule::parse_listed(other), None, "{other}");
        }
    }

    #[test]
    fn a_tag_reads_back_and_tells_a_live_harness_from_a_gone_one() {
        assert_eq!(Tag::parse(&TAG.comment()), Some(TAG));
        assert_eq!(Tag::parse("fencelab:x:1"), None);
        assert!(Tag::own().alive(), "this process runs");
        let reused = Tag { start_ticks: Tag::own().start_ticks + 1, ..Tag::own() };
        assert!(!reused.alive(), "the same pid started at another time is another process");
    }
}
