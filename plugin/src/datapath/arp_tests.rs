use super::*;

const OURS: Mac = [0x02, 0, 0, 0, 0, 1];
const THEIRS: Mac = [0x02, 0, 0, 0, 0, 2];

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn packets_round_trip() {
    let p = ArpMessage::probe(OURS, ip("10.0.0.5"));
    let bytes = p.encode();
    assert_eq!(&bytes[0..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
    assert_eq!(
        &bytes[14..18],
        &[0, 0, 0, 0],
        "a probe's sender IP is 0.0.0.0"
    );
    assert_eq!(ArpMessage::decode(&bytes), Some(p));
    let a = ArpMessage::announcement(OURS, ip("10.0.0.5"));
    assert_eq!(a.sender_ip, a.target_ip);
    assert_eq!(ArpMessage::decode(&[0u8; 27]), None);
    let mut not_ipv4 = bytes;
    not_ipv4[3] = 0xdd;
    assert_eq!(ArpMessage::decode(&not_ipv4), None);
}

#[test]
fn only_the_targets_reply_resolves_it() {
    let gw = ip("10.0.0.1");
    let reply = ArpMessage {
        op: ARP_REPLY,
        sender_mac: THEIRS,
        sender_ip: gw,
        target_mac: OURS,
        target_ip: ip("10.0.0.5"),
    };
    assert_eq!(answer_from(&reply, gw), Some(THEIRS));
    assert_eq!(answer_from(&reply, ip("10.0.0.2")), None);
    let request = ArpMessage {
        op: ARP_REQUEST,
        ..reply
    };
    assert_eq!(
        answer_from(&request, gw),
        None,
        "a request from the gateway is not an answer"
    );
}

#[test]
fn what_counts_as_a_conflict() {
    let x = ip("10.0.0.5");
    let msg = |op, smac, sip: &str, tip: &str| ArpMessage {
        op,
        sender_mac: smac,
        sender_ip: ip(sip),
        target_mac: [0; 6],
        target_ip: ip(tip),
    };
    let cases = [
        (
            "reply from the old holder",
            msg(ARP_REPLY, THEIRS, "10.0.0.5", "0.0.0.0"),
            true,
        ),
        (
            "its own announcement",
            msg(ARP_REQUEST, THEIRS, "10.0.0.5", "10.0.0.5"),
            true,
        ),
        (
            "its request for someone else",
            msg(ARP_REQUEST, THEIRS, "10.0.0.5", "10.0.0.1"),
            true,
        ),
        (
            "another host probing the same address",
            msg(ARP_REQUEST, THEIRS, "0.0.0.0", "10.0.0.5"),
            true,
        ),
        (
            "the old holder with our (sticky) MAC",
            msg(ARP_REPLY, OURS, "10.0.0.5", "0.0.0.0"),
            true,
        ),
        (
            "someone asking for it (not using it)",
            msg(ARP_REQUEST, THEIRS, "10.0.0.9", "10.0.0.5"),
            false,
        ),
        (
            "unrelated traffic",
            msg(ARP_REPLY, THEIRS, "10.0.0.7", "10.0.0.9"),
            false,
        ),
    ];
    for (name, m, conflict) in cases {
        assert_eq!(conflicting_mac(&m, x).is_some(), conflict, "{name}");
    }
}
