use super::*;
use std::net::{Ipv4Addr, Ipv6Addr};

const THEIRS: Mac = [2, 0, 0, 0, 0, 9];
const WIRE: Mac = [2, 0, 0, 0, 0, 7];

fn arp_reply(sender_ip: &str) -> Vec<u8> {
    ArpMessage {
        op: 2,
        sender_mac: THEIRS,
        sender_ip: sender_ip.parse().unwrap(),
        target_mac: [0; 6],
        target_ip: Ipv4Addr::UNSPECIFIED,
    }
    .encode()
    .to_vec()
}

/// An advertisement for `target` with a target link-layer option.
fn advertisement(target: &str) -> Vec<u8> {
    let target: Ipv6Addr = target.parse().unwrap();
    let mut na = vec![0u8; 72];
    na[0] = 0x60;
    na[6] = 58;
    na[8] = 0xfd;
    na[40] = 136;
    na[48..64].copy_from_slice(&target.octets());
    na[64] = 2;
    na[65] = 1;
    na[66..72].copy_from_slice(&THEIRS);
    na
}

#[test]
fn each_socket_judges_only_its_own_address_and_family() {
    let v4: IpAddr = "10.0.0.5".parse().unwrap();
    let v6: IpAddr = "fd00:59::5".parse().unwrap();
    let cases = [
        (
            "the v4 holder's reply, on v4's socket",
            v4,
            arp_reply("10.0.0.5"),
            Some(THEIRS),
        ),
        (
            "another address's reply, on v4's socket",
            v4,
            arp_reply("10.0.0.6"),
            None,
        ),
        (
            "the v6 holder's advertisement, on v4's socket",
            v4,
            advertisement("fd00:59::5"),
            None,
        ),
        (
            "the v6 holder's advertisement, on v6's socket",
            v6,
            advertisement("fd00:59::5"),
            Some(THEIRS),
        ),
        (
            "another address's advertisement, on v6's socket",
            v6,
            advertisement("fd00:59::6"),
            None,
        ),
        (
            "the v4 holder's reply, on v6's socket",
            v6,
            arp_reply("10.0.0.5"),
            None,
        ),
        (
            "a DAD probe for it from another host, on v6's socket",
            v6,
            dad_solicitation("fd00:59::5".parse().unwrap()).to_vec(),
            Some(WIRE),
        ),
        (
            "a truncated frame",
            v4,
            arp_reply("10.0.0.5")[..20].to_vec(),
            None,
        ),
    ];
    for (name, ip, frame, want) in cases {
        assert_eq!(judge(ip, &frame, WIRE), want, "{name}");
    }
}

#[test]
fn the_first_address_answered_for_is_named_in_the_order_given() {
    let v4: IpAddr = "10.0.0.5".parse().unwrap();
    let v6: IpAddr = "fd00:59::5".parse().unwrap();
    let m = |b: u8| Some([2, 0, 0, 0, 0, b]);
    type Case<'a> = (&'a [Option<Mac>], Option<(IpAddr, Mac)>);
    let cases: [Case; 5] = [
        (&[None, None], None),
        (&[m(1), None], Some((v4, [2, 0, 0, 0, 0, 1]))),
        (&[None, m(2)], Some((v6, [2, 0, 0, 0, 0, 2]))),
        (&[m(1), m(2)], Some((v4, [2, 0, 0, 0, 0, 1]))),
        (&[], None),
    ];
    for (heard, want) in cases {
        assert_eq!(first_conflict(&[v4, v6], heard), want, "{heard:?}");
    }
}

#[test]
fn when_listening_may_stop() {
    let m = Some([2, 0, 0, 0, 0, 1]);
    let cases: [(Until, &[Option<Mac>], bool); 7] = [
        (Until::FirstConflict, &[None, None], false),
        (Until::FirstConflict, &[None, m], true),
        (Until::FirstConflict, &[m, m], true),
        (Until::EveryAddress, &[None, m], false),
        (Until::EveryAddress, &[m, m], true),
        (Until::EveryAddress, &[], false),
        (Until::FirstConflict, &[], false),
    ];
    for (until, heard, want) in cases {
        assert_eq!(done(until, heard), want, "{until:?} {heard:?}");
    }
}

#[test]
fn the_sockets_listen_to_their_familys_ethertype() {
    assert_eq!(ethertype("10.0.0.5".parse().unwrap()), 0x0806);
    assert_eq!(ethertype("fd00::5".parse().unwrap()), 0x86dd);
}
