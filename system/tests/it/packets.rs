//! Packet rules on a real loopback port: a partition makes connections time out and its
//! removal makes them work again; a rule left by a harness that is gone is swept. They need
//! iptables as root: without it they say they skipped, and fail under
//! `FENCELAB_REQUIRE_ALL=1`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use system::packets::{self, Partition, Tag};

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when this host cannot install rules.
fn skipped() -> bool {
    let Some(why) = packets::unavailable() else { return false };
    eprintln!("SKIPPED: {why}");
    let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
    assert!(!require_all, "{why}, and FENCELAB_REQUIRE_ALL=1");
    true
}

/// Whether a connection to `addr` opens within `wait`; the error's kind when it does not.
fn connects(addr: SocketAddr, wait: Duration) -> Result<(), std::io::ErrorKind> {
    TcpStream::connect_timeout(&addr, wait).map(drop).map_err(|error| error.kind())
}

fn ours_on(port: u16) -> Vec<packets::Rule> {
    packets::listed().unwrap().into_iter().filter(|rule| rule.port == port).collect()
}

#[test]
fn a_partition_drops_a_loopback_ports_packets_until_it_is_removed() {
    if skipped() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    assert_eq!(connects(addr, Duration::from_secs(2)), Ok(()), "the port answers before");
    let partition = Partition::install(&[addr.port()]).unwrap();
    assert_eq!(ours_on(addr.port()).len(), 2, "a rule each way, listed as ours");
    assert!(ours_on(addr.port()).iter().all(|rule| rule.tag == Tag::own()));
    // The SYN is dropped, not refused: the connection times out.
    assert_eq!(connects(addr, Duration::from_millis(300)), Err(std::io::ErrorKind::TimedOut));
    partition.remove().unwrap();
    assert!(ours_on(addr.port()).is_empty(), "every rule removed");
    assert_eq!(connects(addr, Duration::from_secs(2)), Ok(()), "the port answers again");
}

#[test]
fn a_partition_dropped_without_removal_removes_its_rules() {
    if skipped() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let partition = Partition::install(&[port]).unwrap();
    assert_eq!(ours_on(port).len(), 2);
    drop(partition);
    assert!(ours_on(port).is_empty(), "dropped (a task aborted, a panic unwinding): removed");
}

#[test]
fn a_rule_left_by_a_harness_that_is_gone_is_swept_and_a_live_ones_kept() {
    if skipped() {
        return;
    }
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let gone = Tag { pid: child.id(), start_ticks: 1 };
    child.wait().unwrap();
    assert!(!gone.alive());
    let (left, live) = (TcpListener::bind("127.0.0.1:0").unwrap(), TcpListener::bind("127.0.0.1:0").unwrap());
    let (left_port, live_port) = (left.local_addr().unwrap().port(), live.local_addr().unwrap().port());
    Partition::install_tagged(&[left_port], gone).unwrap().forget();
    let kept = Partition::install(&[live_port]).unwrap();
    assert_eq!(ours_on(left_port).len(), 2, "left behind, as by a harness killed with SIGKILL");
    assert!(packets::sweep_dead() >= 2);
    assert!(ours_on(left_port).is_empty(), "the gone harness's rules are swept");
    assert_eq!(ours_on(live_port).len(), 2, "a live harness's rules are kept");
    kept.remove().unwrap();
}
